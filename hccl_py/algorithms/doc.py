"""docs/algorithms.md from the schedule modules' own docstrings: one section per collective, in
the registry's order (``registry.ALGORITHMS``), one subsection per algorithm with its steps,
elements on the wire and TMP, then all-to-all with counts per pair (``alltoallv.py``), the
two-level algorithms (``hierarchical.py``) and the building blocks they share::

    python -m hccl_py.algorithms.doc > docs/algorithms.md

A docstring is the one place an algorithm is described; this page only gathers them (a test
fails when docs/algorithms.md differs from :func:`render`).
"""

from __future__ import annotations

import inspect
import re
import sys
from importlib import import_module
from types import ModuleType

from ..collectives import COLLECTIVES
from .registry import ALGORITHMS, V_ALGORITHMS

COMMAND = "python -m hccl_py.algorithms.doc > docs/algorithms.md"
SOURCE_DIR = "hccl_py/algorithms"

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data):`~?([^`]+)`")


def _module(name: str) -> ModuleType:
    return import_module(f"{__package__}.{name}")


def _link(name: str) -> str:
    """A link from docs/ to the module's file."""
    return f"[`{name}.py`](../{SOURCE_DIR}/{name}.py)"


def markdown(doc: str) -> str:
    """A module docstring as Markdown: reST roles become code spans, a paragraph ending in ``::``
    ends in ``:``, and its indented literal block becomes a fenced code block."""
    lines = inspect.cleandoc(doc).splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = _ROLE.sub(r"``\1``", lines[i])
        if line.rstrip().endswith("::"):
            line = line.rstrip()[:-1]
            out.append(line)
            i += 1
            while i < len(lines) and not lines[i].strip():
                i += 1
            block = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
                block.append(lines[i][4:])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            out += ["", "```python", *block, "```", ""]
            continue
        out.append(line)
        i += 1
    return "\n".join(out).strip() + "\n"


def _counts(c) -> tuple[str, str]:
    """(IN, OUT) elements of one rank in words, from the collective's description."""

    def word(fn) -> str:
        n = fn(7, 1)
        return {0: "-", 1: "count", 7: "size * count"}[n]

    in_count, out_count = word(c.in_count), word(c.out_count)
    if c.root_only == "in":
        in_count += " (root)"
    elif c.root_only == "out":
        out_count += " (root)"
    return in_count, out_count


def _anchor(text: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^a-z0-9 _-]", "", text.lower()).replace(" ", "-")


def _heading(collective: str) -> str:
    return f"{collective} ({COLLECTIVES[collective].hccl_name})"


def render() -> str:
    """The whole of docs/algorithms.md."""
    parts = [
        "# Algorithms: steps and bytes on the wire",
        "",
        f"<!-- Generated from the docstrings of {SOURCE_DIR}/*.py by `{COMMAND}`. "
        "Edit the docstrings, then regenerate; a test fails while this file differs. -->",
        "",
        "Every collective algorithm is a *schedule*: a pure function "
        "`schedule(rank, size, count, root) -> Schedule` that lists one rank's steps (local copies, "
        "messages to and from peers). The runtime executes it, the cost model times it and the "
        "simulator plays it for thousands of ranks, so the three cannot disagree. Each algorithm "
        f"lives in `{SOURCE_DIR}/<collective>_<algo>.py`; the registry (`registry.py`) maps "
        '(collective, algorithm) to it. `algo="auto"` runs what HCCL\'s own selection rules '
        "choose for the call's size, card and topology (see docs/fidelity.md); where no HCCL rule covers a call "
        "(a barrier), the algorithm with the least modeled time (ties go to the one listed first), labelled an "
        "estimate.",
        "",
        "Counts are in elements of the call's dtype: bytes on the wire = elements x itemsize. "
        "`size` is the number of ranks, `count` the call's count (the whole buffer for allreduce, "
        "broadcast and reduce, one rank's block for the others), p the largest power of two <= size. `IN`, `OUT` and `TMP` are the buffers a schedule names (TMP is scratch the "
        "executor provides); one rank's buffers hold:",
        "",
        "| collective | HCCL operator | IN | OUT | in place (IN is OUT) | algorithms |",
        "|---|---|---|---|---|---|",
    ]
    for collective, algos in ALGORITHMS.items():
        c = COLLECTIVES[collective]
        in_count, out_count = _counts(c)
        links = ", ".join(f"[`{a}`](#{_anchor(f'{collective} {a}')})" for a in algos)
        parts.append(
            f"| [{collective}](#{_anchor(_heading(collective))}) | `{c.hccl_name}` | {in_count} | {out_count} | "
            f"{'yes' if c.in_place else 'no'} | {links} |"
        )
    parts.append(
        f"| [alltoallv](#{_anchor(_heading('alltoallv'))}) | `{COLLECTIVES['alltoallv'].hccl_name}`, "
        "`HcclAlltoAllVC` | the caller's layout | the caller's layout | no | "
        f"{', '.join(f'`{a}`' for a in V_ALGORITHMS)} |"
    )
    parts += [
        "",
        "Two-level (hierarchical) versions of allreduce, allgather, broadcast, reduce, reduce_scatter, scatter and gather: "
        "[Two-level algorithms](#two-level-algorithms-hierarchicalpy); of alltoall and alltoallv: "
        "[Two-level all-to-alls](#two-level-all-to-alls-alltoall_stagedpy) and, for alltoallv, "
        "[HCCL's continuous pipeline](#hccls-continuous-pipeline-alltoallv_continuouspy); HCCL's pipeline of "
        "allgather, reduce_scatter and allreduce: [HCCL's pipeline](#hccls-pipeline-pipelinepy).",
        "",
    ]
    parts += ["## The schedule", "", f"From {_link('schedule')}.", "", markdown(_module("schedule").__doc__)]
    for collective, algos in ALGORITHMS.items():
        parts += [f"## {_heading(collective)}", ""]
        for algo in algos:
            name = f"{collective}_{algo}"
            parts += [
                f"### {collective} {algo}",
                "",
                f'`algo="{algo}"`, {_link(name)}.',
                "",
                markdown(_module(name).__doc__),
            ]
    parts += [
        f"## {_heading('alltoallv')}",
        "",
        f"`all_to_all_v` and `all_to_all_vc`; algorithms {', '.join(f'`{a}`' for a in V_ALGORITHMS)} "
        f"(their `schedule_v`, described under alltoall above). From {_link('alltoallv')}.",
        "",
        markdown(_module("alltoallv").__doc__),
    ]
    parts += [
        "## Two-level algorithms (hierarchical.py)",
        "",
        f'`algo="hier"` or `"hier:<inner>/<outer>"`. From {_link("hierarchical")}.',
        "",
        markdown(_module("hierarchical").__doc__),
    ]
    parts += [
        "## Two-level all-to-alls (alltoall_staged.py)",
        "",
        f'`algo="hier:<inner>/<outer>"` (staged) or `"hier:mesh/pipeline"` (pipelined) for alltoall and alltoallv; '
        f"`auto` runs `hier:mesh/pipeline@groups` across 910B servers and `hier:mesh/pairwise@groups` on other "
        f"cards' mesh groups, as HCCL does. From {_link('alltoall_staged')}.",
        "",
        markdown(_module("alltoall_staged").__doc__),
    ]
    parts += [
        "## HCCL's continuous pipeline (alltoallv_continuous.py)",
        "",
        f'`algo="hier:mesh/continuous"` for alltoallv; `auto` runs `hier:mesh/continuous@groups` for '
        f"`all_to_all_v` across 910B servers of two or more NPUs, as HCCL does. From "
        f"{_link('alltoallv_continuous')}.",
        "",
        markdown(_module("alltoallv_continuous").__doc__),
    ]
    parts += [
        "## HCCL's pipeline (pipeline.py)",
        "",
        f'`algo="hier:mesh/pipeline"` for allgather, reduce_scatter and allreduce; `auto`\'s '
        f"`hier:mesh/pipeline@server` runs it where HCCL's 910B selection does. From {_link('pipeline')}.",
        "",
        markdown(_module("pipeline").__doc__),
    ]
    parts += ["## Building blocks", ""]
    for name, title in (
        ("_fold", "Folding a size that is not a power of two"),
        ("_trees", "Binomial trees"),
        ("_nhr", "HCCL's NHR steps"),
        ("playback", "Checking a schedule in one process"),
    ):
        parts += [f"### {title}", "", f"From {_link(name)}.", "", markdown(_module(name).__doc__)]
    return "\n".join(parts).rstrip() + "\n"


def main() -> int:
    """Write :func:`render` to stdout (the documented command redirects it to docs/algorithms.md)."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
