"""A stand-in for ``torch.npu`` (torch_npu, Huawei's Ascend extension) on CPU tensors.

``hccl-launch --npu`` puts a ``torch_npu`` package first on the path of that run only
(``hccl_py/torch/standin/``; never installed as a top-level package). Its import calls
:func:`install`, and ``torch_npu.contrib.transfer_to_npu`` calls :func:`transfer_to_npu`, so a
script written for Ascend runs unchanged:

- ``torch.npu``: ``set_device``, ``current_device``, ``device_count`` (LOCAL_WORLD_SIZE),
  ``is_available``, ``synchronize`` (waits for every asynchronous collective: the card's streams
  joined), ``Event(enable_timing=True)`` whose ``elapsed_time`` is the card's **modeled** time
  between its two ``record()`` calls (hccl-py's clock of this rank's card), ``Stream``,
  ``current_stream``, ``stream``, ``device``, ``get_device_name`` (the modeled card),
  ``get_device_properties``, ``manual_seed``, ``is_bf16_supported``, the ``memory_*`` family (0);
- ``tensor.npu()``, ``module.npu()``, ``tensor.is_npu``: tensors stay on the CPU ("npu" is not made a
  real torch device: torch cannot allocate on a device without a C++ allocator, and a renamed
  private-use device breaks ``dist.barrier()``);
- ``transfer_to_npu``: ``torch.cuda`` becomes this module; ``"cuda"``/``"npu"`` device arguments of
  torch's factory functions, ``Tensor.to``/``new_*``, ``Module.to`` become ``"cpu"``;
  ``.cuda()`` is ``.npu()``; ``"nccl"`` in ``init_process_group``/``new_group`` becomes ``"hccl"``.

Not covered (docs/torch.md): ``torch.device("npu")`` objects, NPU kernels and their modeled cost
(torch's CPU ops cost no modeled time), streams as separate queues (one compute stream), memory
statistics, AMP/profiler/graph modes, torch_npu's custom operators.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

from .. import env, runtime
from . import backend  # noqa: F401  (registers "hccl")
from .work import synchronize as _join_all

STANDIN = Path(__file__).resolve().parent / "standin"  # holds the stand-in torch_npu package
_REAL_CUDA = torch.cuda
_current = 0


# -- the card ---------------------------------------------------------------------------------------
def _device():
    comm = runtime.current()
    return None if comm is None else comm.device


def _clock() -> float:
    """This rank's modeled clock (compute stream), 0 before hccl-py is initialised."""
    card = _device()
    return 0.0 if card is None else card.clock


def set_device(device) -> None:
    """Choose this process's card (kept for current_device(); one card per process anyway)."""
    global _current
    _current = _index(device)


def current_device() -> int:
    """The card index last given to :func:`set_device` (0 before)."""
    return _current


def device_count() -> int:
    """Cards this host shows: LOCAL_WORLD_SIZE (hccl-launch and torchrun set it), else 1."""
    try:
        return int(os.environ.get(env.LOCAL_WORLD_SIZE) or 1)
    except ValueError:
        return 1


def is_available() -> bool:
    """True: the stand-in's card is always there."""
    return True


def is_initialized() -> bool:
    """True: there is nothing to initialise."""
    return True


def init() -> None:
    """Nothing to do (torch.npu.init() initialises the real runtime)."""


def synchronize(device=None) -> None:
    """Wait for every asynchronous collective not waited for yet: the card's streams joined."""
    _join_all()


def get_device_name(device=None) -> str:
    """The modeled card's model name, marked as the hccl-py stand-in."""
    card = _device()
    return f"{card.model.name} (hccl-py stand-in)" if card is not None else "Ascend (hccl-py stand-in)"


def get_device_properties(device=None):
    """``name``, ``total_memory`` (the modeled card's HBM bytes) and ``multi_processor_count`` (0)."""
    card = _device()
    memory = card.model.hbm_bytes if card is not None else 0
    return types.SimpleNamespace(name=get_device_name(device), total_memory=memory, multi_processor_count=0)


def get_device_capability(device=None) -> tuple[int, int]:
    """(0, 0): the stand-in has no compute capability to report."""
    return (0, 0)


def is_bf16_supported() -> bool:
    """True: hccl-py carries bfloat16 (as Ascend 910B does)."""
    return True


def manual_seed(seed: int) -> None:
    """Seed torch's CPU generator (the card's tensors live on the CPU); also ``manual_seed_all``."""
    torch.manual_seed(seed)


manual_seed_all = manual_seed


def seed() -> None:
    """Nothing to do: the CPU generator is torch's own (also ``seed_all``)."""


seed_all = seed


def _zero(device=None) -> int:
    """0: the stand-in keeps no memory statistics (``memory_allocated`` and the rest of that family)."""
    return 0


memory_allocated = max_memory_allocated = memory_reserved = max_memory_reserved = _zero


def empty_cache() -> None:
    """Nothing to do: there is no device cache."""


def reset_peak_memory_stats(device=None) -> None:
    """Nothing to do: there are no memory statistics (also ``reset_max_memory_*``)."""


reset_max_memory_allocated = reset_max_memory_cached = reset_peak_memory_stats


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the modeled card's HBM, as hccl-py's simulated device counts them."""
    card = _device()
    total = card.model.hbm_bytes if card is not None else 0
    return (total - (card.used_bytes if card is not None else 0), total)


def _index(device) -> int:
    if device is None:
        return _current
    if isinstance(device, int):
        return device
    text = str(device)
    return int(text.rsplit(":", 1)[1]) if ":" in text else _current


# -- events and streams ----------------------------------------------------------------------------------
class Event:
    """An event on the card's compute stream: ``record()`` stamps its modeled clock, and
    ``elapsed_time(end)`` is the modeled milliseconds between two stamps (what the same program
    would take on the modeled cluster, not the wall time of this emulation)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._stamp: float | None = None

    def record(self, stream=None) -> None:
        """Stamp the card's modeled clock now."""
        self._stamp = _clock()

    def query(self) -> bool:
        """True: a recorded stamp is final at once (collectives return when done)."""
        return True

    def synchronize(self) -> None:
        """Nothing to wait for: the stamp was taken when ``record()`` ran."""

    def wait(self, stream=None) -> None:
        """Nothing to do: there is one stream."""

    def elapsed_time(self, end: "Event") -> float:
        """Modeled milliseconds from this event's stamp to ``end``'s (both timing, both recorded)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with enable_timing=True to measure elapsed time")
        if self._stamp is None or end._stamp is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        return (end._stamp - self._stamp) * 1e3

    def __repr__(self) -> str:
        return f"<torch.npu.Event (hccl-py stand-in) at modeled {self._stamp!r} s>"


class Stream:
    """The card's one compute stream: calls run in order on it."""

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = device

    def synchronize(self) -> None:
        """Wait for every asynchronous collective, as :func:`synchronize`."""
        synchronize()

    def query(self) -> bool:
        """True: work on the stream is done when its call returns."""
        return True

    def wait_stream(self, stream) -> None:
        """Nothing to do: there is one stream."""

    def wait_event(self, event) -> None:
        """Nothing to do: there is one stream."""

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) on the card's clock and return it."""
        event = event if event is not None else Event()
        event.record(self)
        return event


_STREAM = Stream()


def current_stream(device=None) -> Stream:
    """The card's one stream (also ``default_stream``)."""
    return _STREAM


default_stream = current_stream


@contextlib.contextmanager
def stream(s=None):
    """``with torch.npu.stream(s):`` runs the block as it is: there is one stream."""
    yield s


class device:  # noqa: N801  (torch.npu.device, a context manager)
    """``with torch.npu.device(i):`` makes card ``i`` the current device for the block."""

    def __init__(self, device):
        self.index = _index(device)

    def __enter__(self):
        global _current
        self._previous, _current = _current, self.index
        return self

    def __exit__(self, *exc):
        global _current
        _current = self._previous


def __getattr__(name: str):
    if _patched and hasattr(_REAL_CUDA, name):  # torch.cuda is this module now: torch's own uses of it still work
        return getattr(_REAL_CUDA, name)
    raise AttributeError(f"torch.npu.{name} is not part of hccl-py's torch.npu stand-in (see docs/torch.md for what it "
                         "covers)")


# -- install: torch_npu's import ------------------------------------------------------------------------
def _npu(self, device=None, non_blocking: bool = False, **kwargs):
    """tensor.npu() / module.npu(): stays on the CPU (the emulated card's memory)."""
    return self


def install() -> types.ModuleType:
    """What ``import torch_npu`` does here: ``torch.npu`` is this module, tensors and modules
    get ``.npu()`` and ``is_npu``, the "hccl" backend is registered."""
    module = sys.modules[__name__]
    if getattr(torch, "npu", None) is not module:
        torch.npu = module
        sys.modules["torch.npu"] = module
        torch.Tensor.npu = _npu
        torch.Tensor.is_npu = property(lambda self: self.device.type == "cpu")
        torch.nn.Module.npu = _npu
        dist.is_hccl_available = lambda: True
    return module


# -- transfer_to_npu ----------------------------------------------------------------------------------------
_FACTORIES = ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "linspace",
              "logspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
              "randint_like", "randperm", "range", "normal", "empty_strided", "scalar_tensor", "tril_indices",
              "triu_indices", "frombuffer", "load", "hann_window", "hamming_window", "bartlett_window",
              "blackman_window", "kaiser_window")
_TENSOR_METHODS = ("to", "new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros")
_DEVICE_KWARGS = ("device", "device_type", "map_location", "device_id")


def _is_accelerator(value) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value.split(":", 1)[0].strip() in ("cuda", "npu")
    return False


def _cpu(value):
    return torch.device("cpu") if isinstance(value, torch.device) else "cpu"


def _on_cpu(fn, positional: bool = True):
    """``fn`` with 'cuda'/'npu' device arguments (keywords, and positional strings or devices)
    made 'cpu'."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for name in _DEVICE_KWARGS:
            if name in kwargs and _is_accelerator(kwargs[name]):
                kwargs[name] = _cpu(kwargs[name])
        if positional and any(_is_accelerator(a) for a in args):
            args = tuple(_cpu(a) if _is_accelerator(a) else a for a in args)
        return fn(*args, **kwargs)

    wrapper.__hccl_py_standin__ = True
    return wrapper


def _to_hccl(name):
    return name.replace("nccl", "hccl") if isinstance(name, str) else name


def _nccl_to_hccl(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _to_hccl(kwargs["backend"])
        args = tuple(_to_hccl(a) if isinstance(a, str) and "nccl" in a else a for a in args)
        return fn(*args, **kwargs)

    wrapper.__hccl_py_standin__ = True
    return wrapper


def _tensor_to(self, *args, **kwargs):
    if args and isinstance(args[0], int) and not isinstance(args[0], bool):  # .to(0): card 0
        args = ("cpu", *args[1:])
    return _ORIGINAL_TO(self, *args, **kwargs)


_ORIGINAL_TO = torch.Tensor.to
_patched = False


def transfer_to_npu() -> None:
    """What ``from torch_npu.contrib import transfer_to_npu`` does here (see the module doc)."""
    global _patched
    install()
    if _patched:
        return
    _patched = True
    module = sys.modules[__name__]
    torch.cuda = module
    for name in _FACTORIES:
        if hasattr(torch, name):
            setattr(torch, name, _on_cpu(getattr(torch, name)))
    torch.Tensor.to = _on_cpu(_tensor_to)
    for name in _TENSOR_METHODS[1:]:
        setattr(torch.Tensor, name, _on_cpu(getattr(torch.Tensor, name)))
    torch.Tensor.cuda = _npu
    torch.nn.Module.cuda = _npu
    torch.nn.Module.to = _on_cpu(torch.nn.Module.to)
    torch.nn.Module.to_empty = _on_cpu(torch.nn.Module.to_empty)
    dist.init_process_group = _nccl_to_hccl(dist.init_process_group)
    dist.new_group = _nccl_to_hccl(dist.new_group)
    dist.is_nccl_available = lambda: True
