"""A process that compiles Triton kernels into Triton's on-disk cache, for :mod:`.compile_pool`.

Run as a script (``python compile_worker.py``), not imported through the package: it needs
Triton only, so it starts in a fraction of a second where importing tensorfuse (and TVM) would
take seconds. Requests come on stdin and replies go to the original stdout, each a pickle with a
4-byte length in front; anything else the compiler prints goes to stderr. A request names the
generated source file, its module and kernel, and the JIT's own compile arguments (signature,
constexprs, attributes, target, options) — exactly what the JIT of the measuring process would
compile, so that its compile becomes a cache hit. The reply is ``None`` or the error's text.
"""
from __future__ import annotations

import importlib.util
import os
import pickle
import struct
import sys


def _read(stream):
    head = stream.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack("<I", head)
    return pickle.loads(stream.read(size))


def _write(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _kernel(path: str, module_name: str, name: str):
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return getattr(module, name)


def compile_request(request: dict) -> None:
    """Compile one request (raises what Triton raises)."""
    import triton
    from triton.compiler import ASTSource

    fn = _kernel(request["path"], request["module"], request["name"])
    src = ASTSource(fn, request["signature"], request["constexprs"], request["attrs"])
    triton.compile(src, target=request["target"], options=request["options"])


def main() -> None:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)   # what the compiler prints must not reach the replies
    requests = sys.stdin.buffer
    while True:
        request = _read(requests)
        if request is None:
            return
        try:
            compile_request(request)
            _write(replies, None)
        except Exception as exc:  # noqa: BLE001 - reported to the pool, which compiles in-process
            _write(replies, f"{type(exc).__name__}: {exc}"[:2000])


if __name__ == "__main__":
    main()
