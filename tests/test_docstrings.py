"""Every public function, class, method and property of hccl_py, topology, launch and benchmarks
has a docstring, and so does every public function and class of the scripts in examples/ (issue 14).

A method counts as documented when :func:`inspect.getdoc` finds a docstring, which it inherits from
the base class: an override of a documented interface method (``Backend.run``, ``RankComm.bind``)
is documented where the interface is. The same holds for a class that implements a project
``Protocol`` without naming it as a base (the transports implement ``transport.base.Transport``
that way): a method the protocol documents is documented.

A class needs its own docstring: one inherited from ``Enum`` or ``Exception`` says nothing about
the class, nor does the signature that ``dataclass`` and ``NamedTuple`` write into ``__doc__``
(``Row(a, b)``).

Modules whose import needs a third-party package that is not installed (torch, mpi4py) are skipped
and named in the failure message; an ImportError from the project's own modules fails the test.
The examples are scripts: they are read with ``ast``, not imported.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hccl_py", "topology", "launch", "benchmarks")
SCRIPTS = ROOT / "examples"


def _own(name: str | None) -> bool:
    return bool(name) and name.split(".")[0] in PACKAGES


def _import_all() -> tuple[list, list[str]]:
    """(every importable module of PACKAGES, 'module: missing-package' for those skipped)."""
    modules, skipped = [], []

    def load(name: str):
        try:
            return importlib.import_module(name)
        except ImportError as err:
            if _own(err.name) or err.name is None:
                raise
            skipped.append(f"{name}: needs {err.name}")
            return None

    def on_error(name: str) -> None:
        # walk_packages imports each subpackage to list it; a failure there is re-raised by load().
        load(name)

    for package in PACKAGES:
        top = load(package)
        modules.append(top)
        for info in pkgutil.walk_packages(top.__path__, package + ".", onerror=on_error):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue  # importing it would run the command
            module = load(info.name)
            if module is not None:
                modules.append(module)
    return modules, skipped


def _where(obj) -> str:
    target = obj.fget if isinstance(obj, property) else inspect.unwrap(obj)
    try:
        file = Path(inspect.getsourcefile(target)).resolve()
        line = inspect.getsourcelines(target)[1]
    except (OSError, TypeError):
        return "?"
    try:
        file = file.relative_to(ROOT)
    except ValueError:
        pass
    return f"{file}:{line}"


def _protocols(modules) -> list[type]:
    """Every ``typing.Protocol`` the modules define (public or not)."""
    return [
        obj
        for module in modules
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and obj.__module__ == module.__name__
        and getattr(obj, "_is_protocol", False)
        and obj is not typing.Protocol
    ]


def _implemented(cls: type, protocols: list[type]) -> list[type]:
    """The protocols ``cls`` implements structurally: it has every public method they declare."""
    found = []
    for proto in protocols:
        methods = [name for name, value in vars(proto).items() if not name.startswith("_") and callable(value)]
        if proto not in cls.__mro__ and methods and all(callable(getattr(cls, name, None)) for name in methods):
            found.append(proto)
    return found


def _class_doc_missing(cls: type) -> bool:
    doc = cls.__dict__.get("__doc__")
    return not doc or not doc.strip() or doc.startswith(f"{cls.__name__}(")


def _missing_in_class(cls: type, qualname: str, module: str, protocols: list[type], found: list[str]) -> None:
    if _class_doc_missing(cls):
        found.append(f"{_where(cls)}: class {qualname}")
    interfaces = _implemented(cls, protocols)
    for name, raw in vars(cls).items():
        if name.startswith("_"):
            continue
        if inspect.isclass(raw):
            if raw.__module__ == module:
                _missing_in_class(raw, f"{qualname}.{name}", module, protocols, found)
            continue
        if isinstance(raw, (staticmethod, classmethod)):
            func = raw.__func__
        elif isinstance(raw, property) or inspect.isfunction(raw):
            func = raw
        elif hasattr(raw, "__get__") and callable(getattr(raw, "func", None)):
            func = raw  # functools.cached_property and the like
        else:
            continue  # data: enum members, dataclass fields, NamedTuple field getters
        if getattr(func.fget if isinstance(func, property) else func, "__module__", module) != module:
            continue
        doc = inspect.getdoc(getattr(cls, name)) if not isinstance(raw, property) else inspect.getdoc(raw)
        if isinstance(raw, property) and not doc:
            # getdoc finds a property's docstring on the base class only through the getter.
            doc = next((inspect.getdoc(vars(base)[name]) for base in cls.__mro__[1:] if name in vars(base)), None)
        if not doc:
            doc = next((inspect.getdoc(vars(proto)[name]) for proto in interfaces if name in vars(proto)), None)
        if not doc:
            kind = "property" if isinstance(raw, property) else "def"
            found.append(f"{_where(func)}: {kind} {qualname}.{name}")


def _missing_in_module(module, protocols: list[type]) -> list[str]:
    found: list[str] = []
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            _missing_in_class(obj, name, module.__name__, protocols, found)
        elif callable(obj) and inspect.isfunction(inspect.unwrap(obj)):
            if not inspect.getdoc(obj):
                found.append(f"{_where(obj)}: def {name}")
    return found


def _missing_in_script(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    where = path.relative_to(ROOT)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            if not ast.get_docstring(node):
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                found.append(f"{where}:{node.lineno}: {kind} {node.name}")
    return found


def _by_place(line: str) -> tuple[str, int, str]:
    place, _, what = line.partition(": ")
    file, _, number = place.rpartition(":")
    return file, int(number) if number.isdigit() else 0, what


def test_every_public_name_has_a_docstring():
    modules, skipped = _import_all()
    protocols = _protocols(modules)
    missing = {line for module in modules for line in _missing_in_module(module, protocols)}
    for path in sorted(SCRIPTS.glob("*.py")):
        missing.update(_missing_in_script(path))
    missing = sorted(missing, key=_by_place)
    assert not missing, (
        f"{len(missing)} public names without a docstring:\n  "
        + "\n  ".join(missing)
        + ("\nskipped (optional dependency not installed):\n  " + "\n  ".join(skipped) if skipped else "")
    )
