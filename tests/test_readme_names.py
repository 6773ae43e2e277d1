"""Every ``tf.<name>`` the README's Python uses exists after a plain ``import tensorfuse as tf`` —
a newcomer copies these snippets as they are (``tf.kernels`` once did not)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a fresh interpreter: in the test session other tests have imported submodules already
CHECK = """
import sys
import tensorfuse as tf
missing = []
for dotted in sys.argv[1:]:
    obj = tf
    for part in dotted.split("."):
        if not hasattr(obj, part):
            missing.append("tf." + dotted)
            break
        obj = getattr(obj, part)
print(" ".join(missing))
"""


def test_readme_names_resolve_after_import():
    python = "\n".join(re.findall(r"```python\n(.+?)\n```", (ROOT / "README.md").read_text(),
                                  flags=re.S))
    names = sorted(set(re.findall(r"\btf\.([A-Za-z_][\w.]*[\w])", python)))
    assert "kernels.rmsnorm" in names  # the snippets were found
    out = subprocess.run([sys.executable, "-c", CHECK, *names], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip()
    assert out == "", f"the README uses names that do not exist: {out}"
