"""A kernel whose tensors or scalars are named as a Triton template names its own variables
(``seen``, ``base``, ``tl``, ``offs_m``, ``BLOCK_M``, a compute's state ``st_m_0``:
:func:`~tensorfuse.targets.triton.shadowing.template_may_write`) run as the same program with
those arguments named otherwise (``seen`` → ``arg_seen``).

The templates name a kernel's arguments after the program's, and a name they also give a
variable of their own would be overwritten in the generated kernel, so such a program was refused
by every Triton template and ran on TVM's default schedule — a stage of the floor whose input is
a compute named so too, with no way for the user to rename around the stage's names. Renaming is
a view of the call: the caller's arguments are handed on under the other names, nothing copied.
(Names tensors commonly have — ``s``, ``t``, ``g``, ``lo``, ``value``, ``scale`` — are no such
names: the templates' own variables of those names are namespaced instead, ``_t``, ``_a_value``.)
"""
from __future__ import annotations

import re
import warnings

from ..algebra.exprs import rewrite_computes, rewritten_program, substitute
from ..dsl.expr import Load, Scalar
from ..dsl.program import Program, ProgramKernel, ScalarParam, TensorParam
from ..targets.triton.shadowing import template_may_write
from .lifted_kernel import LiftedKernel


def template_safe_names(program: Program) -> dict[str, str]:
    """``{name: other name}`` for each tensor or scalar of ``program`` that a Triton template
    may name a variable of its own; the other names are taken by nothing in the program and
    written by no template. Empty where none is."""
    taken = {p.name for p in program.params} | {c.name for c in program.computes} | \
        set(program.dim_names())
    found, computes = {}, {c.name for c in program.computes}
    for p in program.params:
        if template_may_write(p.name, computes):
            other = f"arg_{p.name}"
            while other in taken or template_may_write(other):
                other += "_"
            taken.add(other)
            found[p.name] = other
    return found


def renamed_program(program: Program, names: dict[str, str]) -> Program:
    """``program`` with the tensors and scalars ``names`` maps named so (same computes, axes and
    sizes)."""
    params = [TensorParam(names[p.name], p.dims, p.dtype, p.loc) if isinstance(p, TensorParam)
              and p.name in names else ScalarParam(names[p.name], p.dtype, p.loc)
              if p.name in names else p for p in program.params]
    by_name = {p.name: q for p, q in zip(program.params, params)}

    def rename(node):
        if isinstance(node, Load) and node.param.name in names:
            return Load(by_name[node.param.name],
                        [substitute(i, rename) for i in node.indices], node.loc)
        if isinstance(node, Scalar) and node.name in names:
            return Scalar(names[node.name], node.dtype, node.loc)
        return None

    return rewritten_program(program, params, rewrite_computes(program, rename))


def with_safe_names(program: Program) -> tuple[Program, dict[str, str]]:
    """``program`` with its arguments renamed by :func:`template_safe_names`, and the names
    (``program`` itself and ``{}`` where none needs it): what ``tf.compile`` runs and tuning
    keys its records by."""
    names = template_safe_names(program)
    return (renamed_program(program, names) if names else program), names


def renamed_kernel(kernel, spec, compile_program) -> "RenamedKernel | None":
    """``kernel`` on ``spec`` (a GPU) as a kernel of its program renamed
    (:func:`template_safe_names`), compiled by ``compile_program(program kernel)``; None where
    no name needs it."""
    program, names = with_safe_names(kernel.program)
    if not names:
        return None
    tuned_as = getattr(kernel, "tuned_as", None)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        inner = compile_program(ProgramKernel(
            program, tuned_as=None if tuned_as is None else with_safe_names(tuned_as)[0]))
    for w in said:   # what planning said of the program, in the caller's names
        warnings.warn_explicit(_named_back(str(w.message), names), w.category, w.filename,
                               w.lineno)
    return RenamedKernel(kernel.program, names, inner, spec)


def _named_back(text: str, names: dict[str, str]) -> str:
    for name, other in names.items():
        text = re.sub(rf"\b{re.escape(other)}\b", name, text)
    return text


class RenamedKernel(LiftedKernel):
    """``inner``, a kernel of ``program`` renamed by ``names``, as a kernel of ``program``: a
    call's tensors and scalars are passed on under the other names."""

    who = "arguments renamed"

    def __init__(self, program: Program, names: dict[str, str], inner, target):
        super().__init__(program, {}, inner, target, ())
        self.renamed = dict(names)
        self.lift = ("arguments renamed in the generated kernel (names its templates give "
                     "their own variables): " +
                     ", ".join(f"{a} → {b}" for a, b in self.renamed.items()))
        self.description = f"{self.lift}; {inner.description}"

    def inner_dims(self, dims: dict) -> dict:
        """The sizes, and the scalars given by name among them under their other names."""
        return {self.renamed.get(n, n): v for n, v in dims.items()}

    def _views(self, values: dict, outs: list, dims: dict) -> list:
        for name, other in self.renamed.items():
            if name in values:
                values[other] = values.pop(name)
        return outs
