"""A kernel argument that a generated Triton kernel's own variable would hide.

The templates name a kernel's arguments after the program's tensors and scalars, and write their
own variables beside them (``seen``, ``offs_m``, ``lo``, ``st_m_0``, ``tl`` …). A tensor named
like one of those was overwritten by it in the kernel: a load from a block offset, or a module
where a pointer was expected — a Triton error far from the cause, or, in a kernel that only
reassigns it after its last read, nothing seen at all. Every generated source is checked once,
when it is first loaded, and such a name is refused with what to do about it.
"""
from __future__ import annotations

import ast

from ...errors import TargetError


def shadowed_arguments(source: str) -> dict[str, list[str]]:
    """Per kernel (a function of ``source`` decorated ``@triton.jit``), the arguments that the
    function replaces (:func:`_replaced`) or that name a module-level binding (an import, a
    helper function)."""
    tree = ast.parse(source)
    module_names = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module_names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            module_names.add(node.name)
        elif isinstance(node, ast.Assign):
            module_names |= {n.id for t in node.targets for n in ast.walk(t)
                             if isinstance(n, ast.Name)}
    found = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and _jitted(n)):
        args = {a.arg for a in fn.args.args}
        hidden = sorted(args & (_replaced(fn) | module_names))
        if hidden:
            found[fn.name] = hidden
    return found


def _replaced(fn: ast.FunctionDef) -> set[str]:
    """Names ``fn`` binds to a value not made from themselves: a size rounded to its divisor
    (``N = N // 16 * 16``) or an operand widened (``a = a.to(tl.float32)``) keeps its meaning;
    ``seen = tl.full(…)`` does not."""
    found = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            reads = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
            found |= {n.id for t in node.targets for n in ast.walk(t)
                      if isinstance(n, ast.Name) and n.id not in reads}
        elif isinstance(node, (ast.For, ast.With, ast.comprehension)):
            targets = [node.target] if not isinstance(node, ast.With) else \
                [i.optional_vars for i in node.items if i.optional_vars is not None]
            found |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return found


def check_arguments_unshadowed(source: str) -> None:
    """:class:`TargetError` naming the arguments a kernel of ``source`` hides, if any (and for
    an argument named twice: a tensor named like a kernel's constant, ``BLOCK_M``)."""
    try:
        compile(source, "<generated kernel>", "exec")   # its arguments' names, each once
        found = shadowed_arguments(source)
    except SyntaxError as exc:
        if "duplicate argument" not in str(exc):
            raise
        name = str(exc).split("'")[1]
        raise TargetError(f"a tensor or scalar named {name!r} has the name of a constant of the "
                          "generated Triton kernel; rename it") from None
    for kernel, names in found.items():
        listed = ", ".join(repr(n) for n in names)
        raise TargetError(f"{listed}: a tensor or scalar of this kernel has the name of a "
                          f"variable the generated Triton kernel {kernel} writes; rename it (the "
                          "templates' own variables: offsets, running states, block bounds, "
                          "the module tl)")


def _jitted(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)
