"""``torch.npu`` on hccl-py's simulated cards (what torch_npu's ``torch.npu`` is on Ascend).

``npu`` is a real torch device here (``hccl_py/torch/device.py``): ``torch.device("npu:1")``,
``.npu()``, ``.to("npu:1")``, ``Module.to(rank)``, autograd, DDP with ``device_ids``. This module
is what ``torch.npu`` then holds:

- cards: ``device_count`` (``hccl-npu --devices N``), ``current_device``, ``set_device`` (int, str
  or device), ``device`` (a context manager), ``is_available``, ``get_device_name`` (the modeled
  card), ``get_device_properties``, ``synchronize`` (joins the card's asynchronous collectives);
- streams and events on the card's **modeled** clock: ``Event(enable_timing=True)``'s
  ``elapsed_time`` is modeled milliseconds (what the program would take on the modeled cluster);
  ``Stream``, ``current_stream``, ``stream``, ``set_stream``;
- memory from the card's HBM pool: ``memory_allocated``, ``memory_reserved``,
  ``max_memory_allocated``, ``memory_stats``, ``mem_get_info``, ``empty_cache``, ...;
- random numbers: ``manual_seed``, ``manual_seed_all``, ``seed``, ``initial_seed``: npu ops draw
  from torch's CPU generator, so a seed gives the same numbers as on the CPU.

``transfer_to_npu`` (``from torch_npu.contrib import transfer_to_npu``, hccl_py/torch/transfer.py)
maps CUDA code onto it: ``torch.cuda`` is this module, "cuda" devices are npu devices, "nccl"
becomes "hccl". Example, under ``hccl-npu --devices 2 python``::

    import torch, torch_npu
    torch.npu.set_device(1)
    x = torch.ones(4, device="npu")       # on npu:1
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time
import types

import torch
import torch.distributed as dist
import torch.overrides
import torch.utils._device

from .. import env, runtime
from ..engine.progress import on_progress_thread
from ..errors import HcclNotSupportedError
from ..modeled.card import stream_handle
from ..modeled.cost_model import cube_flops, host_copy_s
from . import amp  # noqa: F401  (torch.npu.amp, torch_npu.npu.amp)
from . import device as _device_impl
from .work import synchronize as _join_all

_NPU_TYPE = 20  # c10::DeviceType::PrivateUse1, as torch.Stream(device_type=) takes it
__hccl_py__ = True  # marks this torch.npu as hccl-py's (device.install refuses to replace another)
_REAL_CUDA = torch.cuda


# -- the card ---------------------------------------------------------------------------------------
def _ext():
    ext = _device_impl.installed()
    if ext is None:
        raise RuntimeError(
            "hccl-py's npu device is not installed in this process: import torch_npu under hccl-npu, or "
            "call hccl_py.torch.device.install()"
        )
    return ext


def _card():
    comm = runtime.current()
    return None if comm is None else comm.device


def process_card():
    """The simulated card whose modeled clock this process's npu ops and events keep (the world
    its "hccl" group joined), or None while it has none."""
    return _card()


# torch's scalar type names (c10::toString) as numpy's, which the cost model takes.
_NUMPY_NAMES = {
    "Float": "float32",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Double": "float64",
    "Char": "int8",
    "Byte": "uint8",
    "Short": "int16",
    "Int": "int32",
    "Long": "int64",
    "Bool": "bool",
}


# The kernel log's entry is the extension's (csrc/state.h: Kernel, EntryKind): its kinds are read
# from it when the device loads (as_torch_npu); charge_kernels unpacks its ext.ENTRY_FIELDS.
_KERNEL = _SEGMENT = -1  # set from ext.ENTRY_KINDS
_COPY_NAMES: dict[int, str] = {}  # copy kind -> the ACL call the card's timeline names


def charge_kernels() -> None:
    """Charge what ran on npu tensors since the last call to this process's card, in order, in
    modeled time. Torch ops as hccl-py's own device ops are (``Device.run``,
    ``cost_model.kernel_s``): the matmul family by FLOPs in whole cube tiles at the dtype's peak,
    every op by the bytes its tensors move through HBM, plus the launch. A copy between host
    memory and a card (``.to("npu")``, ``.cpu()``, ``copy_``; ``non_blocking`` or not: it runs on
    the card's stream either way) by the card's host route, its PCIe link
    (``cost_model.host_copy_s``). The pool's growth by a device synchronisation (the compute
    stream waits for every asynchronous call issued so far), then ``segment_alloc_s`` for the
    segment. Runs before every collective, event and synchronize; what ran before hccl-py joined
    a job has no card to charge and is dropped."""
    ext = _device_impl.installed()
    if ext is None:
        return
    kernels = ext.drain_kernels()
    comm = runtime.current()
    if comm is None:
        return
    card = comm.device
    for name, m, n, k, batch, nbytes, dtype, kind in kernels:
        if kind == _KERNEL:
            flops = cube_flops(m, n, k, batch) if m else 0.0
            card.run(flops, nbytes, _NUMPY_NAMES.get(dtype), name.removeprefix("aten::"))
        elif kind == _SEGMENT:
            _synchronize_device()
            card.occupy(card.model.segment_alloc_s, name)
        else:
            card.occupy(host_copy_s(comm.topology.host_route(card.rank), nbytes), _COPY_NAMES[kind], moving=True)


def _synchronize_device() -> None:
    """The card synchronised, as the runtime does when the pool grows or gives segments back: the
    compute stream waits (modeled) for every asynchronous call issued so far. A failed call
    raises where its Work is waited for, not here. Not on the progress thread, which completes
    those calls (an npu op it runs as a call ends cannot wait for that call)."""
    if on_progress_thread():
        return
    _join_all(raise_errors=False)


# The card's modeled clock while this process has joined no world (no "hccl" group): HCCL's C API
# advances it by the calls it runs on torch's streams (vLLM's pyhccl over a gloo group), so that
# torch's events time those calls as they time the "hccl" group's.
_unjoined_clock_s = 0.0


def modeled_clock() -> float:
    """This process's card's modeled clock (compute stream, seconds, torch ops charged up to
    now); before a world is joined, what HCCL's C API ran on torch's streams."""
    charge_kernels()
    card = _card()
    return _unjoined_clock_s if card is None else card.clock


def set_modeled_clock(modeled_s: float) -> None:
    """Move this process's card's modeled clock to ``modeled_s`` (a call that ended then)."""
    global _unjoined_clock_s
    card = _card()
    if card is None:
        _unjoined_clock_s = modeled_s
    else:
        card.clock = modeled_s


def _index(device) -> int:
    """A card index from an int, "npu:N"/"npu", a torch.device or None (the current card; so is a
    negative int, as torch.cuda's -1); past the host's cards, torch_npu's "Invalid device id"."""
    if device is None:
        return current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        if isinstance(device, str):
            device = torch.device(device)
        if not isinstance(device, torch.device):
            raise TypeError(f"Invalid device, expected int, str or torch.device, got {type(device).__name__}")
        device = _cuda_as_npu(device)
        if device.type != "npu":
            raise ValueError(f"Expected an npu device, but got: {device}")
        index = current_device() if device.index is None else device.index
    if index < 0:
        return current_device()
    count = device_count()
    if index >= count:
        shown = f"npu:0 to npu:{count - 1}" if count else "none"
        raise RuntimeError(
            f"Invalid device id: npu:{index} (this host shows {count} NPUs: {shown}; hccl-npu --devices N sets how many)"
        )
    return index


def _cuda_as_npu(device: torch.device) -> torch.device:
    """A cuda device as the npu one once transfer_to_npu made ``torch.cuda`` this module (a device
    made before it, or by code that holds torch's own class), else ``device``."""
    if device.type == "cuda" and torch.cuda is sys.modules[__name__]:
        return torch.device("npu", device.index) if device.index is not None else torch.device("npu")
    return device


def _get_device_index(device, optional: bool = False, allow_cpu: bool = False) -> int:
    """torch's device-module hook (``torch.npu._utils._get_device_index``, which ``torch.load``'s
    ``map_location`` and DataParallel-style helpers call): the card index of an int, "npu[:N]" or
    an npu torch.device; with ``optional``, an index-less device or None is the current card."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        device = _cuda_as_npu(device)
    if isinstance(device, torch.device) and device.type != "npu" and not (allow_cpu and device.type == "cpu"):
        raise ValueError(f"Expected an npu device, but got: {device}")
    if device is None or (isinstance(device, torch.device) and device.type == "npu" and device.index is None):
        if not optional:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got: {device}")
        return current_device()
    return torch._utils._get_device_index(device, optional, allow_cpu)


# What torch looks up on a device module as ``torch.<device>._utils``.
_utils = types.SimpleNamespace(_get_device_index=_get_device_index)


def set_device(device) -> None:
    """Make card ``device`` (int, "npu:N" or torch.device) this thread's current card."""
    _lazy_init()
    _ext().set_device(_index(device))


def current_device() -> int:
    """This thread's current card (0 until :func:`set_device`)."""
    _lazy_init()
    return _ext().current_device()


def device_count() -> int:
    """Cards this host shows (``hccl-npu --devices N``; else LOCAL_WORLD_SIZE, else 1)."""
    return _ext().device_count()


def is_available() -> bool:
    """True when the host shows at least one card."""
    return _device_impl.installed() is not None and device_count() > 0


# Whether the process has used the cards yet, as torch.cuda's and torch_npu's lazy initialisation
# says: False until the first npu tensor (torch calls _lazy_init), set_device, current_device,
# synchronize, a stream or an event. torch reads it: DeviceMesh sets the card from LOCAL_RANK only
# on a device not yet initialised (FSDP2 and tensor-parallel scripts that never call set_device).
_initialized = False


def is_initialized() -> bool:
    """Whether this process has used the cards yet (see :func:`_lazy_init`)."""
    return _initialized and _device_impl.installed() is not None


def init() -> None:
    """Initialise the cards now (as ``torch.cuda.init``)."""
    _lazy_init()


def _lazy_init() -> None:
    """torch's lazy initialisation hook (called before the first npu tensor is made): marks the
    cards initialised; the device itself was set up when installed."""
    global _initialized
    _ext()
    _initialized = True


def _is_in_bad_fork() -> bool:
    """False: the simulated card survives a fork (its memory is the host's)."""
    return False


def synchronize(device=None) -> None:
    """Wait for every asynchronous collective not waited for yet: the card's streams joined (and
    the torch ops run so far charged to the card)."""
    _lazy_init()
    charge_kernels()
    _join_all()


# What torch_npu reports for each modeled card (npu-smi's chip names). Estimate for the 910B: the
# bin is not modeled; 910B3 is the bin of the public two-server sweep the fidelity table holds.
_PRODUCT_NAMES = {"ascend910": "Ascend910A", "ascend910b": "Ascend910B3", "ascend310p": "Ascend310P3"}


def get_device_name(device=None) -> str:
    """The modeled card's chip name as torch_npu reports it (e.g. "Ascend910B3" for ascend910b)."""
    card = _card()
    model = card.model.name if card is not None else _device_impl.host_cards(device_count())[_index(device)].name
    return _PRODUCT_NAMES.get(model, model)


def get_device_properties(device=None):
    """``name``, ``total_memory`` (the card's HBM bytes), ``cube_core_num``, ``vector_core_num``."""
    index = _index(device)
    stats = memory_stats(index)
    return types.SimpleNamespace(
        name=get_device_name(index),
        total_memory=stats["limit_bytes"],
        cube_core_num=0,
        vector_core_num=0,
        L2_cache_size=0,
    )


# torch_npu.npu.config: ``allow_internal_format`` lets ops keep internal formats (FRACTAL_NZ, ...);
# formats are metadata here, so it changes no result.
config = types.SimpleNamespace(allow_internal_format=False)


def is_bf16_supported() -> bool:
    """True: hccl-py carries bfloat16 (as Ascend 910B does)."""
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The lower precisions ``torch.autocast("npu")`` (and ``torch.npu.amp.autocast``) takes:
    float16, and bfloat16 where :func:`is_bf16_supported`."""
    return [torch.float16, torch.bfloat16] if is_bf16_supported() else [torch.float16]


# -- random numbers: npu kernels are the CPU's, and so is their generator -----------------------------
def manual_seed(seed: int) -> None:
    """Seed the generator npu ops draw from (torch's CPU generator); also ``manual_seed_all``."""
    torch.default_generator.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    """Seed the generator from a non-deterministic source (also ``seed_all``)."""
    torch.default_generator.seed()


seed_all = seed


def initial_seed() -> int:
    """The seed the generator was last given."""
    return torch.default_generator.initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    """The generator's state (torch's CPU generator's)."""
    return torch.default_generator.get_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    """Restore the generator's state."""
    torch.default_generator.set_state(state)


def get_rng_state_all() -> list[torch.Tensor]:
    """The generator's state, once per card (they share torch's CPU generator)."""
    return [get_rng_state()]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    """Restore the generator's state (the first of ``states``: the cards share one generator)."""
    set_rng_state(states[0])


# DTensor's random ops (``init.normal_`` on a fully_shard parameter, ``distribute_tensor`` of
# ``torch.rand``): on a CUDA-like mesh torch's OffsetBasedRNGTracker gives each shard its own
# stretch of a counter-based (Philox) generator by moving the generator's 16-byte (seed, offset)
# state. The npu's generator is the CPU's (mt19937: no offset to move), so on an npu mesh DTensor
# runs random ops as on a CPU mesh, each rank drawing its local shard from the generator; its
# ``random.manual_seed(seed, mesh)`` seeds that generator, as it does on a CUDA-like mesh.
_DTENSOR_RANDOM = "torch.distributed.tensor._random"


def _dtensor_random_as_on_cpu(module: types.ModuleType) -> None:
    """Make DTensor's random module treat an npu mesh as it treats a CPU mesh (see above)."""
    if getattr(module.is_rng_supported_mesh, "__hccl_py__", False):
        return
    supported, seed = module.is_rng_supported_mesh, module.manual_seed

    @functools.wraps(supported)
    def is_rng_supported_mesh(device_mesh) -> bool:
        if device_mesh.device_type == "npu":
            return False  # no warning: the local draws are this device's documented behaviour
        return supported(device_mesh)

    @functools.wraps(seed)
    def manual_seed(seed_value: int, device_mesh) -> None:
        if device_mesh.device_type != "npu":
            return seed(seed_value, device_mesh)
        if device_mesh.get_coordinate() is None:
            raise RuntimeError("manual_seed requires the current rank to be a part of the device mesh")
        torch.manual_seed(seed_value)

    is_rng_supported_mesh.__hccl_py__ = True
    module.is_rng_supported_mesh, module.manual_seed = is_rng_supported_mesh, manual_seed


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` once, right after the module ``name`` is first imported (so modules
    that import names from it see the patched ones), without importing it ahead of need."""

    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run, patch = spec.loader.exec_module, self.patch

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def patch_when_imported(name: str, patch) -> None:
    """``patch(module)`` now if ``name`` is imported, else right after its first import."""
    if name in sys.modules:
        patch(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, patch))


# -- memory: the card's HBM pool ------------------------------------------------------------------------
def memory_stats(device=None) -> dict:
    """The pool's counters (torch's names: ``allocated_bytes.all.current``, ``reserved_bytes.all.peak``,
    ``num_ooms``, ...), plus ``limit_bytes``: the card's HBM."""
    return collections.OrderedDict(sorted(_ext().memory_stats(_index(device)).items()))


def memory_allocated(device=None) -> int:
    """Bytes held by live npu tensors on the card (512-byte aligned blocks)."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    """The peak of :func:`memory_allocated` since the start or the last reset."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    """Bytes the pool holds on the card (whole segments; bookkeeping, host memory backs live tensors only)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    """The peak of :func:`memory_reserved`."""
    return memory_stats(device)["reserved_bytes.all.peak"]


memory_cached, max_memory_cached = memory_reserved, max_memory_reserved


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the card's HBM: total less what the pool reserved."""
    stats = memory_stats(device)
    return (stats["limit_bytes"] - stats["reserved_bytes.all.current"], stats["limit_bytes"])


def empty_cache() -> None:
    """Give the pool's unused segments back (reserved shrinks to the segments in use). As torch_npu's
    caching allocator, it synchronises the card first (the compute stream waits for every
    asynchronous call issued so far, modeled)."""
    ext = _ext()
    charge_kernels()
    if _card() is not None:
        _synchronize_device()
    for index in range(ext.device_count()):
        ext.empty_cache(index)


def reset_peak_memory_stats(device=None) -> None:
    """Peaks start again from the current values (also ``reset_max_memory_allocated``/``_cached``)."""
    _ext().reset_peak(_index(device))


reset_max_memory_allocated = reset_max_memory_cached = reset_peak_memory_stats


# -- streams and events ----------------------------------------------------------------------------------
class _EventType(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "npu"


class Event(torch.Event, metaclass=_EventType):
    """An event on the card: ``record()`` stamps the card's modeled clock and ``elapsed_time(end)``
    is the modeled milliseconds between two stamps (what the program would take on the modeled
    cluster, not the wall time of this emulation). It is a ``torch.Event`` of the current card
    (FSDP2 passes ``torch.npu.Event()`` to ``stream.wait_event``); ``isinstance(e, torch.npu.Event)``
    holds for any npu event. ``npu_event`` is its aclrtEvent for C, as torch_npu's (0 until its first
    record): HCCL's C API (hccl-py's libhccl.so) reads and records the same stamp::

        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record(); y = x @ x; end.record(); start.elapsed_time(end)   # modeled ms
        lib.aclrtEventElapsedTime(ctypes.byref(ms), start.npu_event, end.npu_event)  # the same
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        event = super().__new__(
            cls,
            device=torch.device("npu", current_device()),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )
        event.enable_timing = enable_timing
        return event

    @property
    def npu_event(self) -> int:
        """The event's aclrtEvent (an integer; 0 before its first record), as torch_npu's."""
        return self.event_id

    @property
    def _as_parameter_(self) -> ctypes.c_void_p:  # ctypes passes an Event where an aclrtEvent goes
        return ctypes.c_void_p(self.npu_event)

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Modeled milliseconds from this event's record to ``end_event``'s (torch's own method takes
        only a plain ``torch.Event`` as ``end_event``)."""
        if type(end_event) is torch.Event:
            return super().elapsed_time(end_event)
        if not isinstance(end_event, torch.Event):
            raise TypeError(f"expected end_event to be a torch.Event, got {type(end_event).__name__}")
        if not (self.enable_timing and getattr(end_event, "enable_timing", True)):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        start, end = _ext().event_stamp(self.event_id), _ext().event_stamp(end_event.event_id)
        if start is None or end is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end[1] - start[1]) * 1e3


class Stream(torch.Stream):
    """A stream of the card: calls issued on it run in order (work finishes when its call returns).
    ``npu_stream`` is its aclrtStream for C, as torch_npu's: a ctypes client passes it to HCCL's C
    API (hccl-py's libhccl.so), which runs the call on this stream's card and modeled clock::

        lib.HcclAllReduce(src, dst, n, dtype, op, comm, ctypes.c_void_p(torch.npu.current_stream().npu_stream))
    """

    @classmethod
    def of(cls, stream: torch.Stream) -> "Stream":
        """``stream`` (torch's own type) as this class: the same stream, with ``npu_stream``."""
        if isinstance(stream, cls):
            return stream
        return torch.Stream.__new__(
            cls, stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
        )

    @property
    def npu_stream(self) -> int:
        """The stream's aclrtStream (an integer), as torch_npu's ``Stream.npu_stream``."""
        return stream_handle(self.device_index, self.stream_id)

    @property
    def _as_parameter_(self) -> ctypes.c_void_p:  # ctypes passes a Stream where an aclrtStream goes
        return ctypes.c_void_p(self.npu_stream)

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        _lazy_init()
        # As torch.cuda.Stream (and torch_npu's): made inside ``with device(d)``, where a negative
        # index changes nothing and what is not an index, a name or a device (a float) means the
        # current card: the stream is on the current card.
        if isinstance(device, float) or (isinstance(device, int) and device < 0):
            device = None
        return super().__new__(cls, device=torch.device("npu", _index(device)), priority=priority)


def current_stream(device=None) -> torch.Stream:
    """This thread's current stream on the card (also ``default_stream``: the card's stream 0)."""
    return Stream.of(torch.accelerator.current_stream(torch.device("npu", _index(device))))


def default_stream(device=None) -> torch.Stream:
    """The card's default stream (stream 0)."""
    index = _index(device)
    return Stream.of(torch.Stream(stream_id=0, device_index=index, device_type=_NPU_TYPE))


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` this thread's current stream on its card."""
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(s=None):
    """``with torch.npu.stream(s):`` issues the block on ``s`` (None: as it is)."""
    if s is None:
        yield s
        return
    previous = current_stream(s.device)
    set_stream(s)
    try:
        yield s
    finally:
        set_stream(previous)


class device:  # noqa: N801  (torch.npu.device, a context manager)
    """``with torch.npu.device(i):`` makes card ``i`` the current card for the block."""

    def __init__(self, device):
        self.index = _index(device)

    def __enter__(self):
        self._previous = current_device()
        set_device(self.index)
        return self

    def __exit__(self, *exc):
        set_device(self._previous)


def __getattr__(name: str):
    if torch.cuda is sys.modules[__name__] and hasattr(
        _REAL_CUDA, name
    ):  # transfer_to_npu made torch.cuda this module: torch's own uses of it still work
        return getattr(_REAL_CUDA, name)
    raise AttributeError(f"torch.npu.{name} is not part of hccl-py's torch.npu (see docs/torch.md for what it covers)")


# -- install: torch_npu's import (the list, in order: hccl_py/torch/install.py) -------------------------
def as_torch_npu(ext) -> None:
    """``torch.npu`` is this module, the card's clock and kernel charging the extension's."""
    global _KERNEL, _SEGMENT
    kinds = ext.ENTRY_KINDS
    _KERNEL, _SEGMENT = kinds["kernel"], kinds["segment"]
    _COPY_NAMES.update({kinds["host_to_device"]: "aclrtMemcpy H2D", kinds["device_to_host"]: "aclrtMemcpy D2H"})
    torch._register_device_module("npu", sys.modules[__name__])
    ext.set_clock(modeled_clock)
    ext.set_flush(charge_kernels)


def patch_distributed() -> None:
    """What torch_npu changes in torch.distributed and at exit (idempotent): ``is_hccl_available``,
    DTensor's random ops as on the CPU, ``init_process_group`` refused in a process a rank of
    ``hccl-launch --npu`` spawned, and the exit handler that waits for shared tensors."""
    dist.is_hccl_available = lambda: True
    patch_when_imported(_DTENSOR_RANDOM, _dtensor_random_as_on_cpu)
    if _under_hccl_launch() and not getattr(dist.init_process_group, "__hccl_py_refused__", False):
        dist.init_process_group = _refuse_nested_ranks(dist.init_process_group)
    global _shutdown_registered
    if not _shutdown_registered:
        import multiprocessing.util

        # A multiprocessing finalizer, not atexit: a spawned child runs these when its target
        # returns, and this one must run before the one (priority 0) that removes the sharer's socket.
        multiprocessing.util.Finalize(None, _npu_shutdown, exitpriority=1)
        _shutdown_registered = True


_shutdown_registered = False
SHARED_FETCH_WAIT_S = 5.0  # the longest an exiting process waits for its shared tensors to be fetched


def _npu_shutdown() -> None:
    """At exit, as torch_npu's exit handler (``_npu_shutdown``) on an Ascend server: a process does
    not end while another may still fetch a tensor it put on a ``multiprocessing`` queue. Why: a CPU
    tensor on a queue is passed as a file descriptor that the receiver fetches from the sender's
    ``multiprocessing.resource_sharer``; a sender that already exited refuses it ("Connection reset
    by peer"). On an Ascend server the exit handler (synchronise the cards, release the HCCL
    communicators, finalise ACL) keeps the sender alive long enough, and Ascend's own tests rely on
    it (test_send_recv.py's ``*_with_format``); here the process waits, at most
    ``SHARED_FETCH_WAIT_S``, until every descriptor it shares has been fetched."""
    deadline = time.monotonic() + SHARED_FETCH_WAIT_S
    # A queue's feeder thread pickles what was put (sharing its descriptors) after put() returned;
    # the queues are closed by now (priority 10), so each feeder ends once it has written everything.
    for thread in threading.enumerate():
        if thread.name == "QueueFeederThread" and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
    sharer = sys.modules.get("multiprocessing.resource_sharer")
    pending = getattr(getattr(sharer, "_resource_sharer", None), "_cache", None)
    while pending and time.monotonic() < deadline:
        time.sleep(0.005)


def _under_hccl_launch() -> bool:
    """A rank of ``hccl-launch --npu``, or a process it started (not a host made by hccl-npu)."""
    return os.environ.get(env.STORE_HOSTED) == "1" and not os.environ.get(env.HCCL_PY_NPU_DEVICES)


def _refuse_nested_ranks(fn):
    """``init_process_group`` that refuses in a process a rank started with multiprocessing
    (mp.spawn): the launcher already started one process per card, so the script's own ranks would
    fan out N x N (asked at call time: a spawned child learns its parent after its imports)."""
    import multiprocessing

    @functools.wraps(fn)
    def refuse(*args, **kwargs):
        if multiprocessing.parent_process() is None:
            return fn(*args, **kwargs)
        raise HcclNotSupportedError(
            "init_process_group in a process a rank of hccl-launch --npu spawned: hccl-launch already started one "
            "process per card, and a script that starts its own ranks (mp.spawn over torch.npu.device_count()) "
            "would start N x N. Run it as one host with N cards instead: hccl-npu --devices N python SCRIPT",
            rule="launcher",
            expected="hccl-npu",
        )

    refuse.__hccl_py_refused__ = True
    return refuse
