"""Lines of a generated Triton kernel, indented as written, and the loops that sweep an axis."""
from __future__ import annotations


class SourceWriter:
    """Collects a kernel body's lines at the current indent (``with writer.block():`` indents
    what is written inside)."""

    def __init__(self):
        self.lines: list[str] = []
        self.indent = 1

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
        if stages > 1:
            self(f"for {var} in tl.range({start}, {stop}, {step}, num_stages={stages}):")
        else:
            self(f"for {var} in range({start}, {stop}, {step}):")
