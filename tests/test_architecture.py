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
