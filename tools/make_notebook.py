"""Write a tutorial notebook from a plain-text script: cells separated by lines '# %%' (code) or
'# %% [markdown]' (markdown, each line starting with '# '). Usage: make_notebook.py SRC.py OUT.ipynb
The .py sources live beside the notebooks so the tutorials can be reviewed as code."""
import sys

import nbformat


def convert(src: str) -> nbformat.NotebookNode:
    cells, kind, lines = [], None, []

    def flush():
        text = "\n".join(lines).strip("\n")
        if kind == "markdown":
            text = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in text.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(text))
        elif kind == "code" and text:
            cells.append(nbformat.v4.new_code_cell(text))

    for line in src.splitlines():
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        else:
            lines.append(line)
    flush()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        nbformat.write(convert(f.read()), sys.argv[2])
