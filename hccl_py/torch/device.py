"""The ``npu`` device in torch: build, load and install hccl-py's simulated NPU.

torch's PrivateUse1 backend renamed ``npu`` (as torch_npu does), from a small C++ extension in
torch's open-registration pattern (``csrc/npu_device.cpp`` and the parts it includes): a device guard that reports N cards,
an allocator booking each card's HBM from host memory, events stamped with the card's modeled
clock, and kernels that run torch's CPU kernels on the same bytes (no copies). Why C++ and not
torch's Python route: autograd's engine asks the device guard for the device count, which only a
C++ guard can answer, so backward on ``npu:1`` and above needs it (docs/torch.md).

The extension is compiled for the torch it runs under the first time it is needed (about 30 s;
``make install`` does it ahead) and kept in ``~/.cache/hccl-py`` (``HCCL_PY_CACHE``), keyed by
its source and torch's version, so an edited source is never shadowed by a stale build::

    from hccl_py.torch import device
    device.install(devices=4)           # what `import torch_npu` does under hccl-npu
    x = torch.ones(2, device="npu:1")
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import os
import shutil
import sys
from pathlib import Path

import torch

from .. import env
from ..engine.context import device_count_from_env, host_cards
from ..errors import HcclNotSupportedError
from ..rundir import private_dir

SUPPORTED_TORCH = "2.13"  # the private registration interfaces change between releases
SOURCE = Path(__file__).resolve().parent / "csrc" / "npu_device.cpp"  # the one translation unit; its parts beside it
CANN_VERSION = "9.2.0 (hccl-py simulated)"  # torch.version.cann: the CANN of hicann/hccl (its version.cmake)

_C = None  # the loaded extension, once installed


def check_torch(version: str | None = None) -> None:
    """HcclNotSupportedError unless torch is the release the device is written for."""
    version = version if version is not None else torch.__version__
    if version.split("+")[0].rsplit(".", 1)[0] != SUPPORTED_TORCH:
        raise HcclNotSupportedError(
            f"hccl-py's npu device supports torch {SUPPORTED_TORCH}.x (torch's device registration interfaces are "
            f"private and change between releases); this is torch {version}: pip install 'torch=={SUPPORTED_TORCH}.0'",
            module="torch",
            value=version,
            expected=f"{SUPPORTED_TORCH}.x",
        )


def sources() -> list[Path]:
    """The extension's source files: ``SOURCE`` and the parts it includes (csrc/*.h), by name."""
    return [SOURCE, *sorted(SOURCE.parent.glob("*.h"))]


def cache_dir() -> Path:
    """Where the compiled extension is kept: one folder per source, torch version and torch install."""
    root = os.environ.get(env.HCCL_PY_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hccl-py"
    )
    # The torch install is part of the key: torch's build names its headers' paths, so two venvs
    # sharing one folder would rebuild each other's extension at every load.
    key = hashlib.blake2b(digest_size=8)
    for part in sources():
        key.update(part.name.encode() + b"\0" + part.read_bytes())
    key.update(torch.__version__.encode() + sys.version.encode() + torch.__file__.encode())
    return Path(root) / f"npu-{key.hexdigest()}"


def build():
    """Compile (once per source and torch) and load the extension. Ranks that start together
    wait for one compile: an OS file lock, released if its holder dies, so nothing hangs on a
    killed build."""
    from torch.utils import cpp_extension

    where = cache_dir()
    # compiled code this process loads: the cache and its build folder must be this user's alone
    # (another user who can write there could swap the extension and run code as this one)
    keeps = "the compiled npu extension it loads"
    private_dir(str(where.parent), variable=env.HCCL_PY_CACHE, keeps=keeps)
    private_dir(str(where), variable=env.HCCL_PY_CACHE, keeps=keeps)
    if shutil.which("ninja") is None:  # the pip ninja of torch's extra sits beside this Python
        os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    lock_fd = os.open(where / "hccl-py.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)  # never a symlink's target
    with open(lock_fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            (where / "lock").unlink()  # torch's own baton, left by a build that was killed: we hold the real lock
        # Built from a copy in the cache folder, never from this checkout's path: torch's build file
        # names its sources, so two checkouts of the same source (a clone beside a working tree)
        # compiling from their own paths would each rebuild the other's extension, a minute or more.
        for part in sources():
            copy = where / part.name
            if not copy.exists() or copy.read_bytes() != part.read_bytes():
                shutil.copyfile(part, copy)
        source = where / SOURCE.name
        try:
            return cpp_extension.load(
                name="hccl_py_npu",
                sources=[str(source)],
                build_directory=str(where),
                extra_cflags=["-O1"],
                verbose=False,
            )
        except (RuntimeError, OSError) as err:
            raise HcclNotSupportedError(
                f"could not build hccl-py's npu device (a C++ compiler, Python's headers and ninja are needed; "
                f"pip install 'hccl-py[torch]' brings ninja): {err}",
                module="hccl_py.torch.device",
            ) from err


_DISPATCH_KEY = "PrivateUse1"  # what torch's generated wrapper names carry for the npu device


def device_checked_ops(yaml_path: str | os.PathLike | None = None) -> dict[str, str]:
    """The aten ops whose kernels torch generates with a device check, from the
    ``native_functions.yaml`` torch ships (its ``torchgen``): every function not marked
    ``device_check: NoCheck``, by ``aten::name[.overload]``, with the name torch's generated
    wrapper gives it in the message (``wrapper_PrivateUse1_mm``; unstructured kernels carry their
    overload: ``wrapper_PrivateUse1__index_select``). Read line by line (about 10 ms)::

        device_checked_ops()["aten::mm"]      # 'wrapper_PrivateUse1_mm'
        "aten::add.Tensor" in device_checked_ops()   # False: TensorIterator checks by itself
    """
    if yaml_path is None:
        import torchgen

        yaml_path = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    checked: dict[str, str] = {}
    entry: list | None = None  # [schema, unchecked, structured]

    def close() -> None:
        if entry is None or entry[1]:
            return
        schema, _, structured = entry
        full, _, rest = schema.partition("(")
        name, _, overload = full.partition(".")
        # torchgen's native name: an out= function (a keyword-only argument it writes) gets "_out"
        arguments = rest.rsplit(") ->", 1)[0]
        writes_keyword_only = "*" in arguments and "!)" in arguments.split("*", 1)[1]
        native = name + ("_out" if writes_keyword_only else "") + (f"_{overload}" if overload else "")
        prefix = f"wrapper_{_DISPATCH_KEY}_" if structured else f"wrapper_{_DISPATCH_KEY}_{overload}_"
        checked[f"aten::{full}"] = prefix + native

    with open(yaml_path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("- func:"):
                close()
                entry = [line[len("- func:") :].strip(), False, False]
            elif entry is not None and line.startswith("  "):
                if line.startswith("  device_check: NoCheck"):
                    entry[1] = True
                elif line.startswith(("  structured: True", "  structured_delegate:")):
                    entry[2] = True
    close()
    return checked


def _detach(ext) -> None:
    """At exit: no more calls from the device into Python (the interpreter is going away)."""
    ext.set_recording(False)
    ext.set_flush(None)
    ext.set_clock(None)


_drain_leaves: list = []  # the drain's leaf tensors: Python owns them until the interpreter ends


def _drain_autograd_workers(ext) -> None:
    """At exit, before the interpreter finalises: one tiny backward on every card that held a
    tensor, run through autograd's engine directly. Why: each card's autograd worker thread drops
    its last reference to a graph task just after it wakes the thread that called ``backward()``;
    torch 2.13 stashes a ``contextvars`` context in every graph task, and a worker that frees it
    while the interpreter finalises asks for the GIL then and is ended by CPython, which aborts the
    process ("terminate called without an active exception") when ``backward()`` was the
    program's last statement. A worker takes tasks in order, so once this backward is done the
    program's graph tasks are freed; this one is called with no context stashed, returns no
    tensors and its tensors are kept alive here, so freeing it late needs no Python."""
    try:
        engine = torch.autograd.Variable._execution_engine
        for index in range(ext.device_count()):
            stats = ext.memory_stats(index)
            if not (stats["allocation.all.allocated"] or stats["reserved_bytes.all.current"]):
                continue  # its worker never ran a task of this program
            leaf = torch.zeros((), device=torch.device("npu", index), requires_grad=True)
            out = leaf * 1.0
            grad = torch.ones_like(out)
            # Every tensor the graph task holds stays referenced from Python: a tensor whose Python
            # object died first is owned back by torch's C++ side, and freeing it takes the GIL.
            _drain_leaves.extend((leaf, out, grad))
            engine.run_backward((out,), (grad,), False, False, (), False, True)  # no result list kept
    except Exception:  # noqa: BLE001 - at exit, a failed drain must not mask the program's own outcome
        pass


def installed():
    """The loaded extension, or None before :func:`install`."""
    return _C


def install(devices: int | None = None):
    """Make ``npu`` a torch device backed by hccl-py's simulated cards (idempotent): the rename,
    the extension, ``.npu()``/``.is_npu``, then what registered :func:`on_install`:
    ``hccl_py/torch/install.py``'s steps (``torch.npu``, the "hccl" backend for npu tensors; any
    import of ``hccl_py.torch`` registers them). The whole of ``import torch_npu`` is
    ``install.install``. ``devices``: the count (default :func:`device_count_from_env`)."""
    global _C
    if _C is not None:
        return _C
    check_torch()
    holder = getattr(torch, "npu", None)
    if holder is not None and not getattr(holder, "__hccl_py__", False):
        raise HcclNotSupportedError(
            f"torch.npu is already provided by {getattr(holder, '__name__', holder)} (the real "
            "torch_npu?); hccl-py's npu device does not replace it",
            holder=str(holder),
            rule="unique",
        )
    conf = env.alloc_conf()
    count = devices if devices is not None else device_count_from_env()
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    ext = build()
    ext.register_hooks()
    ext.set_device_count(count)
    ext.set_device_checks(device_checked_ops())
    # max_split_size_mb is checked, and changes nothing: the pool keeps totals (allocated, reserved
    # in whole segments), not a list of blocks, so there is no block split for it to limit
    for index, card in enumerate(host_cards(count)):
        ext.set_pool(index, card.hbm_bytes, bool(conf.get("expandable_segments", False)))
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    atexit.register(_detach, ext)
    atexit.register(_drain_autograd_workers, ext)  # runs before _detach (atexit is last in, first out)
    torch.version.cann = CANN_VERSION
    _C = ext
    for hook in _hooks:  # install.py's: torch.npu, then the "hccl" backend for npu tensors
        hook(ext)
    ext.set_recording(True)
    return ext


_hooks: list = []


def on_install(hook) -> None:
    """Call ``hook(ext)`` once the device is installed (now, if it is): how ``install.py``, above
    this module, joins the install without this module importing it."""
    _hooks.append(hook)
    if _C is not None:
        hook(_C)


if __name__ == "__main__":  # `python -m hccl_py.torch.device`: build ahead (make install does)
    print(f"hccl-py npu device built: {build().__file__}")
