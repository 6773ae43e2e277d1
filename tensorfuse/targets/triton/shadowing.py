"""A kernel argument that a generated Triton kernel's own variable would hide.

The templates name a kernel's arguments after the program's tensors and scalars, and write their
own variables beside them (``seen``, ``offs_m``, ``base``, ``st_m_0``, ``tl`` …). A tensor named
like one of those was overwritten by it in the kernel: a load from a block offset, or a module
where a pointer was expected — a Triton error far from the cause, or, in a kernel that only
reassigns it after its last read, nothing seen at all. ``tf.compile`` gives a kernel's tensors
and scalars named as a template might name its own (:func:`template_may_write`) other names in
the generated kernel (``schedule_templates/renamed_params.py``); every generated source is still
checked once, when it is first loaded, and a name that gets through is refused with what to do
about it.
"""
from __future__ import annotations

import ast
import re

from ...errors import TargetError


# the names the Triton templates give their own variables, arguments and functions: fixed words
# (not names tensors commonly have: a template's plain loop variable is namespaced, ``_t``), names
# made from the kernel's or an axis's (``softmax_fused``, ``offs_m``), and names made from a
# compute's (``st_m_0``, ``fin_m``, ``out_o``); every name a generated kernel of a template
# writes, and every buffer it takes, is one of them (tests/targets/test_shadowed_names.py)
_WORDS = frozenset({
    "seen", "seen_next", "base", "first", "rest", "pid", "bh", "blk", "arrived", "tl",
    "triton", "libdevice", "math", "col_ok", "row_ok", "row_at", "start_n", "end_m", "in_n",
    "ok_n", "koff_n", "mid_n", "back_n", "flat_n", "lo_n", "hi_n", "ok_p", "ok_c", "k0", "n0",
    "p0", "k_begin", "k_end", "k_part", "n_begin", "n_end", "n_part", "count_full",
    "count_partial", "base_full", "base_partial", "DELTA", "DK", "DO", "DQ", "DV", "FI", "FN",
    "FWD_LSE", "LSE", "OUT", "PI", "PN", "TFI", "TFN", "TPI", "TPN", "GROUPED", "RANGES", "BM",
    "BN", "BM2", "BN2", "part", "tiles", "tile_at", "row_tile", "row_blocks", "first_m",
    "group_rows", "in_group", "acc", "owner", "partials", "totals", "scan_flags", "scan_parts",
    "scan_part_blocks", "part_count"})
_FIXED = re.compile(r"_.*|BLOCK_\w+|(?:offs|pid|ax|bm|part|size|blocks|tok)_\w+|n_[A-Z]+"
                    r"|(?:kstep|totals|acc|row|pair)_\d+"
                    r"|\w+_(?:fused|sums|merge|elementwise|band_band|scan_\w+|scatter_\w+"
                    r"|gemm_tiles\w*)")
# a compute's states (``st_m_0``, a chunk's ``st_o_0_c1``) and values (``fin_m``, ``out_o``)
_STATES = re.compile(r"(?:st|nst|c|sv|acc|p|v)_(\w+?)_\d+(?:_c\d+)?")
_VALUES = re.compile(r"(?:fin|finref|ref|newref|sref|al|sh|lhs|rhs|t|old|sval|cs|sum|colpart"
                     r"|out)_(\w+)")


def template_may_write(name: str, computes: "set[str] | None" = None) -> bool:
    """Whether a Triton template may write a variable, argument or function named ``name``
    beside a kernel's own tensors and scalars — ``computes``: the program's compute names,
    which the names made from a compute's take (None: any name in their place). A superset:
    such a name is renamed in the generated kernel, which costs nothing but the other name."""
    if name in _WORDS or _FIXED.fullmatch(name):
        return True
    made = _STATES.fullmatch(name) or _VALUES.fullmatch(name)
    return made is not None and (computes is None or made.group(1) in computes)


def written_names(source: str) -> dict[str, set[str]]:
    """Per kernel (a function of ``source`` decorated ``@triton.jit``), the names it writes
    beside its arguments: those it replaces (:func:`_replaced`), the module-level bindings (an
    import, a helper function) and its constants (``BLOCK_M: tl.constexpr``)."""
    return _written(ast.parse(source))


def _written(tree: ast.Module) -> dict[str, set[str]]:
    module_names = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module_names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            module_names.add(node.name)
        elif isinstance(node, ast.Assign):
            module_names |= {n.id for t in node.targets for n in ast.walk(t)
                             if isinstance(n, ast.Name)}
    return {fn.name: _replaced(fn) | module_names |
            {a.arg for a in fn.args.args if a.annotation is not None}
            for fn in tree.body if isinstance(fn, ast.FunctionDef) and _jitted(fn)}


def shadowed_arguments(source: str) -> dict[str, list[str]]:
    """Per kernel (a function of ``source`` decorated ``@triton.jit``), the arguments that the
    function replaces or that name a module-level binding (:func:`written_names`; a constant is
    its own argument)."""
    tree = ast.parse(source)
    written = _written(tree)
    found = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and _jitted(n)):
        args = {a.arg for a in fn.args.args if a.annotation is None}
        hidden = sorted(args & written[fn.name])
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
