"""The parts Hopper kernels are assembled from, by role (FlashAttention-3's ``hopper/`` and
CUTLASS 3's collectives split a kernel the same way):

=============  ==============================================================================
role           what its parts emit
=============  ==============================================================================
scheduler      how CTAs walk the tiles: a tile's coordinates, persistent claims, split pieces
load           the producer's copies into shared memory (TMA boxes, multicast, cp.async)
pipeline       the warp roles, shared-memory ring and mbarriers, register reallocation, turns
mainloop       the tensor-core products (``wgmma`` from shared memory, A from registers)
row_state      the running states a sweep keeps per row (online softmax, its corrections)
epilogue       what leaves the registers: normalisation, casts, stores, split combines
=============  ==============================================================================

A part is a set of fragments — functions of the kernel's emitter context returning C++ text —
placed where the kernel's source needs them (a part may add ``#define``s, device functions and
a piece of the kernel body). :class:`Part` records what a kernel was assembled from, for
``tensorfuse show --parts``; the plan (``schedule_templates``) says which parts a kernel takes,
the emitter (``targets/cuda/<kernel>.py``) puts their fragments in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

ROLES = ("scheduler", "load", "pipeline", "mainloop", "row_state", "epilogue")

Fragment = Callable[[object], str]


@dataclass(frozen=True)
class Part:
    """One part of a kernel: its ``role`` (one of :data:`ROLES`), its ``name``, the plan fields
    it reads, and its ``fragments`` (in the order they appear in the source)."""

    role: str
    name: str
    reads: tuple[str, ...]
    fragments: tuple[Fragment, ...]

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"a part's role is one of {ROLES}, not {self.role!r}")

    def describe(self) -> str:
        """``role  name  (reads …)``: one line of ``tensorfuse show --parts``."""
        return f"{self.role:<10} {self.name:<28} reads {', '.join(self.reads)}"


def named_parts(available: tuple[Part, ...],
                names: tuple[tuple[str, str], ...]) -> tuple[Part, ...]:
    """The parts a plan names — ``(role, name)`` pairs — among a kernel's ``available`` ones; an
    error naming what the kernel cannot assemble."""
    by_name = {(p.role, p.name): p for p in available}
    missing = [f"{role} {name!r}" for role, name in names if (role, name) not in by_name]
    if missing:
        raise ValueError(f"this kernel has no part {', '.join(missing)}; its parts: "
                         + ", ".join(f"{p.role} {p.name!r}" for p in available))
    return tuple(by_name[role, name] for role, name in names)


def assemble(fragments, context) -> str:
    """The source of ``fragments`` (in order) for an emitter's ``context``."""
    return "".join(fragment(context) for fragment in fragments)


def swap(text: str, old: str, new: str) -> str:
    """``text`` with its one ``old`` piece replaced by ``new`` — a variant of a fragment (a
    permuted layout's addresses, a padded row's stores); an error where ``old`` is not there
    exactly once, so that a fragment edited elsewhere cannot leave a variant silently unmade."""
    if text.count(old) != 1:
        raise AssertionError(f"the fragment has {text.count(old)} of {old!r}")
    return text.replace(old, new)
