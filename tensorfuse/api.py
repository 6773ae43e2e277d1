"""The public entry points: schedule a kernel, compile it."""
from __future__ import annotations

from .compiled import CompiledKernel
from .dsl.expr import user_location
from .errors import ScheduleError
from .kernel import Kernel
from .schedule import Schedule
from .schedule_templates import lower_program
from .schedule_templates.default import apply_default_schedule
from .targets import TargetSpec, get_target


def schedule(kernel: Kernel, target: "str | TargetSpec" = "auto", **dims: int) -> Schedule:
    """An interactive schedule of ``kernel`` for ``target``; sizes given here are fixed in the IR."""
    return Schedule(kernel, target, **dims)


def compile(kernel: "Kernel | Schedule", target: "str | TargetSpec | None" = None) -> CompiledKernel:  # noqa: A001
    """A callable kernel. A :class:`Kernel` gets the default schedule for ``target`` (``"auto"``:
    the local GPU if any, else the CPU), built per shape signature; a :class:`Schedule` is compiled
    as scheduled."""
    if isinstance(kernel, Schedule):
        if target is not None and get_target(target).name != kernel.target.name:
            raise ScheduleError(f"this schedule is for {kernel.target.name}, not "
                                f"{get_target(target).name}", user_location())
        return kernel.compile()
    if not isinstance(kernel, Kernel):
        raise ScheduleError(f"tensorfuse.compile takes a @tensorfuse.kernel or a schedule, got "
                            f"{type(kernel).__name__}", user_location())
    spec = get_target(target or "auto")
    program = kernel.program

    def build(dims: dict, index_dtype: str):
        return apply_default_schedule(lower_program(program, (), dims, index_dtype), spec)

    return CompiledKernel(program, spec, build, "default schedule")
