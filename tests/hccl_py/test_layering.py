"""The runtime's layers (README, "Layout"): hccl_py never imports launch or benchmarks; schedules
(algorithms/) never import a transport, the executor or the communicator; transports never
import algorithms; torch is imported only by the adapter that needs it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hccl_py"


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module name, at module level) of every import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    top_level = {id(node) for node in tree.body}
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((module, id(node) in top_level))
    return found


def _modules(folder: Path):
    return sorted(p for p in folder.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(PACKAGE), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_runtime_never_imports_the_launcher_or_the_benchmarks(path):
    for module, _ in _imports(path):
        assert module.split(".")[0] not in ("launch", "benchmarks"), f"{path.name} imports {module}"


@pytest.mark.parametrize("path", _modules(PACKAGE / "algorithms"), ids=lambda p: p.name)
def test_schedules_do_no_io(path):
    forbidden = ("hccl_py.transport", "hccl_py.executor", "hccl_py.communicator", "hccl_py.runtime", "hccl_py.store",
                 "socket", "zmq", "mpi4py")
    for module, _ in _imports(path):
        assert not module.startswith(forbidden), f"{path.name} imports {module}"


@pytest.mark.parametrize("path", _modules(PACKAGE / "transport"), ids=lambda p: p.name)
def test_transports_know_nothing_of_algorithms(path):
    for module, _ in _imports(path):
        assert not module.startswith(("hccl_py.algorithms", "hccl_py.executor", "hccl_py.communicator")), \
            f"{path.name} imports {module}"


@pytest.mark.parametrize("path", _modules(PACKAGE), ids=lambda p: str(p.relative_to(ROOT)))
def test_torch_only_inside_the_adapter_and_never_at_module_level(path):
    for module, top in _imports(path):
        if module.split(".")[0] == "torch":
            assert "torch" in path.parts[len(PACKAGE.parts):-1] or path.stem == "torch", f"{path.name} imports torch"
            in_adapter = path.parts[len(PACKAGE.parts)] == "torch"  # hccl_py/torch/ and its torch_npu (standin/)
            assert not top or in_adapter, f"{path.name} imports torch at module level"


def test_importing_hccl_py_imports_no_launcher_no_zmq_no_torch():
    code = ("import sys, hccl_py; loaded = {m.split('.')[0] for m in sys.modules}; "
            "bad = {'launch', 'benchmarks', 'zmq', 'torch', 'mpi4py', 'matplotlib'} & loaded; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
