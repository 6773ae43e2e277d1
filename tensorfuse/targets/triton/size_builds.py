"""Which sizes a Triton row kernel is written for: each exactly, or as arguments (``dynamic=``).

A kernel written at exact sizes has them in its source as numbers (Triton folds them: the
fastest code, and a new source and compile for every new size). A kernel written with sizes as
arguments (:mod:`tensorfuse.dsl.symbolic_sizes`) serves every size for which the plan and the
emitter decide the same (its guards: a width within the same block count, 32-bit offsets, …);
Triton's JIT still specialises it on the sizes' divisibility by 16, and compiles each class once.

``dynamic``: ``True`` writes every size as an argument from the first call; ``False`` every
size exactly; ``None`` (the default, as ``torch.compile``'s automatic dynamic shapes) writes the
first sizes exactly and a size seen at a second value as an argument from then on.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, field

from ...dsl.symbolic_sizes import PREFIX, Guards, symbolic
from .view_strides import reading_views


def size_values(dims: dict) -> dict:
    """The values of a call's sizes under the names of a kernel's size arguments."""
    return {PREFIX + name: value for name, value in dims.items()}


def with_size_arguments(sig: dict, dims: dict, names) -> tuple[dict, tuple[str, ...]]:
    """An offline compile's signature ``sig`` with the sizes the kernel reads as arguments
    (those of ``dims`` among its argument ``names``) as ``i32``, and the ones whose values are
    multiples of 16 (the JIT specialises a call's so: the offline code is then the code that
    runs)."""
    sizes = {n: v for n, v in size_values(dims).items() if n in names}
    return {**sig, **dict.fromkeys(sizes, "i32")}, tuple(n for n, v in sizes.items()
                                                         if v % 16 == 0)


@dataclass
class Build:
    """One generated source and the sizes it served: written for them exactly (``exact``), or
    with sizes as arguments — under ``guards`` (a Triton kernel) or for any sizes its plan's
    knobs take (``by``: a CUDA C++ template whose kernels read every size as an argument) —
    and why a size could not be an argument where it was asked to be (``fixed_because``)."""

    source: str
    fn: object
    args: list
    sizes: list = field(default_factory=list)
    guards: Guards | None = None
    knobs: tuple = ()
    fixed_because: str = ""
    by: str = ""
    views: tuple = ()   # (name, strides) of the views it reads in place (.view_strides)

    @property
    def exact(self) -> bool:
        return self.guards is None and not self.by

    def describe(self) -> str:
        served = "; ".join(", ".join(f"{n}={v}" for n, v in s.items()) for s in self.sizes[:4])
        served += f"; … ({len(self.sizes)} in all)" if len(self.sizes) > 4 else ""
        if self.views:
            served += "; views read in place: " + ", ".join(
                f"{n} (strides {', '.join(map(str, strides))})" for n, strides in self.views)
        if self.by:
            return f"sizes as arguments ({self.by}): {served}"
        if self.exact:
            why = f" (sizes as arguments refused: {self.fixed_because})" if self.fixed_because \
                else ""
            return f"exact sizes{why}: {served}"
        fixed = self.guards.specialised()
        where = " and ".join(self.guards.describe()) or "any sizes"
        return (f"sizes as arguments{' (fixed: ' + ', '.join(fixed) + ')' if fixed else ''}, "
                f"where {where}: {served}")


class SizeBuilds:
    """The sources one kernel wrote, and which of them serves a call's sizes."""

    def __init__(self, dynamic: "bool | None" = None, taken: "set[str] | tuple" = ()):
        self.dynamic = dynamic
        self.builds: list[Build] = []
        self._seen: dict = {}   # size name -> the values it was built at
        # a parameter named as a size's argument would be: that size stays exact
        self._taken = {n[len(PREFIX):] for n in taken if n.startswith(PREFIX)}

    def varying(self, dims: dict) -> set:
        """The sizes to write as arguments for a build at ``dims``."""
        for name, value in dims.items():
            self._seen.setdefault(name, set()).add(value)
        if self.dynamic is None:
            return {n for n in dims if len(self._seen[n]) > 1} - self._taken
        return set(dims) - self._taken if self.dynamic else set()

    def find(self, dims: dict, knobs, scalars: tuple, varying: set,
             views: tuple = ()) -> "Build | None":
        """A build with sizes as arguments that serves ``dims`` with these knobs and scalars,
        written for these views (:func:`.view_strides.call_views`)."""
        key = (astuple(knobs), scalars, frozenset(varying))
        for build in self.builds:
            if not build.exact and build.knobs == key and build.views == views and \
                    build.guards.check(dims):
                build.sizes.append(dict(dims))
                return build
        return None

    def write(self, dims: dict, knobs, scalars: tuple, varying: set, emit,
              views: tuple = ()) -> Build:
        """A new build for ``dims``: ``emit(sizes)`` plans and writes the kernel at ``sizes`` and
        returns ``(source, fn, args)``. With sizes in ``varying`` it is written with them as
        arguments where the planner and the emitter allow, else exactly (and said why);
        ``views``: the views it reads in place, by their strides (the emitters read them while
        it writes: :func:`.view_strides.reading_views`)."""
        why = ""
        if varying:
            try:
                with symbolic(dims, varying) as (sym, guards), reading_views(views):
                    source, fn, args = emit(sym)
            except Exception as exc:  # noqa: BLE001 - any refusal falls back to exact sizes
                why = f"{type(exc).__name__}: {exc}"
            else:
                made = Build(source, fn, args, [dict(dims)], guards,
                             (astuple(knobs), scalars, frozenset(varying)), views=views)
                self.builds.append(made)
                return made
        with reading_views(views):
            source, fn, args = emit(dims)
        made = Build(source, fn, args, [dict(dims)], None, astuple(knobs), why, views=views)
        self.builds.append(made)
        return made


def size_alignments(prog, sizes: dict) -> list[tuple[str, int]]:
    """(argument, alignment) for each size the kernel reads as an argument (dynamic=) that is
    some tensor's innermost dimension, and so a row's stride: its largest power-of-two divisor
    where that is 2 to 8, said to Triton (the JIT specialises a multiple of 16 itself), so a row
    of 5000 bf16 elements is still read in 16-byte vectors and one of 5004 in 8-byte ones, as a
    kernel written for that width exactly reads them. Each is a class of sizes (a guard) a
    build serves: five a bucket. With three (16, 8, other) a softmax over widths not a multiple
    of 8 ran at 22-37 % of the copy bandwidth, element by element (``benchmarks.dynamic``)."""
    inner = {p.dims[-1] for p in prog.tensor_params if p.dims} | \
        {c.axes[-1].extent for c in prog.outputs if c.axes}
    found = []
    for name, size in sizes.items():
        if name in inner and not isinstance(size, int) and size % 16 != 0:
            align = next((a for a in (8, 4, 2) if size % a == 0), 1)
            if align > 1:
                found.append((str(size), align))
    return found
