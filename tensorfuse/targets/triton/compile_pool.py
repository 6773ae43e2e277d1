"""Compiling a batch of Triton kernels on all the CPUs, each handed on as soon as it is compiled.

Triton's JIT compiles a kernel at its first launch, in the launching process, one kernel after
another: a tuning job that measured 201 candidates on one H200 took 143 s, mostly compiling
(0.64 s a candidate, the GPU timing ~0.1 s of it). :func:`compiled_as_ready` runs each
candidate's ``warm`` (the JIT's ``warmup``: compile without launching) under Triton's own
``AsyncCompileMode``, which hands each compile to :class:`CompilePool`; the pool sends the JIT's
compile arguments to an idle helper process (:mod:`.compile_worker`, Triton alone imported),
the helper fills Triton's on-disk cache, and the JIT's own compile here is then a cache hit
(milliseconds). Candidates come back in the order their compiles finish, so the GPU measures the
first while the helpers compile the rest (the workers of this machine find them in the same
cache). A compile the helpers cannot take — a JIT whose internals differ from Triton 3.6's, a
helper that died, an error — runs here as it would have, so what is compiled never depends on
the pool; only when it is compiled does.
"""
from __future__ import annotations

import concurrent.futures
import contextvars
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from typing import Callable, Iterable, Iterator

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_worker.py")


def helpers_for_this_machine() -> int:
    """One helper per CPU but one (the launching process keeps one), at most 16."""
    return max(1, min(16, (os.cpu_count() or 2) - 1))


class CompilePool:
    """Helper processes compiling Triton kernels into the on-disk cache; an executor for
    ``triton.AsyncCompileMode`` (only ``submit`` is used). Started at the first compile,
    stopped by :meth:`close`."""

    def __init__(self, processes: int | None = None):
        self.size = processes or helpers_for_this_machine()
        self.idle: queue.Queue = queue.Queue()
        self.helpers: list[subprocess.Popen] = []
        self.threads: concurrent.futures.ThreadPoolExecutor | None = None
        self.lock = threading.Lock()
        self.sent = 0          # compiles the helpers did
        self.here = 0          # compiles that ran in this process instead
        self.builds: concurrent.futures.ThreadPoolExecutor | None = None   # see build()

    def _start(self) -> None:
        with self.lock:
            if self.threads is not None:
                return
            for _ in range(self.size):
                self.idle.put(self._spawn())
            self.threads = concurrent.futures.ThreadPoolExecutor(self.size)

    def _spawn(self) -> subprocess.Popen:
        """A helper (the environment, TRITON_CACHE_DIR with it, is inherited)."""
        helper = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.helpers.append(helper)
        return helper

    def submit(self, compile_fn) -> concurrent.futures.Future:
        """The compiled kernel of ``compile_fn`` (the JIT's closure), compiled by a helper and
        then loaded here from the cache; compiled here where the request cannot be made."""
        request = jit_request(compile_fn)
        if request is None:
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._compile_here(future, compile_fn)
            return future
        self._start()
        return self.threads.submit(self._through_helper, request, compile_fn)

    def _through_helper(self, request: dict, compile_fn):
        helper = self.idle.get()
        reply = "no reply"
        try:
            data = pickle.dumps(request)
            helper.stdin.write(struct.pack("<I", len(data)) + data)
            helper.stdin.flush()
            head = helper.stdout.read(4)
            if len(head) == 4:
                reply = pickle.loads(helper.stdout.read(struct.unpack("<I", head)[0]))
        except (OSError, pickle.PickleError, EOFError) as exc:
            reply = f"the helper failed: {exc}"
        with self.lock:
            if helper.poll() is not None:   # it died: another takes its place
                self.helpers.remove(helper)
                helper = self._spawn()
            self.idle.put(helper)
            if reply is None:
                self.sent += 1
            else:
                self.here += 1
        return compile_fn()   # a cache hit when the helper compiled it; else the compile itself

    def _compile_here(self, future, compile_fn) -> None:
        with self.lock:
            self.here += 1
        try:
            future.set_result(compile_fn())
        except Exception as exc:  # noqa: BLE001 - the JIT's own error, for the caller
            future.set_exception(exc)

    def build(self, fn: Callable) -> concurrent.futures.Future:
        """Run ``fn`` — a build that is not Triton's (``nvcc`` for a CUDA C++ template, which
        waits on its own process) — on one of the pool's threads; inside
        :func:`compiled_as_ready`'s ``warm``, the item also waits for it."""
        with self.lock:
            if self.builds is None:
                self.builds = concurrent.futures.ThreadPoolExecutor(self.size)
        future = self.builds.submit(fn)
        asked = _BUILDS_ASKED.get()
        if asked is not None:
            asked.append(_Build(future))
        return future

    def close(self) -> None:
        if self.builds is not None:
            self.builds.shutdown(wait=True)
            self.builds = None
        for helper in self.helpers:
            try:
                helper.stdin.close()
                helper.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                helper.kill()
        if self.threads is not None:
            self.threads.shutdown(wait=True)
        self.helpers, self.threads = [], None
        self.idle = queue.Queue()


def jit_request(compile_fn) -> dict | None:
    """What a helper needs to compile what ``compile_fn`` (the closure Triton 3.6's JIT hands an
    ``AsyncCompileMode`` executor) compiles: the kernel's source file, module and name, and the
    JIT's signature, constexprs, attributes, target and options. None where the closure is not
    the one expected or the kernel has no source file."""
    code, cells = getattr(compile_fn, "__code__", None), getattr(compile_fn, "__closure__", None)
    if code is None or cells is None:
        return None
    found = dict(zip(code.co_freevars, (cell.cell_contents for cell in cells)))
    src, target, options = found.get("src"), found.get("target"), found.get("options")
    jit = getattr(src, "fn", None)
    fn = getattr(jit, "fn", None)
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if target is None or options is None or fn is None or not path:
        return None
    return dict(path=path, module=fn.__module__, name=fn.__name__, signature=src.signature,
                constexprs=src.constants, attrs=src.attrs, target=target,
                options=dict(options.__dict__))


def compiled_as_ready(pool: CompilePool, items: Iterable, warm: Callable) -> Iterator:
    """``(item, warm(item))`` for each of ``items``, in the order their compiles finish: every
    ``warm`` runs first (its JIT compiles go to ``pool``; it returns at once), then each item
    comes back once the kernels its ``warm`` asked for are compiled and in the JIT's cache. A
    compile that failed is left out of the cache, to fail again, with its error, at the
    kernel's first launch; a ``warm`` that raises gives ``(item, None)``."""
    import triton
    from triton.runtime import _async_compile

    mode = triton.AsyncCompileMode(pool, ignore_errors=True)
    asked: list = []            # the JIT's compiles, in the order the warms asked for them
    submit = mode.submit

    def recorded(key, compile_fn, finalize_fn):
        kernel = submit(key, compile_fn, finalize_fn)
        asked.append(kernel)
        return kernel

    mode.submit = recorded
    waiting = []                # (item, what its warm made, the compiles it waits for)
    token = _async_compile.active_mode.set(mode)
    # pool.build()s of the warms, waited for as the JIT's are; per thread (a job feeds several
    # kernels' batches from their own threads through one pool)
    builds_token = _BUILDS_ASKED.set(asked)
    try:
        for item in items:
            first = len(asked)
            try:
                made = warm(item)
            except Exception:  # noqa: BLE001 - measured, and reported, as without this
                made = None
            waiting.append((item, made, asked[first:]))
    finally:
        _async_compile.active_mode.reset(token)
        _BUILDS_ASKED.reset(builds_token)
    while waiting:
        ready = [w for w in waiting if all(_compiled(k) for k in w[2])]
        if not ready:
            concurrent.futures.wait([k.future for w in waiting for k in w[2] if not _compiled(k)],
                                    return_when=concurrent.futures.FIRST_COMPLETED)
            continue
        for entry in ready:
            waiting.remove(entry)
            for kernel in entry[2]:
                kernel.result(ignore_errors=True)   # into the JIT's cache (a failure: left out)
            yield entry[0], entry[1]


_BUILDS_ASKED: contextvars.ContextVar = contextvars.ContextVar("tensorfuse_builds_asked",
                                                               default=None)


class _Build:
    """A :meth:`CompilePool.build` as :func:`compiled_as_ready` waits for the JIT's compiles."""

    def __init__(self, future: concurrent.futures.Future):
        self.future = future

    def result(self, ignore_errors: bool = False):
        try:
            return self.future.result()
        except Exception:  # noqa: BLE001 - a failed build fails again where it is measured
            if not ignore_errors:
                raise
            return None


def _compiled(kernel) -> bool:
    """Whether one of the JIT's asynchronous compiles has finished (Triton's FutureKernel)."""
    future = getattr(kernel, "future", None)
    return future is None or future.done()
