"""The README's two commands are the ones CI runs and the package provides."""
import pathlib
import re

ROOT = pathlib.Path(__file__).parent.parent


def commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_demo_then_tests():
    first, second = commands()[:2]
    assert "pip install" in first and first.endswith("tensorfuse demo")
    assert "pytest" in second


def test_ci_runs_the_readme_test_command_verbatim():
    assert commands()[1] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_console_script_is_declared():
    assert "tensorfuse = tensorfuse.cli:main" in (ROOT / "setup.cfg").read_text()
