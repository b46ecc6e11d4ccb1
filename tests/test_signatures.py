"""A call's request travels as one value (collectives.CallSpec), not as loose arguments: no
function of the project takes more than 8 parameters besides self, unless its ``def`` line says
why (``# params: <why>``: HCCL's own C signature, a public entry that takes a call's fields by
keyword)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 8


def _too_many(path: Path, root: Path = ROOT) -> list[str]:
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
        if names and names[0] in ("self", "cls"):
            names = names[1:]
        if len(names) > LIMIT and "# params:" not in lines[node.lineno - 1]:
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} takes {len(names)}")
    return found


@pytest.mark.parametrize("package", ["hccl_py", "launch", "benchmarks", "topology"])
def test_no_function_takes_more_than_eight_parameters_unless_it_says_why(package):
    found = [line for path in sorted((ROOT / package).rglob("*.py")) for line in _too_many(path)]
    assert not found, "\n".join(found)


def test_the_check_sees_a_long_signature(tmp_path):
    long = tmp_path / "long.py"
    long.write_text(
        "def f(a, b, c, d, e, f, g, h, i):\n    pass\n\n\ndef g(a, b, c, d, e, f, g, h, i):  # params: why\n    pass\n"
    )
    assert _too_many(long, tmp_path) == ["long.py:1 f takes 9"]
