"""The package's layers import one way (DESIGN §2): dsl → algebra → schedule_templates → targets,
autotune above them, the compile entry points on top. Checked on the import statements, so a
change that routes a call back up fails here, not in review."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tensorfuse"

# a layer may not import these (local imports count: hiding one in a function keeps the
# dependency)
FORBIDDEN = {
    "targets": ("tensorfuse.schedule_templates", "tensorfuse.autotune", "tensorfuse.api",
                "tensorfuse.schedule", "tensorfuse.records", "tensorfuse.kernels"),
    "schedule_templates": ("tensorfuse.autotune", "tensorfuse.api", "tensorfuse.schedule",
                           "tensorfuse.records", "tensorfuse.kernels"),
    "algebra": ("tensorfuse.schedule_templates", "tensorfuse.targets", "tensorfuse.autotune",
                "tensorfuse.lower_to_tir", "tvm"),
    "dsl": ("tensorfuse.algebra", "tensorfuse.schedule_templates", "tensorfuse.targets",
            "tensorfuse.autotune"),
    "autotune": ("tensorfuse.kernels", "tensorfuse.api", "tensorfuse.schedule"),
}


def imported(path: pathlib.Path):
    module = ["tensorfuse"] + list(path.relative_to(PACKAGE).with_suffix("").parts)
    if module[-1] == "__init__":
        module = module[:-1]
    else:
        module = module[:-1]  # the package the file is in
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = module[:len(module) - node.level + 1] if node.level else []
            yield ".".join(base + ([node.module] if node.module else []))


def test_no_layer_imports_a_layer_above_it():
    found = []
    for layer, above in FORBIDDEN.items():
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            for name in imported(path):
                if any(name == a or name.startswith(a + ".") for a in above):
                    found.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert not found, "\n".join(found)


def test_emitters_hold_no_planning():
    """targets/ writes code from plans: the planning entry points live in schedule_templates/."""
    for path in (PACKAGE / "targets").rglob("*.py"):
        text = path.read_text()
        for name in ("def plan_rowtile", "def plan_gemm_chain", "def plan_decode",
                     "def check_sizes", "def block_lists", "def default_knobs"):
            assert name not in text, f"{path.name} defines {name[4:]}"


def _functions(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


def test_emitter_functions_are_short():
    """An emitter is assembled from parts (docs/emitters.md): no function in targets/ writes a
    whole kernel — none is over 120 lines."""
    long = [f"{path.relative_to(PACKAGE.parent)}: {name} ({lines} lines)"
            for path in sorted((PACKAGE / "targets").rglob("*.py"))
            for name, lines in _functions(path) if lines > 120]
    assert not long, "\n".join(long)


def test_shared_device_functions_are_defined_once():
    """Every ``tf_`` device function (the helpers kernels share: wgmma and its descriptors, TMA,
    mbarriers, DSM) has one definition in targets/, and no kernel keeps a descriptor function of
    its own (there were two ``kmajor_desc`` with different signatures)."""
    import re

    defined: dict = {}
    for path in sorted((PACKAGE / "targets").rglob("*.py")):
        for name in re.findall(r"__device__ [\w\s<>:&*,]*?\b(\w+)\(", path.read_text()):
            defined.setdefault(name, []).append(path.name)
    twice = {n: where for n, where in defined.items() if n.startswith("tf_") and len(where) > 1}
    assert not twice, twice
    assert defined["tf_kmajor_desc"] == ["wgmma.py"] and defined["tf_nmajor_desc"] == ["wgmma.py"]
    assert not [n for n in defined if n.endswith("major_desc") and not n.startswith("tf_")]


def test_modules_are_small():
    """A module does one job: none in the package is over 600 lines."""
    long = [f"{path.relative_to(PACKAGE.parent)} ({n} lines)"
            for path in sorted(PACKAGE.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > 600]
    assert not long, "\n".join(long)
