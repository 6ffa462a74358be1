"""Every Python block in the README and docs/ runs as written (bar the fragments listed here, with why)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRAGMENTS = {  # (file, block index): why it cannot run alone
    ("README.md", 0): "shows where the callbacks go; `model` and `datamodule` are the reader's",
    ("docs/presets.md", 1): "a plug-in's entry point: `my_project` is the reader's package",
}


def blocks():
    files = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "benchmarks.md")]
    for path in files:
        for i, match in enumerate(re.finditer(r"```python\n(.*?)```", path.read_text(), re.S)):
            yield str(path.relative_to(ROOT)), i, match.group(1)


CASES = [pytest.param(code, id=f"{name}[{i}]") for name, i, code in blocks() if (name, i) not in FRAGMENTS]


def test_the_fragments_listed_still_exist():
    found = {(name, i) for name, i, _ in blocks()}
    assert set(FRAGMENTS) <= found


@pytest.mark.parametrize("code", CASES)
def test_doc_block_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever a block writes (logs, checkpoints) lands here
    exec(compile(code, "<doc block>", "exec"), {"__name__": "__doc_block__"})
