"""The tutorials are notebooks; each must run from top to bottom without errors."""
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

TUTORIALS = sorted((pathlib.Path(__file__).parent.parent / "tutorials").glob("*.ipynb"))


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_tutorial_runs(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()


def test_notebooks_match_their_sources():
    import subprocess
    import sys

    for nb_path in TUTORIALS:
        src = nb_path.with_suffix(".py")
        assert src.exists(), f"{nb_path.name} needs its source {src.name}"
        made = subprocess.run([sys.executable, str(nb_path.parent.parent / "tools" /
                                                    "make_notebook.py"), str(src), "/dev/stdout"],
                              capture_output=True, text=True, check=True).stdout
        assert _sources(nbformat.reads(made, 4)) == _sources(nbformat.read(nb_path, 4)), \
            f"{nb_path.name} is stale: run tools/make_notebook.py {src} {nb_path}"


def _sources(nb):
    return [(c.cell_type, c.source) for c in nb.cells]
