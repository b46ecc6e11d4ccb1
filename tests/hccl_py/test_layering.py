"""The runtime's layers (docs/layout.md): every module of hccl_py imports only from its own
layer or those below it (``LAYERS``, bottom up), with no import loop, imports inside functions
included; an import inside a function is kept only for its cost (a heavy or optional library,
or an internal one marked ``# lazy: <why>`` on its line or the one above). hccl_py never imports launch or benchmarks;
schedules (algorithms/) never import a transport, the executor or the communicator; transports
never import algorithms; torch is imported only by the adapter that needs it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hccl_py"


def _imports(path: Path, *, names: bool = False) -> list:
    """(absolute module name, at module level) of every import in ``path``; with ``names``
    (module, at module level, line, imported names) instead."""
    tree = ast.parse(path.read_text(), str(path))
    top_level = {id(node) for node in tree.body}
    # module-level code under an if/try (e.g. a guarded import) is at module level too
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try)):
            top_level.update(id(child) for child in ast.walk(node))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level, node.lineno, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((module, id(node) in top_level, node.lineno, tuple(a.name for a in node.names)))
    return found if names else [(module, top) for module, top, _, _ in found]


def _modules(folder: Path):
    return sorted(p for p in folder.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(PACKAGE), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_runtime_never_imports_the_launcher_or_the_benchmarks(path):
    for module, _ in _imports(path):
        assert module.split(".")[0] not in ("launch", "benchmarks"), f"{path.name} imports {module}"


@pytest.mark.parametrize("path", _modules(PACKAGE / "algorithms"), ids=lambda p: p.name)
def test_schedules_do_no_io(path):
    forbidden = (
        "hccl_py.transport",
        "hccl_py.engine.executor",
        "hccl_py.communicator",
        "hccl_py.runtime",
        "hccl_py.rendezvous.store",
        "socket",
        "zmq",
        "mpi4py",
    )
    for module, _ in _imports(path):
        assert not module.startswith(forbidden), f"{path.name} imports {module}"


@pytest.mark.parametrize("path", _modules(PACKAGE / "transport"), ids=lambda p: p.name)
def test_transports_know_nothing_of_algorithms(path):
    for module, _ in _imports(path):
        assert not module.startswith(("hccl_py.algorithms", "hccl_py.engine.executor", "hccl_py.communicator")), (
            f"{path.name} imports {module}"
        )


@pytest.mark.parametrize("path", _modules(PACKAGE), ids=lambda p: str(p.relative_to(ROOT)))
def test_torch_only_inside_the_adapter_and_never_at_module_level(path):
    for module, top in _imports(path):
        if module.split(".")[0] == "torch":
            assert "torch" in path.parts[len(PACKAGE.parts) : -1] or path.stem == "torch", f"{path.name} imports torch"
            in_adapter = path.parts[len(PACKAGE.parts)] == "torch"  # hccl_py/torch/ and its torch_npu (standin/)
            assert not top or in_adapter, f"{path.name} imports torch at module level"


def test_importing_hccl_py_imports_no_launcher_no_zmq_no_torch():
    code = (
        "import sys, hccl_py; loaded = {m.split('.')[0] for m in sys.modules}; "
        "bad = {'launch', 'benchmarks', 'zmq', 'torch', 'mpi4py', 'matplotlib'} & loaded; assert not bad, bad; "
        # the cluster-scale simulator loads only when auto has no HCCL rule (algo_argmin), or for hccl-sim
        "assert not {'hccl_py.modeled.simulator', 'hccl_py.choice.argmin'} & set(sys.modules); "
        # the runtime loads on first use of hccl_py.init or hccl_py.Communicator, not on import
        "assert 'hccl_py.communicator' not in sys.modules; "
        "assert hccl_py.init.__module__ == 'hccl_py.runtime' and hccl_py.Communicator.__name__ == 'Communicator'; "
        "assert 'hccl_py.communicator' in sys.modules and 'init' in vars(hccl_py)"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


# hccl_py's layers, bottom up (docs/layout.md mirrors it): a module imports from its own layer and
# those below. A name is a module or a package (then every module in it, unless listed itself).
LAYERS = (
    (
        "hccl_py.errors",
        "hccl_py.sigterm",
        "hccl_py.dtypes",
        "hccl_py.collectives",
        "hccl_py.env",
        "hccl_py.tracefile",
        "hccl_py.work",
        "hccl_py.rundir",
    ),
    ("hccl_py.algorithms",),  # the schedules: pure data
    ("hccl_py.modeled.cost_model", "hccl_py.faults"),  # modeled/: time, apart from the data that moves
    ("hccl_py.modeled", "hccl_py.records"),  # the simulator, the card
    ("hccl_py.choice", "hccl_py.choice.names"),  # choice/: what an algorithm's name means (HCCL_ALGO's grammar)
    ("hccl_py.choice.hccl_rules", "hccl_py.choice.argmin"),  # HCCL's own selection; the model's argmin
    ("hccl_py.choice.select",),  # auto: the two above
    ("hccl_py.transport",),  # the transports: byte movers only
    ("hccl_py.job",),  # the job's configuration, assembled from env and the grammars above
    ("hccl_py.rendezvous", "hccl_py.rendezvous.secret"),  # rendezvous/: how the ranks meet
    ("hccl_py.rendezvous.store", "hccl_py.rendezvous.torch", "hccl_py.rendezvous.membership"),
    ("hccl_py.rendezvous.connect",),  # meeting: the job, the store, the transports
    ("hccl_py.engine", "hccl_py.engine.plan"),  # engine/: running a call on this rank; a call's plan
    ("hccl_py.engine.run",),  # one call's walk over its plan
    ("hccl_py.engine.progress",),  # the progress thread of asynchronous calls
    ("hccl_py.engine.executor",),  # the engine: transport, mailbox, notices, refusals, waits
    ("hccl_py.engine.context",),
    ("hccl_py.engine.issuing",),
    ("hccl_py.communicator",),
    ("hccl_py.runtime",),
    ("hccl_py",),  # the package's own __init__: the public API
    ("hccl_py.parallel",),
    ("hccl_py.planning",),
    ("hccl_py.torch", "hccl_py.capi"),  # the adapters on the public communicator: torch, HCCL's C API
)


def _module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


MODULES = {_module_name(p): p for p in _modules(PACKAGE) if "standin" not in p.parts}  # standin: torch_npu's stand-in


def _layer(module: str) -> int:
    best, layer = "", None
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > len(best):
                best, layer = name, index
    assert layer is not None, f"{module} is in no layer of LAYERS: add it"
    return layer


def _targets(module: str, names: tuple) -> list[str]:
    """The hccl_py modules an import of ``names`` from ``module`` loads (``from . import env``
    loads hccl_py.env; ``from .errors import X`` loads hccl_py.errors)."""
    found = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
    if found:
        return found
    while module and module not in MODULES:
        module = module.rpartition(".")[0]
    return [module] if module else []


def _edges():
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for module, top, line, names in _imports(path, names=True):
            if not module.startswith("hccl_py"):
                continue
            for target in _targets(module, names):
                if target != name:
                    yield name, target, top, "\n".join(lines[line - 2 : line])  # the import and the line above it


def test_every_module_is_in_a_layer():
    for name in MODULES:
        _layer(name)


def test_no_import_runs_up_the_layers():
    up = [
        f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})" for a, b, _, _ in _edges() if _layer(b) > _layer(a)
    ]
    assert not up, "\n".join(up)


def test_imports_inside_functions_are_kept_for_cost_and_marked():
    # Inside a function only for cost (zmq, ml_dtypes, matplotlib behind it), marked why; never to
    # dodge a loop.
    unmarked = [
        f"{a} imports {b} inside a function: {text.strip()}"
        for a, b, top, text in _edges()
        if not top and "# lazy:" not in text
    ]
    assert not unmarked, "\n".join(unmarked)


def test_no_import_loop():
    nx = pytest.importorskip("networkx")
    graph = nx.DiGraph((a, b) for a, b, _, _ in _edges())
    loops = list(nx.simple_cycles(graph))
    assert not loops, loops


# -- the seams: no module reads another module's private names -------------------------------------
PROJECT = ("hccl_py", "launch", "benchmarks", "topology")
# Private names of other libraries that adapters must use, each with why; a name defined in
# hccl-py too (torch's _C, a process group's _get_backend) would otherwise look like one of ours.
FOREIGN_PRIVATES = {
    "_make",
    "_replace",
    "_asdict",
    "_fields",  # NamedTuple's public API spells itself with a leading underscore
    "_C",
    "_get_backend",
    "_allgather_base",
    "_device",  # torch's (torch._C, ProcessGroup, torch.utils._device)
}


def _private_definitions() -> dict[str, set[Path]]:
    """Every private name (a leading underscore, not a dunder) each project module defines:
    functions, classes, module names and attributes it assigns."""
    defined: dict[str, set[Path]] = {}
    for root in PROJECT:
        for path in _modules(ROOT / root):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = node.name
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    name = node.attr
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    name = node.id
                else:
                    continue
                if name.startswith("_") and not name.startswith("__"):
                    defined.setdefault(name, set()).add(path)
    return defined


def test_no_module_reads_another_modules_private_names():
    """A module reads a private attribute only of its own objects (``self``, ``cls``, the classes it
    defines) and imports no private name from another module: the seams between modules are public
    (the communicator's call path is ``comm.issuer``; the torch backend's groups come from
    ``Communicator.create_sub_comm``)."""
    defined = _private_definitions()
    found = []
    for root in PROJECT:
        for path in _modules(ROOT / root):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                    value = node.value
                    if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                        continue
                    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "super":
                        continue
                    owners = defined.get(node.attr, set())
                    if owners and path not in owners and node.attr not in FOREIGN_PRIVATES:
                        where = ", ".join(sorted(str(p.relative_to(ROOT)) for p in owners))
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {ast.unparse(node)} ({where})")
                elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PROJECT)):
                    for alias in node.names:
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            private_module = (path.parent / f"{alias.name}.py").exists() or (
                                path.parent / alias.name
                            ).is_dir()
                            if (
                                not private_module
                            ):  # a package's private module, imported inside the package, is its own
                                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name}")
    assert not found, "\n".join(found)
