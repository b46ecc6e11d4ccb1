"""docs/algorithms.md is generated from the schedule docstrings (``hccl_py/algorithms/doc.py``):
it must equal the generator's output, and every schedule's docstring must state its steps,
what it sends or receives, and its TMP."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

import pytest

from hccl_py.algorithms import doc
from hccl_py.algorithms.registry import ALGORITHMS

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "algorithms.md"


def test_docs_algorithms_md_is_up_to_date():
    want = doc.render()
    have = PAGE.read_text() if PAGE.exists() else ""
    if have != want:
        changed = next(
            (i + 1 for i, (a, b) in enumerate(zip(have.splitlines(), want.splitlines())) if a != b),
            min(len(have.splitlines()), len(want.splitlines())) + 1,
        )
        pytest.fail(
            f"docs/algorithms.md is out of date with the schedule docstrings (first difference at line {changed}). "
            f"Regenerate it from the repository root:\n    {doc.COMMAND}\nand commit the result."
        )


@pytest.mark.parametrize("name", [f"{c}_{a}" for c, algos in ALGORITHMS.items() for a in algos])
def test_every_schedule_docstring_states_steps_traffic_and_tmp(name):
    text = import_module(f"hccl_py.algorithms.{name}").__doc__ or ""
    assert "Steps:" in text, f"{name}.py: the docstring says nothing under 'Steps:'"
    assert "Sent" in text or "Received" in text, f"{name}.py: the docstring says nothing of what is sent or received"
    assert "TMP" in text, f"{name}.py: the docstring says nothing of TMP"


def test_every_algorithm_has_a_section():
    page = doc.render()
    for collective, algos in ALGORITHMS.items():
        for algo in algos:
            assert f"### {collective} {algo}\n" in page
    for section in ("## alltoallv", "## Two-level algorithms"):
        assert section in page


def test_markdown_turns_literal_blocks_into_fences():
    text = "Use it::\n\n    fn(1)\n    fn(2)\n\nAfter, :class:`Work`."
    assert doc.markdown(text) == "Use it:\n\n```python\nfn(1)\nfn(2)\n```\n\nAfter, ``Work``.\n"
