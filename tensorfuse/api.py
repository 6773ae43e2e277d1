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


def compile(kernel: "Kernel | Schedule", target: "str | TargetSpec | None" = None,  # noqa: A001
            template: str | None = "auto"):
    """A callable kernel. A :class:`Kernel` on a GPU target gets a template when one fits
    (``template="auto"``: its reductions fused by a rolling update into one Triton kernel), else
    TVM's default schedule; on the CPU the default schedule; built per shape signature.
    ``template=None`` forces the default schedule (TVM code generation). ``target="auto"``: the
    local GPU if any, else the CPU. A :class:`Schedule` is compiled as scheduled."""
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
    if template == "auto":
        from .schedule_templates import TEMPLATES
        from .schedule_templates.auto import choose

        choice = choose(program, spec)
        if choice is not None and _triton_available():
            name, fusion = choice
            return TEMPLATES[name](kernel, fusion, spec)
    elif template is not None:
        raise ScheduleError(f"template must be 'auto' or None here; to pick one, use "
                            f"tensorfuse.schedule(...).rolling_update(...).apply_template"
                            f"({template!r})", user_location())

    def build(dims: dict, index_dtype: str):
        return apply_default_schedule(lower_program(program, (), dims, index_dtype), spec)

    return CompiledKernel(program, spec, build, "default schedule")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
