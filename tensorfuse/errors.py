"""Every error tensorfuse raises, in one place.

Each error carries the user's source location (``file:line``) when one is known, and puts it first in
its message, so a mistake in a kernel points at the line that made it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLocation:
    """A place in the user's code: file, line and the text of that line."""

    filename: str
    lineno: int
    code: str = ""

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


class TensorfuseError(Exception):
    """Base class of all tensorfuse errors."""

    def __init__(self, message: str, location: SourceLocation | None = None):
        self.message = message
        self.location = location
        text = f"{location}: {message}" if location is not None else message
        if location is not None and location.code:
            text += f"\n    {location.code.strip()}"
        super().__init__(text)


class DSLError(TensorfuseError):
    """A kernel is not a valid tensorfuse program (found while tracing it)."""


class ShapeError(DSLError):
    """Sizes do not agree: an axis indexes dimensions of different sizes, or a tensor gets the wrong
    number of indices."""


class AxisError(DSLError):
    """An axis is unknown, reused, missing from a reduction's operand, or has no size."""


class DTypeError(DSLError):
    """Operand types do not fit the operation (a float used as an index, a non-boolean condition)."""


class UnsupportedConstructError(DSLError):
    """Python the tracer cannot turn into a program, such as an ``if`` on a tensor value."""


class RollingUpdateError(TensorfuseError):
    """A chain of reductions cannot be fused: no correction exists, or the request is malformed."""


class ScheduleError(TensorfuseError):
    """A schedule step is illegal in the current state of the schedule."""


class TargetError(TensorfuseError):
    """A target is unknown, or the device it needs is not present."""


class CallError(TensorfuseError):
    """A compiled kernel was called with wrong arguments (count, type, shape, dtype or device)."""


class TuningError(TensorfuseError):
    """A tuning job cannot run or its database cannot be used."""


class NoTemplateWarning(UserWarning):
    """``tf.compile`` found no template for a kernel on a GPU: it runs on TVM's default schedule
    (``schedule_origin()`` says why no template took it)."""


class CopiedArgumentWarning(UserWarning):
    """A tensor argument is copied before a kernel's launch: a view the kernel cannot read where
    it lies (a strided innermost dimension, a start off a 16-byte boundary, strides TMA cannot
    take). Said once per kernel, argument and layout."""


class RollingUpdateWarning(UserWarning):
    """A fusion is exact but may lose precision (a correction can grow values that were rounded
    away earlier, e.g. exp(old − new) > 1 when a dependency decreases)."""


class FusedPrecisionWarning(RollingUpdateWarning):
    """A fused chain loses much more precision than the unfused program (measured in float32 on
    data far from zero and around it when the fusion is planned:
    ``tensorfuse.algebra.conditioning``)."""
