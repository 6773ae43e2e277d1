"""Lines of a generated Triton kernel, indented as written, and the loops that sweep an axis."""
from __future__ import annotations


class SourceWriter:
    """Collects a kernel body's lines at the current indent (``with writer.block():`` indents
    what is written inside)."""

    def __init__(self, interpreter: bool = False):
        self.lines: list[str] = []
        self.indent = 1
        self.interpreter = interpreter

    def __call__(self, text: str = "") -> None:
        self.lines.append("    " * self.indent + text if text else "")

    def block(self):
        writer = self

        class _Indent:
            def __enter__(self):
                writer.indent += 1

            def __exit__(self, *exc):
                writer.indent -= 1

        return _Indent()

    def sweep(self, var: str, start: str, stop: str, step: str, stages: int = 1) -> None:
        """``for var in range(start, stop, step):``; with ``stages`` > 1, Triton's ``tl.range``
        asks its software pipeliner to run the loop's loads that many blocks ahead (copied
        asynchronously into shared memory). A loop without tensor-core products is pipelined only
        when asked so: the ``num_stages`` compile option alone leaves its loads synchronous."""
        if self.interpreter:
            start, stop = host_int(start), host_int(stop)
        if stages > 1:
            self(f"for {var} in tl.range({start}, {stop}, {step}, num_stages={stages}):")
        else:
            self(f"for {var} in range({start}, {stop}, {step}):")


# Triton's interpreter holds a kernel's integer arguments as one-element arrays, which NumPy 2
# no longer turns into a Python int for a ``range`` bound: its kernels read such a bound through
# this (a kernel written with sizes as arguments loops up to one)
INTERPRETER_HELPERS = '''
def _host_int(x):
    return int(x.handle.data.reshape(-1)[0]) if hasattr(x, "handle") else int(x)
'''


def host_int(bound: str) -> str:
    """A loop bound of an interpreted kernel: itself where it is a literal, else read through
    ``_host_int`` (:data:`INTERPRETER_HELPERS`)."""
    return bound if bound.lstrip("-").isdigit() else f"_host_int({bound})"
