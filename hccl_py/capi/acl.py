"""AscendCL's runtime on hccl-py's simulated cards: devices, memory, streams and events, on the
modeled clock.

A card is one device of this host (``aclrtGetDeviceCount`` is ``hccl-npu --devices``); its HBM is
the card model's (``aclrtMalloc`` past it: ``ACL_ERROR_RT_MEMORY_ALLOCATION``), its memory host
memory the C program may read (a device pointer is a real address). Work runs when it is issued,
in the calling thread, and each stream keeps a modeled clock: a copy advances its stream by what
the copy would take on the card (PCIe to and from the host, twice over HBM on the card), a
collective by its modeled time, and an event records its stream's clock, so
``aclrtEventElapsedTime`` returns modeled milliseconds. Synchronising has nothing left to wait for.
The current device is per thread (``aclrtSetDevice``), as in AscendCL::

    aclrtSetDevice(0); aclrtMalloc(&buf, n, ACL_MEM_MALLOC_HUGE_FIRST);
    aclrtRecordEvent(start, stream); HcclAllReduce(..., stream); aclrtRecordEvent(end, stream);
    aclrtEventElapsedTime(&ms, start, end);     // the modeled time of the allreduce
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from ..engine.context import device_count_from_env, load_topology
from ..job import read_job
from ..modeled.card import ALIGNMENT, Device, Stream
from ..modeled.cost_model import host_copy_s
from . import abi, torch_bridge
from .abi import ACL, AclError, c_function, require, write

# aclrtMemcpyKind
H2H, H2D, D2H, D2D, DEFAULT = 0, 1, 2, 3, 4
_KINDS = {0: "host to host", 1: "host to device", 2: "device to host", 3: "device to device", 4: "default"}
_INNER_D2D, _INTER_D2D = 6, 7  # kinds 6 and 7 copy device to device, inside a card and between cards
_POLICY_BITS = 0x7 | 0x0100 | 0x1000 | 0x100000  # the malloc policies 0..7 and the OR-able flags
ACL_HOST_MODE = 1  # aclrtRunMode: the program runs on the host, as on a server with PCIe cards
EVENT_COMPLETE, EVENT_NOT_READY = 0, 1  # aclrtEventStatus
RECORDED_NOT_READY, RECORDED_COMPLETE = 0, 1  # aclrtEventRecordedStatus: the other order
VERSION = (9, 2, 0)  # aclrtGetVersion: the CANN of hicann's open-source runtime (torch.version.cann says the same)
SOC_NAMES = {"ascend910b": "Ascend910B3", "ascend910": "Ascend910A", "ascend310p": "Ascend310P3"}


@dataclass(eq=False)
class Block:
    """One ``aclrtMalloc`` (or ``aclrtMallocHost``) allocation: ``nbytes`` at ``address``."""

    address: int
    nbytes: int
    card: "Card | None"  # None: host memory
    memory: np.ndarray  # keeps the bytes alive
    ledger: int = 0  # the card's HBM booking (Device.malloc's handle)
    owner: object = None  # in a process hosting the npu device: the npu tensor whose bytes these are


@dataclass(eq=False)
class AclStream:
    """A stream: work in issue order on one card, and its modeled clock (``clock``)."""

    handle: int
    card: "Card"
    clock: Stream = field(default_factory=lambda: Stream("acl"))

    def run(self, seconds: float) -> None:
        """Work of ``seconds`` (modeled) joins the stream after what is on it."""
        self.clock.clock += seconds


@dataclass(eq=False)
class AclEvent:
    """An event: the modeled clock of the stream it was last recorded on (None: never recorded)."""

    handle: int
    card: "Card"
    stamp: float | None = None


class Card:
    """One device of this host: its model and place on the modeled cluster, its HBM ledger, its
    default stream."""

    def __init__(self, index: int, topology):
        self.index = index
        self.topology = topology
        self.topology_rank = index % topology.num_ranks
        self.model = topology.card(self.topology_rank)
        self.hbm = Device(self.model, index)  # the ledger: capacity, use, peak
        self.default_stream = AclStream(0, self)

    def copy_s(self, kind: int, nbytes: int) -> float:
        """Modeled seconds of a copy of ``kind`` on this card: PCIe to or from the host, twice
        over HBM on the card, nothing for host to host."""
        if kind in (H2D, D2H):
            return host_copy_s(self.topology.host_route(self.topology_rank), nbytes)
        if kind in (D2D, _INNER_D2D, _INTER_D2D):
            return 2 * nbytes / self.model.hbm_bandwidth_Bps
        return 0.0


class Runtime:
    """This process's AscendCL state: cards, each thread's current device, memory, streams, events."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.initialized = False
        self.finalized = False
        self._count: int | None = None
        self._topology = None
        self.cards: dict[int, Card] = {}
        self.current: dict[int, int] = {}  # thread ident -> device
        self.blocks: dict[int, Block] = {}  # address -> block
        self._starts: list[int] = []  # sorted block addresses
        self.streams: dict[int, AclStream] = {}
        self.events: dict[int, AclEvent] = {}
        self._handles = itertools.count(0x4C000010, 0x10)  # stream/event/context handles: non-NULL, aligned
        self.last_error: dict[int, str] = {}  # thread ident -> aclGetRecentErrMsg

    # -- devices ----------------------------------------------------------------------------------------
    def device_count(self) -> int:
        """Cards this host shows (``hccl-npu --devices``)."""
        if self._count is None:
            self._count = device_count_from_env()
        return self._count

    def card(self, index: int) -> Card:
        """Card ``index``, made at its first use; ``ACL_ERROR_RT_INVALID_DEVICEID`` past the count."""
        if isinstance(index, bool) or not 0 <= index < self.device_count():
            raise AclError(
                abi.ACL_ERROR_RT_INVALID_DEVICEID,
                f"device id {index} is not a device of this host (0..{self.device_count() - 1}; hccl-npu --devices)",
            )
        with self.lock:
            card = self.cards.get(index)
            if card is None:
                card = self.cards[index] = Card(index, self.topology())
            return card

    def topology(self):
        """The modeled cluster the cards sit on (HCCL_PY_TOPOLOGY, RANK_TABLE_FILE, else the preset
        for this host's cards)."""
        if self._topology is None:
            job = read_job(settings_environ())
            named = job.topology or job.rank_table  # then its own cards: a host's 8 of 2x8p-roce's 16
            self._topology = load_topology(
                None if named else self.device_count(),
                preset=job.topology,
                rank_table=job.rank_table,
                figures=job.figures,
            )
        return self._topology

    def current_card(self) -> Card:
        """The calling thread's device (``aclrtSetDevice``, else torch's current npu card in a
        process hosting the npu device); ``ACL_ERROR_RT_CONTEXT_NULL`` before one."""
        index = self.current.get(threading.get_ident())
        if index is None:
            index = torch_bridge.current_device()
        if index is None:
            raise AclError(abi.ACL_ERROR_RT_CONTEXT_NULL, "no device is set on this thread: call aclrtSetDevice first")
        return self.card(index)

    # -- memory -----------------------------------------------------------------------------------------
    def allocate(self, card: Card | None, nbytes: int) -> Block:
        """A zeroed, 512-byte aligned block of ``nbytes`` (``card``'s HBM, or the host's)."""
        if nbytes <= 0:
            raise AclError(abi.ACL_ERROR_INVALID_PARAM, f"cannot allocate {nbytes} bytes: give a size above 0")
        if card is not None:
            on_npu = self._npu_allocate(card, nbytes)
            if on_npu is not None:
                return on_npu
        ledger = card.hbm.malloc(nbytes, "aclrtMalloc") if card is not None else 0
        try:
            memory = np.zeros(nbytes + ALIGNMENT, np.uint8)  # calloc: pages are zeroed as they are touched
        except MemoryError:
            if card is not None:
                card.hbm.free(ledger)
            raise AclError(
                abi.ACL_ERROR_RT_MEMORY_ALLOCATION, f"the host cannot back {nbytes} bytes of device memory"
            ) from None
        base = memory.ctypes.data
        address = -(-base // ALIGNMENT) * ALIGNMENT
        block = Block(address, nbytes, card, memory[address - base : address - base + nbytes], ledger)
        with self.lock:
            self.blocks[address] = block
            bisect.insort(self._starts, address)
        return block

    def _npu_allocate(self, card: Card, nbytes: int) -> Block | None:
        """In a process hosting the npu device, device memory is its pool's (one ledger per card)."""
        try:
            found = torch_bridge.npu_allocate(card.index, nbytes)
        except RuntimeError as err:  # torch's OutOfMemoryError: the card's HBM is full
            raise AclError(abi.ACL_ERROR_RT_MEMORY_ALLOCATION, str(err).splitlines()[0]) from None
        if found is None:
            return None
        owner, memory = found
        block = Block(memory.ctypes.data, nbytes, card, memory, owner=owner)
        with self.lock:
            self.blocks[block.address] = block
            bisect.insort(self._starts, block.address)
        return block

    def release(self, address: int, host: bool) -> None:
        """Free the block at ``address`` (host memory when ``host``)."""
        with self.lock:
            block = self.blocks.get(address)
            if block is None or (block.card is None) != host:
                what = "aclrtMallocHost" if host else "aclrtMalloc"
                raise AclError(abi.ACL_ERROR_INVALID_PARAM, f"{address:#x} is no block of {what}")
            del self.blocks[address]
            self._starts.pop(bisect.bisect_left(self._starts, address))
        if block.card is not None and block.owner is None:
            block.card.hbm.free(block.ledger)

    def block_of(self, address: int, nbytes: int) -> Block | None:
        """The block holding ``nbytes`` at ``address`` whole (an ``aclrtMalloc``'s, or an npu
        tensor's in a process hosting the npu device), or None."""
        with self.lock:
            i = bisect.bisect_right(self._starts, address) - 1
            block = self.blocks[self._starts[i]] if i >= 0 else None
        if block is not None and address + nbytes <= block.address + block.nbytes:
            return block
        found = torch_bridge.npu_block(address, nbytes)
        if found is None:
            return None
        card, start, memory = found
        return Block(start, memory.size, self.card(card), memory)

    # -- handles ----------------------------------------------------------------------------------------
    def new_handle(self) -> int:
        """A fresh handle for a stream, an event or a context."""
        with self.lock:
            return next(self._handles)

    def stream(self, handle: int, card: Card | None = None) -> AclStream:
        """The stream of ``handle`` (0: the default stream of ``card``, else of the current
        device; a torch npu stream's ``npu_stream``: that stream, on its card's modeled clock)."""
        if not handle:
            return (card or self.current_card()).default_stream
        found = self.streams.get(handle)
        if found is None and torch_bridge.torch_stream(handle) is not None:
            index, stream_id = torch_bridge.torch_stream(handle)
            with self.lock:
                found = self.streams.get(handle)
                if found is None:
                    clock = torch_bridge.CardClock(f"torch npu:{index} stream {stream_id}")
                    found = self.streams[handle] = AclStream(handle, self.card(index), clock)
        if found is None:
            raise AclError(abi.ACL_ERROR_RT_INVALID_HANDLE, f"stream {handle:#x} is no stream of this process")
        return found

    def event(self, handle: int) -> AclEvent:
        """The event of ``handle`` (a torch npu event's ``npu_event``: that event)."""
        found = self.events.get(handle) if handle else None
        card = torch_bridge.torch_event(handle) if found is None else None
        if card is not None:
            found = torch_bridge.TorchEvent(handle, self.card(card))
        if found is None:
            raise AclError(abi.ACL_ERROR_INVALID_PARAM, f"event {handle:#x} is no event of this process")
        return found


# Who the ranks are and where they meet: a card's model and a communicator's settings do not
# come from them (a root info or a rank table says, or the C program's own MPI).
_LAUNCH_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "RANK_ID",
    "RANK_SIZE",
    "LOCAL_WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HCCL_PY_STORE_ADDR",
    "HCCL_PY_STORE_PORT",
    "HCCL_PY_STORE_HOSTED",
)


def settings_environ() -> dict[str, str]:
    """The environment without the launch variables: HCCL's settings, the topology, faults."""
    return {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARIABLES}


RUNTIME = Runtime()


def _thread() -> int:
    return threading.get_ident()


def _view(address: int, nbytes: int) -> np.ndarray:
    """The caller's ``nbytes`` at ``address`` as a writable byte array (no copy)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address)) if nbytes else np.empty(0, np.uint8)


# -- init ------------------------------------------------------------------------------------------------
@c_function("aclInit", ACL)
def _acl_init(config_path: int) -> int | None:
    """aclInit(configPath): once per process; again is ``ACL_ERROR_REPEAT_INITIALIZE``."""
    with RUNTIME.lock:
        if RUNTIME.initialized:
            return abi.ACL_ERROR_REPEAT_INITIALIZE
        RUNTIME.initialized, RUNTIME.finalized = True, False
    return None


@c_function("aclFinalize", ACL)
def _acl_finalize() -> int | None:
    """aclFinalize(): after aclInit; again is ``ACL_ERROR_REPEAT_FINALIZE``."""
    with RUNTIME.lock:
        if not RUNTIME.initialized:
            return abi.ACL_ERROR_REPEAT_FINALIZE if RUNTIME.finalized else abi.ACL_ERROR_UNINITIALIZE
        RUNTIME.initialized, RUNTIME.finalized = False, True
    return None


@c_function("aclrtGetVersion", ACL)
def _get_version(major: int, minor: int, patch: int) -> None:
    for address, value, name in zip((major, minor, patch), VERSION, ("majorVersion", "minorVersion", "patchVersion")):
        write(address, "i32", value, name, ACL)


# -- devices ---------------------------------------------------------------------------------------------
@c_function("aclrtSetDevice", ACL)
def _set_device(device: int) -> None:
    RUNTIME.card(device)  # an id past the count is refused
    torch_bridge.set_device(device)
    RUNTIME.current[_thread()] = device


@c_function("aclrtResetDevice", ACL)
def _reset_device(device: int) -> None:
    RUNTIME.card(device)
    if RUNTIME.current.get(_thread()) == device:
        del RUNTIME.current[_thread()]


@c_function("aclrtResetDeviceForce", ACL)
def _reset_device_force(device: int) -> None:
    _reset_device(device)


@c_function("aclrtGetDevice", ACL)
def _get_device(device_out: int) -> None:
    require(device_out, "deviceId", ACL)
    write(device_out, "i32", RUNTIME.current_card().index, "deviceId", ACL)


@c_function("aclrtGetDeviceCount", ACL)
def _get_device_count(count_out: int) -> None:
    write(count_out, "u32", RUNTIME.device_count(), "count", ACL)


@c_function("aclrtGetRunMode", ACL)
def _get_run_mode(mode_out: int) -> None:
    write(mode_out, "i32", ACL_HOST_MODE, "runMode", ACL)


@c_function("aclrtSynchronizeDevice", ACL)
def _synchronize_device() -> None:
    RUNTIME.current_card()  # work ran when it was issued: nothing is left to wait for


@c_function("aclrtSynchronizeDeviceWithTimeout", ACL)
def _synchronize_device_with_timeout(timeout_ms: int) -> None:
    RUNTIME.current_card()


SATURATION, INFNAN = 0, 1  # aclrtFloatOverflowMode


@c_function("aclrtSetDeviceSatMode", ACL)
def _set_device_sat_mode(mode: int) -> None:
    """Floating-point overflow: hccl-py computes with numpy, whose overflow gives inf and nan
    (INFNAN mode, 910B's default); saturating it does not do."""
    if mode != INFNAN:
        raise AclError(
            abi.ACL_ERROR_FEATURE_UNSUPPORTED,
            f"aclrtSetDeviceSatMode({mode}): hccl-py's cards overflow to inf and nan "
            "(ACL_RT_OVERFLOW_MODE_INFNAN) only; they do not saturate",
        )


@c_function("aclrtGetDeviceSatMode", ACL)
def _get_device_sat_mode(mode_out: int) -> None:
    write(mode_out, "i32", INFNAN, "mode", ACL)


def soc_name() -> str:
    """aclrtGetSocName: the name of the current card's chip (the first card before one is set)."""
    index = RUNTIME.current.get(_thread(), 0)
    model = RUNTIME.card(index).model.name
    return SOC_NAMES.get(model, model)


@c_function("aclrtGetMemInfo", ACL)
def _get_mem_info(attribute: int, free_out: int, total_out: int) -> None:
    """aclrtGetMemInfo: HBM kinds give the current card's ledger (the npu device's pool in a
    process hosting it); DDR kinds 0 (a host-run card)."""
    card = RUNTIME.current_card()
    hbm = attribute in (1, 4, 5, 8, 9, 10, 11) or attribute >= 12
    free, total = torch_bridge.memory_info(card.index) or (card.hbm.free_bytes, card.hbm.capacity_bytes)
    write(free_out, "u64", free if hbm else 0, "free", ACL)
    write(total_out, "u64", total if hbm else 0, "total", ACL)


# -- contexts: one per device, as a thread's current device ----------------------------------------------
_contexts: dict[int, int] = {}  # context handle -> device


@c_function("aclrtCreateContext", ACL)
def _create_context(context_out: int, device: int) -> None:
    require(context_out, "context", ACL)
    _set_device(device)
    handle = RUNTIME.new_handle()
    _contexts[handle] = device
    write(context_out, "ptr", handle, "context", ACL)


@c_function("aclrtDestroyContext", ACL)
def _destroy_context(context: int) -> None:
    if _contexts.pop(context, None) is None:
        raise AclError(abi.ACL_ERROR_INVALID_PARAM, f"context {context:#x} is no context of this process")


@c_function("aclrtSetCurrentContext", ACL)
def _set_current_context(context: int) -> None:
    device = _contexts.get(context)
    if device is None:
        raise AclError(abi.ACL_ERROR_INVALID_PARAM, f"context {context:#x} is no context of this process")
    _set_device(device)


@c_function("aclrtGetCurrentContext", ACL)
def _get_current_context(context_out: int) -> None:
    device = RUNTIME.current_card().index
    handle = next((h for h, d in _contexts.items() if d == device), None)
    if handle is None:
        handle = RUNTIME.new_handle()
        _contexts[handle] = device
    write(context_out, "ptr", handle, "context", ACL)


# -- memory ----------------------------------------------------------------------------------------------
@c_function("aclrtMalloc", ACL)
def _malloc(pointer_out: int, nbytes: int, policy: int) -> None:
    require(pointer_out, "devPtr", ACL)
    if policy & ~_POLICY_BITS or policy & 0x7 > 7:
        raise AclError(abi.ACL_ERROR_INVALID_PARAM, f"aclrtMalloc: policy {policy:#x} is no aclrtMemMallocPolicy")
    block = RUNTIME.allocate(RUNTIME.current_card(), nbytes)
    write(pointer_out, "ptr", block.address, "devPtr", ACL)


@c_function("aclrtMallocHost", ACL)
def _malloc_host(pointer_out: int, nbytes: int) -> None:
    require(pointer_out, "hostPtr", ACL)
    write(pointer_out, "ptr", RUNTIME.allocate(None, nbytes).address, "hostPtr", ACL)


@c_function("aclrtFree", ACL)
def _free(address: int) -> None:
    RUNTIME.release(require(address, "devPtr", ACL), host=False)


@c_function("aclrtFreeHost", ACL)
def _free_host(address: int) -> None:
    RUNTIME.release(require(address, "hostPtr", ACL), host=True)


def _device_side(address: int, nbytes: int, what: str) -> Block:
    block = RUNTIME.block_of(address, nbytes)
    if block is None or block.card is None:
        raise AclError(
            abi.ACL_ERROR_INVALID_PARAM,
            f"{what} ({address:#x}, {nbytes} bytes) is not inside a block of device memory (aclrtMalloc)",
        )
    return block


def copy(dst: int, dest_max: int, src: int, nbytes: int, kind: int, stream: AclStream | None) -> None:
    """aclrtMemcpy(Async): ``nbytes`` from ``src`` to ``dst``, the device sides checked to lie in
    device memory, the modeled time charged to ``stream`` (the current device's default one when
    None)."""
    require(dst, "dst", ACL)
    require(src, "src", ACL)
    if kind not in _KINDS and kind not in (_INNER_D2D, _INTER_D2D):
        raise AclError(abi.ACL_ERROR_INVALID_PARAM, f"aclrtMemcpy: kind {kind} is no aclrtMemcpyKind")
    if nbytes > dest_max:
        raise AclError(abi.ACL_ERROR_INVALID_PARAM, f"aclrtMemcpy: count {nbytes} exceeds destMax {dest_max}")
    if kind == DEFAULT:  # the runtime tells by the addresses
        on_device = [RUNTIME.block_of(a, nbytes) for a in (src, dst)]
        src_dev, dst_dev = (b is not None and b.card is not None for b in on_device)
        kind = {(False, False): H2H, (False, True): H2D, (True, False): D2H, (True, True): D2D}[(src_dev, dst_dev)]
    if kind in (D2H, D2D, _INNER_D2D, _INTER_D2D):
        _device_side(src, nbytes, "src")
    if kind in (H2D, D2D, _INNER_D2D, _INTER_D2D):
        _device_side(dst, nbytes, "dst")
    stream = stream or RUNTIME.current_card().default_stream  # before any byte moves: it may be refused
    if nbytes:
        ctypes.memmove(dst, src, nbytes)
    stream.run(stream.card.copy_s(kind, nbytes))


@c_function("aclrtMemcpy", ACL)
def _memcpy(dst: int, dest_max: int, src: int, nbytes: int, kind: int) -> None:
    copy(dst, dest_max, src, nbytes, kind, None)


@c_function("aclrtMemcpyAsync", ACL)
def _memcpy_async(dst: int, dest_max: int, src: int, nbytes: int, kind: int, stream: int) -> None:
    copy(dst, dest_max, src, nbytes, kind, RUNTIME.stream(stream))


def fill(address: int, max_count: int, value: int, nbytes: int, stream: AclStream | None) -> None:
    """aclrtMemset(Async): ``nbytes`` of device memory set to the byte ``value``."""
    require(address, "devPtr", ACL)
    if nbytes > max_count:
        raise AclError(abi.ACL_ERROR_INVALID_PARAM, f"aclrtMemset: count {nbytes} exceeds maxCount {max_count}")
    block = _device_side(address, nbytes, "devPtr")
    _view(address, nbytes)[:] = value & 0xFF
    stream = stream or block.card.default_stream
    stream.run(nbytes / block.card.model.hbm_bandwidth_Bps)


@c_function("aclrtMemset", ACL)
def _memset(address: int, max_count: int, value: int, nbytes: int) -> None:
    fill(address, max_count, value, nbytes, None)


@c_function("aclrtMemsetAsync", ACL)
def _memset_async(address: int, max_count: int, value: int, nbytes: int, stream: int) -> None:
    fill(address, max_count, value, nbytes, RUNTIME.stream(stream))


# -- streams ---------------------------------------------------------------------------------------------
@c_function("aclrtCreateStream", ACL)
def _create_stream(stream_out: int) -> None:
    require(stream_out, "stream", ACL)
    card = RUNTIME.current_card()
    stream = AclStream(RUNTIME.new_handle(), card, Stream(f"device {card.index}", card.default_stream.clock.clock))
    RUNTIME.streams[stream.handle] = stream
    write(stream_out, "ptr", stream.handle, "stream", ACL)


@c_function("aclrtCreateStreamWithConfig", ACL)
def _create_stream_with_config(stream_out: int, priority: int, flag: int) -> None:
    _create_stream(stream_out)


@c_function("aclrtDestroyStream", ACL)
def _destroy_stream(stream: int) -> None:
    if not stream or RUNTIME.streams.pop(stream, None) is None:
        raise AclError(abi.ACL_ERROR_RT_INVALID_HANDLE, f"stream {stream:#x} is no stream of this process")


@c_function("aclrtDestroyStreamForce", ACL)
def _destroy_stream_force(stream: int) -> None:
    _destroy_stream(stream)


@c_function("aclrtSetStreamFailureMode", ACL)
def _set_stream_failure_mode(stream: int, mode: int) -> None:
    """Stop on the first failure (1) or go on (0): a call here fails when issued, so either holds."""
    RUNTIME.stream(stream)
    if mode not in (0, 1):
        raise AclError(abi.ACL_ERROR_INVALID_PARAM, f"aclrtSetStreamFailureMode: mode {mode} is neither 0 nor 1")


@c_function("aclrtSynchronizeStream", ACL)
def _synchronize_stream(stream: int) -> None:
    RUNTIME.stream(stream)  # its work ran when issued


@c_function("aclrtSynchronizeStreamWithTimeout", ACL)
def _synchronize_stream_with_timeout(stream: int, timeout_ms: int) -> None:
    RUNTIME.stream(stream)


@c_function("aclrtStreamWaitEvent", ACL)
def _stream_wait_event(stream: int, event: int) -> None:
    waiting, found = RUNTIME.stream(stream), RUNTIME.event(event)
    if found.stamp is not None:
        waiting.clock.clock = max(waiting.clock.clock, found.stamp)


# -- events ----------------------------------------------------------------------------------------------
@c_function("aclrtCreateEvent", ACL)
def _create_event(event_out: int) -> None:
    require(event_out, "event", ACL)
    event = AclEvent(RUNTIME.new_handle(), RUNTIME.current_card())
    RUNTIME.events[event.handle] = event
    write(event_out, "ptr", event.handle, "event", ACL)


@c_function("aclrtCreateEventWithFlag", ACL)
def _create_event_with_flag(event_out: int, flag: int) -> None:
    _create_event(event_out)


@c_function("aclrtCreateEventExWithFlag", ACL)
def _create_event_ex_with_flag(event_out: int, flag: int) -> None:
    _create_event(event_out)


@c_function("aclrtDestroyEvent", ACL)
def _destroy_event(event: int) -> None:
    if RUNTIME.events.pop(RUNTIME.event(event).handle, None) is None:
        raise AclError(abi.ACL_ERROR_INVALID_PARAM, f"event {event:#x} is no event of this process")


@c_function("aclrtRecordEvent", ACL)
def _record_event(event: int, stream: int) -> None:
    found = RUNTIME.event(event)
    found.stamp = RUNTIME.stream(stream, found.card).clock.clock


@c_function("aclrtResetEvent", ACL)
def _reset_event(event: int, stream: int) -> None:
    RUNTIME.event(event).stamp = None


@c_function("aclrtSynchronizeEvent", ACL)
def _synchronize_event(event: int) -> None:
    RUNTIME.event(event)


@c_function("aclrtSynchronizeEventWithTimeout", ACL)
def _synchronize_event_with_timeout(event: int, timeout_ms: int) -> None:
    RUNTIME.event(event)


@c_function("aclrtQueryEvent", ACL)
def _query_event(event: int, status_out: int) -> None:
    RUNTIME.event(event)
    write(status_out, "i32", EVENT_COMPLETE, "status", ACL)


@c_function("aclrtQueryEventStatus", ACL)
def _query_event_status(event: int, status_out: int) -> None:
    found = RUNTIME.event(event)
    write(status_out, "i32", RECORDED_NOT_READY if found.stamp is None else RECORDED_COMPLETE, "status", ACL)


@c_function("aclrtEventElapsedTime", ACL)
def _event_elapsed_time(ms_out: int, start: int, end: int) -> None:
    """Modeled milliseconds from ``start``'s record to ``end``'s."""
    require(ms_out, "ms", ACL)
    first, last = RUNTIME.event(start), RUNTIME.event(end)
    if first.stamp is None or last.stamp is None:
        raise AclError(abi.ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: an event was never recorded")
    write(ms_out, "f32", (last.stamp - first.stamp) * 1e3, "ms", ACL)


# -- what hccl-py's cards lack: declared so that programs link, refused when called ------------------
def _unsupported(name: str, why: str) -> None:
    def refuse(*args) -> None:
        raise AclError(abi.ACL_ERROR_FEATURE_UNSUPPORTED, f"{name}: {why}")

    c_function(name, ACL)(refuse)


for _name in (
    "aclrtReserveMemAddress",
    "aclrtReleaseMemAddress",
    "aclrtMallocPhysical",
    "aclrtFreePhysical",
    "aclrtMapMem",
    "aclrtUnmapMem",
    "aclrtMemGetAllocationGranularity",
):
    _unsupported(_name, "hccl-py's cards have no virtual memory management; allocate with aclrtMalloc")
for _name in (
    "aclprofInit",
    "aclprofFinalize",
    "aclprofStart",
    "aclprofStop",
    "aclprofCreateConfig",
    "aclprofDestroyConfig",
):
    _unsupported(_name, "hccl-py has no profiler; hccl-launch --trace writes a timeline of modeled and wall time")
