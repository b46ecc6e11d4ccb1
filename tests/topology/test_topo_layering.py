"""topology/ is pure data: it imports only the standard library, numpy and networkx (matplotlib
only inside a function of draw.py), never hccl_py or launch."""

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "topology"
ALLOWED = set(sys.stdlib_module_names) | {"numpy", "networkx", "topology"}


def test_topology_imports_only_stdlib_numpy_networkx():
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                if root == "matplotlib":
                    # lazily, inside the --png code path only
                    assert path.name == "draw.py" and id(node) not in top_level, path
                    continue
                assert root in ALLOWED, f"{path.name} imports {name}"


def test_importing_topology_does_not_import_the_runtime():
    import subprocess

    code = "import sys, topology, topology.cli; assert not {'hccl_py', 'launch', 'matplotlib'} & set(sys.modules), sys.modules.keys()"
    subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, check=True, timeout=60)
