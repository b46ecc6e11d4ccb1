"""HCCL's C entry points on hccl-py's communicators: communicators from a root info, a rank table,
a device list or a parent; the collectives, point-to-point calls and batches on streams.

An ``HcclComm`` is a handle of a :class:`CComm`: a world communicator of its own job (its own
transport; a process may host several, one per thread and device as HCCL's examples run), bound
to the device current when it was made. A call checks its arguments (HCCL's code before a byte
moves: null pointers, unknown dtypes and ops, buffers outside the device's memory, a stream of
another device, a destroyed communicator), then runs the communicator's own operation on the
caller's device memory, viewed in place, starting at its stream's modeled clock; the stream's
clock moves to the call's end. Failures are the runtime's (a peer's failure, a mismatch, a
timeout reach every rank), returned as their ``HcclResult`` and written to stderr as HCCL logs
them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from topology import RankTable, TopologyError

from ..communicator import Communicator
from ..dtypes import DTYPES_BY_CODE, NAME_BY_CODE, ReduceOp, dtype_named
from ..errors import HcclError, HcclNotSupportedError, HcclParamError
from ..job import read_job
from ..rendezvous.store import StoreServer
from ..runtime import open_world
from .abi import HCCL, AclError, c_function, read, read_text, read_u64s, require, write, write_bytes
from .acl import RUNTIME, AclStream, Card, settings_environ
from .config import CommConfig, RootInfo

COMM_NAME_BYTES = 128
CAPABILITY = 12  # HcclGetCommConfigCapability: the config items 0..11 (buffer size .. buffer name) are read
# HcclDataType codes of types HCCL has that hccl-py's collectives do not move
_UNSUPPORTED_TYPES = {
    6: "uint64",
    8: "uint16",
    9: "uint32",
    12: "int128",
    14: "hifloat8",
    15: "float8_e4m3",
    16: "float8_e5m2",
    17: "float8_e8m0",
}


@dataclass(eq=False)
class CComm:
    """One ``HcclComm``: the communicator, the device it belongs to, its last failure."""

    handle: int
    comm: Communicator
    card: Card
    async_error: int = 0
    children: list = field(default_factory=list)


_comms: dict[int, CComm] = {}
_lock = threading.Lock()
_stores: list[StoreServer] = []  # root infos this process made: their stores stay until exit
# thread ident -> [group depth, the calls held since its outermost HcclGroupStart] (by ident, not
# threading.local: a C thread is the same thread from call to call, whatever Python makes of it)
_groups: dict[int, list] = {}


# -- arguments -------------------------------------------------------------------------------------------
def ccomm(handle: int) -> CComm:
    """The communicator of ``handle``; HcclParamError for NULL or a destroyed one."""
    require(handle, "comm")
    found = _comms.get(handle)
    if found is None:
        raise HcclParamError(
            f"comm {handle:#x} is no communicator of this process (destroyed, or never made by HcclCommInit*)",
            arg="comm",
            rule="handle",
        )
    return found


def dtype_of(code: int) -> np.dtype:
    """The numpy dtype of ``HcclDataType`` ``code``."""
    if code == 11:
        return dtype_named("bfloat16")
    found = DTYPES_BY_CODE.get(code)
    if found is not None:
        return found
    if code in _UNSUPPORTED_TYPES:
        raise HcclNotSupportedError(
            f"dataType {code} ({_UNSUPPORTED_TYPES[code]}): hccl-py's collectives move "
            f"{', '.join(sorted(NAME_BY_CODE.values()))}",
            arg="dataType",
            value=code,
            rule="choices",
        )
    raise HcclParamError(f"dataType {code} is no HcclDataType", arg="dataType", value=code, rule="choices")


def op_of(code: int) -> ReduceOp:
    """The ReduceOp of ``HcclReduceOp`` ``code``."""
    try:
        return ReduceOp(code)
    except ValueError:
        raise HcclParamError(
            f"op {code} is no HcclReduceOp (sum 0, prod 1, max 2, min 3)", arg="op", value=code, rule="choices"
        ) from None


def stream_of(c: CComm, handle: int) -> AclStream:
    """The stream ``handle`` (NULL: the device's default) of ``c``'s device."""
    try:
        stream = RUNTIME.stream(handle, c.card)
    except AclError as err:
        raise HcclParamError(err.message, arg="stream", rule="handle") from None
    if stream.card is not c.card:
        raise HcclParamError(
            f"stream {handle:#x} belongs to device {stream.card.index}, but communicator '{c.comm.name}' to "
            f"device {c.card.index}: pass a stream of the communicator's device",
            arg="stream",
            rule="device",
        )
    return stream


def buffer(c: CComm, address: int, count: int, dtype: np.dtype, what: str) -> np.ndarray:
    """``count`` elements of ``dtype`` of the caller's device memory at ``address``, in place."""
    nbytes = count * dtype.itemsize
    if count == 0:
        return np.empty(0, dtype)
    require(address, what)
    block = RUNTIME.block_of(address, nbytes)
    if block is None or block.card is not c.card:
        if block is None:
            start = RUNTIME.block_of(address, 1)
            where = (
                "no device memory" if start is None else f"past the end of its aclrtMalloc block ({start.nbytes} bytes)"
            )
        else:
            where = "host memory" if block.card is None else f"memory of device {block.card.index}"
        raise HcclParamError(
            f"{what} ({address:#x}, {count} elements of {dtype.name}) is {where}: pass memory of device "
            f"{c.card.index} from aclrtMalloc, {nbytes} bytes from the pointer",
            arg=what,
            rule="memory",
        )
    offset = address - block.address
    if offset % dtype.itemsize:
        raise HcclParamError(f"{what} ({address:#x}) is not aligned to {dtype.name}", arg=what, rule="alignment")
    return block.memory[offset : offset + nbytes].view(dtype)


def count_of(count: int, what: str = "count") -> int:
    """A count below 2**63 (uint64 arguments arrive unsigned: a negative count wraps)."""
    if count >= 1 << 63:
        raise HcclParamError(f"{what}={count} is past any buffer (a negative count?)", arg=what, rule="range")
    return count


def run(c: CComm, stream: AclStream, what: str, call, p2p: tuple | None = None) -> None:
    """Run ``call`` on ``c``'s communicator from ``stream``'s modeled clock (the stream moves to the
    call's end), or hold it for HcclGroupEnd inside a group (``p2p``: the send or receive as a
    batch item, ``(kind, array, peer)``)."""
    group = _groups.get(threading.get_ident())
    if group is not None:
        group[1].append((c, stream, what, call, p2p))
        return
    device = c.comm.device
    device.clock = stream.clock.clock
    try:
        call()
    except HcclError as err:
        c.async_error = int(err.code)
        raise
    finally:
        stream.clock.clock = max(stream.clock.clock, device.clock)


def log_failure(name: str, err: BaseException) -> None:
    """What a failed call writes to the log (stderr), as HCCL logs its errors."""
    print(f"hccl-py: {name}: {err}", file=sys.stderr, flush=True)


# -- communicators ---------------------------------------------------------------------------------------
def _register(comm: Communicator, card: Card) -> CComm:
    with _lock:
        handle = RUNTIME.new_handle()
        c = _comms[handle] = CComm(handle, comm, card)
    return c


def _job(size: int, rank: int, info: RootInfo, config: CommConfig | None):
    """The job of one rank of a root-info communicator: HCCL's settings from the environment and
    ``config``, the ranks and the store from the root info."""
    return dataclasses.replace(
        _settings(config),
        rank=rank,
        size=size,
        mpi=None,
        launcher_env=True,
        store_addr=info.host,
        store_port=info.port,
        torch_store=False,
        store_hosted=True,
        local_world_size=None,
        launcher_id=(info.job_id, "root info"),
        secret=info.secret,
    )


def _settings(config: CommConfig | None):
    """HCCL's settings of a new communicator: the environment's, overridden by ``config``'s."""
    base = read_job(settings_environ())
    overrides = {}
    if config is not None:
        if config.buffer_bytes is not None:
            overrides["buffsize_bytes"] = config.buffer_bytes
        if config.deterministic is not None:
            overrides["deterministic"] = config.deterministic
        if config.exec_timeout_s is not None:
            overrides["exec_timeout_s"] = config.exec_timeout_s or None  # 0: no limit, as HCCL_EXEC_TIMEOUT=0
        if config.algo:
            from ..choice.names import parse_hccl_algo  # lazy: only a config with hcclAlgo set needs the grammar

            overrides["algo"] = parse_hccl_algo(config.algo)
    return dataclasses.replace(base, **overrides)


def _check_ranks(n_ranks: int, rank: int) -> None:
    if n_ranks < 1:
        raise HcclParamError(f"nRanks={n_ranks}: a communicator has at least one rank", arg="nRanks", rule="range")
    if not 0 <= rank < n_ranks:
        raise HcclParamError(f"rank={rank} is not in 0..{n_ranks - 1}", arg="rank", rule="range")


def init_root_info(n_ranks: int, info: RootInfo, rank: int, config: CommConfig | None, card: Card) -> CComm:
    """Join the communicator of ``info`` as ``rank`` of ``n_ranks`` on ``card`` (blocks until all
    have joined, at most HCCL_CONNECT_TIMEOUT)."""
    _check_ranks(n_ranks, rank)
    comm = open_world(_job(n_ranks, rank, info, config), announce=False)
    if config is not None and config.name:
        comm.name = config.name
    return _register(comm, card)


@c_function("HcclGetRootInfo", HCCL)
def _get_root_info(root_info: int) -> None:
    """The root rank's rendezvous: a store of a new job, hosted by this process until it exits."""
    require(root_info, "rootInfo")
    info = _new_root_info(os.environ.get("HCCL_IF_IP") or "127.0.0.1")
    write_bytes(root_info, info.to_bytes(), "rootInfo")


@c_function("HcclCommInitRootInfo", HCCL)
def _comm_init_root_info(n_ranks: int, root_info: int, rank: int, comm_out: int) -> None:
    _comm_init_root_info_config(n_ranks, root_info, rank, 0, comm_out)


@c_function("HcclCommInitRootInfoConfig", HCCL)
def _comm_init_root_info_config(n_ranks: int, root_info: int, rank: int, config: int, comm_out: int) -> None:
    require(comm_out, "comm")
    info = RootInfo.read(require(root_info, "rootInfo"))
    c = init_root_info(n_ranks, info, rank, CommConfig.read(config), RUNTIME.current_card())
    write(comm_out, "ptr", c.handle, "comm")


@c_function("HcclCommInitClusterInfo", HCCL)
def _comm_init_cluster_info(cluster_info: int, rank: int, comm_out: int) -> None:
    _comm_init_cluster_info_config(cluster_info, rank, 0, comm_out)


@c_function("HcclCommInitClusterInfoConfig", HCCL)
def _comm_init_cluster_info_config(cluster_info: int, rank: int, config: int, comm_out: int) -> None:
    """The communicator of an HCCL rank table file (its ranks, servers and links the modeled
    cluster's), rank ``rank`` of it. The ranks meet at MASTER_ADDR:MASTER_PORT when set (hccl-launch
    sets them), else at a port of this host named by the table's bytes, which rank 0 hosts: two
    jobs of one table at once need a MASTER_PORT each."""
    require(comm_out, "comm")
    path = read_text(require(cluster_info, "clusterInfo"), 4096, "clusterInfo")
    try:
        table = RankTable.load(path)
    except (OSError, TopologyError) as err:
        raise HcclParamError(
            f"clusterInfo {path!r}: {err}; pass the path of an HCCL rank table (hccl-topo generate writes one)",
            arg="clusterInfo",
            rule="rank_table",
        ) from None
    _check_ranks(table.num_ranks, rank)
    digest = hashlib.blake2b(Path(path).read_bytes(), digest_size=4).digest()
    port = os.environ.get("MASTER_PORT") or str(20000 + int.from_bytes(digest, "little") % 10000)
    job = dataclasses.replace(
        _settings(CommConfig.read(config)),
        rank=rank,
        size=table.num_ranks,
        mpi=None,
        launcher_env=True,
        store_addr=os.environ.get("MASTER_ADDR") or "127.0.0.1",
        store_port=int(port),
        torch_store=False,
        store_hosted=False,
        local_world_size=None,
        launcher_id=None,
        rank_table=path,  # with HCCL_PY_TOPOLOGY, if set, naming its cards and links (as RANK_TABLE_FILE)
    )
    comm = open_world(job, announce=False)
    c = _register(comm, RUNTIME.current_card())
    write(comm_out, "ptr", c.handle, "comm")


@c_function("HcclCommInitAll", HCCL)
def _comm_init_all(ndev: int, devices: int, comms_out: int) -> None:
    """One communicator over ``ndev`` devices of this process, a rank per device in the order
    given, each joined on a thread of its own (the ranks meet as separate processes' would)."""
    if ndev < 1:
        raise HcclParamError(f"ndev={ndev}: give at least one device", arg="ndev", rule="range")
    require(comms_out, "comms")
    ids = [read(require(devices, "devices") + 4 * i, "i32", "devices") for i in range(ndev)]
    if len(set(ids)) != len(ids):
        raise HcclParamError(f"devices {ids} lists a device twice", arg="devices", rule="unique")
    cards = [RUNTIME.card(i) for i in ids]
    root = _new_root_info("127.0.0.1")
    made: list = [None] * ndev

    def join(rank: int) -> None:
        try:
            made[rank] = init_root_info(ndev, root, rank, None, cards[rank])
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            made[rank] = err

    threads = [threading.Thread(target=join, args=(r,), name=f"HcclCommInitAll rank {r}") for r in range(ndev)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [m for m in made if isinstance(m, BaseException)]
    if failed:
        for m in made:
            if isinstance(m, CComm):
                _destroy(m)
        raise failed[0]
    for r, c in enumerate(made):
        write(comms_out + 8 * r, "ptr", c.handle, "comms")


def _new_root_info(host: str) -> RootInfo:
    """A store of a new job, hosted by this process until it exits, and its root info."""
    info = RootInfo.new(host, 0)
    server = StoreServer(host=host, port=0, job_id=info.job_id, secret=info.secret).start()
    _stores.append(server)
    return dataclasses.replace(info, port=int(server.address.rsplit(":", 1)[1]))


@c_function("HcclCreateSubCommConfig", HCCL)
def _create_sub_comm_config(
    comm_in: int, rank_num: int, rank_ids: int, sub_comm_id: int, sub_rank: int, config: int, sub_out: int
) -> None:
    """A communicator of ``rank_ids`` (ranks of the parent), made by those ranks alone, each with
    the same ``sub_comm_id``; this rank is ``sub_rank`` of it."""
    parent = ccomm(read(require(comm_in, "comm"), "ptr", "comm") or 0)
    require(sub_out, "subComm")
    ranks = [read(require(rank_ids, "rankIds") + 4 * i, "u32", "rankIds") for i in range(rank_num)]
    if not 0 <= sub_rank < rank_num or ranks[sub_rank] != parent.comm.rank:
        raise HcclParamError(
            f"subCommRankId={sub_rank}: rankIds[{sub_rank}] must be this rank ({parent.comm.rank}) of the parent",
            arg="subCommRankId",
            rule="member",
        )
    settings = CommConfig.read(config)
    name = settings.name if settings is not None and settings.name else None
    timeout = "job" if settings is None or settings.exec_timeout_s is None else (settings.exec_timeout_s or None)
    sub = parent.comm.create_sub_comm(ranks, ("HcclCreateSubCommConfig", sub_comm_id), name=name, timeout_s=timeout)
    c = _register(sub, parent.card)
    parent.children.append(c)
    write(sub_out, "ptr", c.handle, "subComm")


def _destroy(c: CComm) -> None:
    """Destroy ``c`` and the sub-communicators made from it (theirs first: they share its transport)."""
    for child in c.children:
        if child.handle in _comms:
            _destroy(child)
    with _lock:
        _comms.pop(c.handle, None)
    c.comm.destroy()


@c_function("HcclCommDestroy", HCCL)
def _comm_destroy(handle: int) -> None:
    _destroy(ccomm(handle))


@c_function("HcclGetRankSize", HCCL)
def _get_rank_size(handle: int, size_out: int) -> None:
    write(size_out, "u32", ccomm(handle).comm.size, "rankSize")


@c_function("HcclGetRankId", HCCL)
def _get_rank_id(handle: int, rank_out: int) -> None:
    write(rank_out, "u32", ccomm(handle).comm.rank, "rank")


@c_function("HcclGetCommName", HCCL)
def _get_comm_name(handle: int, name_out: int) -> None:
    name = ccomm(handle).comm.name.encode()[: COMM_NAME_BYTES - 1]
    write_bytes(name_out, name + b"\0", "commName")


@c_function("HcclGetCommAsyncError", HCCL)
def _get_comm_async_error(handle: int, error_out: int) -> None:
    write(error_out, "i32", ccomm(handle).async_error, "asyncError")


# -- operations: each checks its arguments, refused on every rank when one is bad, then runs -------------
@dataclass(frozen=True)
class Planned:
    """An operation whose arguments passed: its stream, the call, and (a send or receive) the
    batch item it is inside a group."""

    stream: AclStream
    call: object
    p2p: tuple | None = None


def operation(name: str, comm_at: int, peer_at: int | None = None, kind: str | None = None):
    """Register the decorated function as HCCL operation ``name``: it gets the communicator (the
    argument at ``comm_at``) first, checks the others and returns what to run (:class:`Planned`).
    A check that fails is this rank's refusal: the call's number is spent and the ranks that take
    part fail their call with it (``Communicator.refuse``; a send's or receive's peer, the argument
    at ``peer_at``), so no peer waits for a call that never comes."""

    def wrap(fn):
        @c_function(name, HCCL)
        def entry(*args):
            c = ccomm(args[comm_at])  # no communicator: nobody to tell
            try:
                planned = fn(c, *args[:comm_at], *args[comm_at + 1 :])
            except (HcclParamError, HcclNotSupportedError) as err:
                peer = args[peer_at] if peer_at is not None else None
                if kind == "send":
                    c.comm.refuse(err, send_to=peer)
                elif kind == "recv":
                    c.comm.refuse(err, recv_from=peer)
                elif kind is None:
                    c.comm.refuse(err)
                raise
            run(c, planned.stream, name, planned.call, planned.p2p)

        entry.__doc__ = fn.__doc__
        return fn

    return wrap


@operation("HcclAllReduce", comm_at=5)
def _all_reduce(c: CComm, send: int, recv: int, count: int, dtype: int, op: int, stream: int) -> Planned:
    dt, red, count = dtype_of(dtype), op_of(op), count_of(count)
    s = stream_of(c, stream)
    x, y = buffer(c, send, count, dt, "sendBuf"), buffer(c, recv, count, dt, "recvBuf")
    return Planned(s, lambda: c.comm.all_reduce(x, red, out=None if send == recv else y))


@operation("HcclBroadcast", comm_at=4)
def _broadcast(c: CComm, buf: int, count: int, dtype: int, root: int, stream: int) -> Planned:
    dt, s = dtype_of(dtype), stream_of(c, stream)
    x = buffer(c, buf, count_of(count), dt, "buf")
    return Planned(s, lambda: c.comm.broadcast(x, root))


@operation("HcclReduce", comm_at=6)
def _reduce(c: CComm, send: int, recv: int, count: int, dtype: int, op: int, root: int, stream: int) -> Planned:
    dt, red, count = dtype_of(dtype), op_of(op), count_of(count)
    s = stream_of(c, stream)
    x = buffer(c, send, count, dt, "sendBuf")
    y = buffer(c, recv, count, dt, "recvBuf") if c.comm.rank == root else None  # only the root's is written
    return Planned(s, lambda: c.comm.reduce(x, root, red, out=None if y is None or send == recv else y))


@operation("HcclAllGather", comm_at=4)
def _all_gather(c: CComm, send: int, recv: int, count: int, dtype: int, stream: int) -> Planned:
    dt, count = dtype_of(dtype), count_of(count, "sendCount")
    s = stream_of(c, stream)
    x, y = buffer(c, send, count, dt, "sendBuf"), buffer(c, recv, count * c.comm.size, dt, "recvBuf")
    return Planned(s, lambda: c.comm.all_gather(x, out=y))


@operation("HcclReduceScatter", comm_at=5)
def _reduce_scatter(c: CComm, send: int, recv: int, count: int, dtype: int, op: int, stream: int) -> Planned:
    dt, red, count = dtype_of(dtype), op_of(op), count_of(count, "recvCount")
    s = stream_of(c, stream)
    x, y = buffer(c, send, count * c.comm.size, dt, "sendBuf"), buffer(c, recv, count, dt, "recvBuf")
    return Planned(s, lambda: c.comm.reduce_scatter(x, red, out=y))


@operation("HcclScatter", comm_at=5)
def _scatter(c: CComm, send: int, recv: int, count: int, dtype: int, root: int, stream: int) -> Planned:
    dt, count = dtype_of(dtype), count_of(count, "recvCount")
    s = stream_of(c, stream)
    y = buffer(c, recv, count, dt, "recvBuf")
    x = buffer(c, send, count * c.comm.size, dt, "sendBuf") if c.comm.rank == root else None  # others may pass NULL
    return Planned(s, lambda: c.comm.scatter(x, root, out=y))


@operation("HcclAlltoAll", comm_at=6)
def _all_to_all(
    c: CComm, send: int, send_count: int, send_type: int, recv: int, recv_count: int, recv_type: int, stream: int
) -> Planned:
    dt = _same_types(send_type, recv_type)
    if send_count != recv_count:
        raise HcclParamError(
            f"sendCount={send_count} and recvCount={recv_count} differ: HcclAlltoAll moves equal blocks",
            arg="recvCount",
            rule="equal",
        )
    n, s = c.comm.size, stream_of(c, stream)
    x = buffer(c, send, count_of(send_count, "sendCount") * n, dt, "sendBuf")
    y = buffer(c, recv, recv_count * n, dt, "recvBuf")
    return Planned(s, lambda: c.comm.all_to_all(x.reshape(n, send_count), out=y.reshape(n, recv_count)))


def _same_types(send_type: int, recv_type: int) -> np.dtype:
    dt = dtype_of(send_type)
    if dtype_of(recv_type) != dt:
        raise HcclParamError(
            f"sendType {send_type} and recvType {recv_type} differ: hccl-py's all-to-alls keep the type",
            arg="recvType",
            rule="equal",
        )
    return dt


def _extent(counts: list[int], displs: list[int]) -> int:
    """Elements a buffer of blocks ``counts`` at ``displs`` spans."""
    return max((count + displ for count, displ in zip(counts, displs)), default=0)


@operation("HcclAlltoAllV", comm_at=8)
def _all_to_all_v(  # params: HCCL's HcclAlltoAllV, argument for argument
    c: CComm,
    send: int,
    send_counts: int,
    send_displs: int,
    send_type: int,
    recv: int,
    recv_counts: int,
    recv_displs: int,
    recv_type: int,
    stream: int,
) -> Planned:  # params: HcclAlltoAllV's, as C passes them
    dt, n, s = _same_types(send_type, recv_type), c.comm.size, stream_of(c, stream)
    sc, sd = read_u64s(send_counts, n, "sendCounts"), read_u64s(send_displs, n, "sdispls")
    rc, rd = read_u64s(recv_counts, n, "recvCounts"), read_u64s(recv_displs, n, "rdispls")
    x, y = buffer(c, send, _extent(sc, sd), dt, "sendBuf"), buffer(c, recv, _extent(rc, rd), dt, "recvBuf")
    return Planned(s, lambda: c.comm.all_to_all_v(x, sc, sd, y, rc, rd))


@operation("HcclAlltoAllVC", comm_at=5)
def _all_to_all_vc(c: CComm, send: int, matrix: int, send_type: int, recv: int, recv_type: int, stream: int) -> Planned:
    dt, n, me, s = _same_types(send_type, recv_type), c.comm.size, c.comm.rank, stream_of(c, stream)
    flat = read_u64s(require(matrix, "sendCountMatrix"), n * n, "sendCountMatrix")
    counts = [flat[i * n : (i + 1) * n] for i in range(n)]
    x = buffer(c, send, sum(counts[me]), dt, "sendBuf")
    y = buffer(c, recv, sum(row[me] for row in counts), dt, "recvBuf")
    return Planned(s, lambda: c.comm.all_to_all_vc(x, counts, y))


@operation("HcclAllGatherV", comm_at=6)
def _all_gather_v(
    c: CComm, send: int, send_count: int, recv: int, recv_counts: int, recv_displs: int, dtype: int, stream: int
) -> Planned:
    """Every rank's ``sendCount`` elements, rank i's at ``recvDispls[i]``: the communicator's
    ``all_gather_v`` (blocks padded to the largest count; ranks whose counts differ are a call
    mismatch), each block then moved to its place."""
    dt, n, me, s = dtype_of(dtype), c.comm.size, c.comm.rank, stream_of(c, stream)
    counts, displs = read_u64s(recv_counts, n, "recvCounts"), read_u64s(recv_displs, n, "recvDispls")
    if counts[me] != send_count:
        raise HcclParamError(
            f"sendCount={send_count} but recvCounts[{me}]={counts[me]}: this rank's block is what it sends",
            arg="sendCount",
            rule="equal",
        )
    x, y = buffer(c, send, send_count, dt, "sendBuf"), buffer(c, recv, _extent(counts, displs), dt, "recvBuf")

    def call() -> None:
        rows = c.comm.all_gather_v(x, counts)
        for i in range(n):
            y[displs[i] : displs[i] + counts[i]] = rows[i, : counts[i]]

    return Planned(s, call)


@operation("HcclReduceScatterV", comm_at=7)
def _reduce_scatter_v(  # params: HCCL's HcclReduceScatterV, argument for argument
    c: CComm,
    send: int,
    send_counts: int,
    send_displs: int,
    recv: int,
    recv_count: int,
    dtype: int,
    op: int,
    stream: int,
) -> Planned:
    """Rank i gets the reduction of every rank's block i (``sendCounts[i]`` at ``sendDispls[i]``):
    the communicator's ``reduce_scatter_v`` of the blocks packed in rank order."""
    dt, red, n, me, s = dtype_of(dtype), op_of(op), c.comm.size, c.comm.rank, stream_of(c, stream)
    counts, displs = read_u64s(send_counts, n, "sendCounts"), read_u64s(send_displs, n, "sendDispls")
    if counts[me] != recv_count:
        raise HcclParamError(f"recvCount={recv_count} but sendCounts[{me}]={counts[me]}", arg="recvCount", rule="equal")
    x, y = buffer(c, send, _extent(counts, displs), dt, "sendBuf"), buffer(c, recv, recv_count, dt, "recvBuf")

    def call() -> None:
        packed = np.concatenate([x[displs[i] : displs[i] + counts[i]] for i in range(n)]) if n else x[:0]
        y[:] = c.comm.reduce_scatter_v(packed, counts, red)

    return Planned(s, call)


@operation("HcclBarrier", comm_at=0)
def _barrier(c: CComm, stream: int) -> Planned:
    return Planned(stream_of(c, stream), c.comm.barrier)


# -- point to point --------------------------------------------------------------------------------------
@operation("HcclSend", comm_at=4, peer_at=3, kind="send")
def _send(c: CComm, buf: int, count: int, dtype: int, dest: int, stream: int) -> Planned:
    dt, s = dtype_of(dtype), stream_of(c, stream)
    x = buffer(c, buf, count_of(count), dt, "sendBuf")
    return Planned(s, lambda: c.comm.send(x, dest), ("send", x, dest))


@operation("HcclRecv", comm_at=4, peer_at=3, kind="recv")
def _recv(c: CComm, buf: int, count: int, dtype: int, src: int, stream: int) -> Planned:
    dt, s = dtype_of(dtype), stream_of(c, stream)
    x = buffer(c, buf, count_of(count), dt, "recvBuf")
    return Planned(s, lambda: c.comm.recv(x, src), ("recv", x, src))


SEND, RECV = 0, 1  # HcclSendRecvType
_ITEM_BYTES = 32  # HcclSendRecvItem: type (4, then 4 of padding), buf (8), count (8), dataType (4), remoteRank (4)


@operation("HcclBatchSendRecv", comm_at=2, kind="batch")
def _batch_send_recv(c: CComm, items: int, item_num: int, stream: int) -> Planned:
    s = stream_of(c, stream)
    batch, peers = [], []
    try:
        for i in range(item_num):
            at = require(items, "sendRecvInfo") + i * _ITEM_BYTES
            kind, address, count = (
                read(at, "i32", "sendRecvType"),
                read(at + 8, "u64", "buf"),
                read(at + 16, "u64", "count"),
            )
            dtype, peer = read(at + 24, "i32", "dataType"), read(at + 28, "u32", "remoteRank")
            if kind not in (SEND, RECV):
                raise HcclParamError(
                    f"sendRecvInfo[{i}].sendRecvType={kind} is neither HCCL_SEND (0) nor HCCL_RECV (1)",
                    arg="sendRecvType",
                    rule="choices",
                )
            peers.append((kind, peer))
            array = buffer(c, address, count_of(count), dtype_of(dtype), f"sendRecvInfo[{i}].buf")
            batch.append(("send" if kind == SEND else "recv", array, peer))
    except (HcclParamError, HcclNotSupportedError) as err:
        for kind, peer in peers:  # every item whose peer is known is refused there, as the batch's own refusal
            c.comm.refuse(err, **({"send_to": peer} if kind == SEND else {"recv_from": peer}))
        raise
    return Planned(s, lambda: c.comm.batch_send_recv(batch))


# -- groups ----------------------------------------------------------------------------------------------
@c_function("HcclGroupStart", HCCL)
def _group_start() -> None:
    """Hold this thread's calls until the matching HcclGroupEnd (groups nest)."""
    _groups.setdefault(threading.get_ident(), [0, []])[0] += 1


@c_function("HcclGroupEnd", HCCL)
def _group_end() -> None:
    """Run the calls held since HcclGroupStart in issue order, each run of sends and receives on
    one communicator and stream as one batch (no order of them can deadlock, as in HCCL's group)."""
    group = _groups.get(threading.get_ident())
    if group is None:
        raise HcclParamError("HcclGroupEnd without HcclGroupStart", rule="pairing")
    group[0] -= 1
    if group[0]:
        return
    held = _groups.pop(threading.get_ident())[1]
    i = 0
    while i < len(held):
        c, stream, what, call, p2p = held[i]
        if p2p is None:
            run(c, stream, what, call)
            i += 1
            continue
        items = []
        while i < len(held) and held[i][4] is not None and held[i][0] is c and held[i][1] is stream:
            items.append(held[i][4])
            i += 1
        run(c, stream, "HcclGroupEnd", lambda c=c, items=items: c.comm.batch_send_recv(items))


def shutdown() -> None:
    """At exit: destroy the communicators still open, close the stores this process hosts."""
    for c in list(_comms.values()):
        try:
            if c.handle in _comms:  # not destroyed with its parent meanwhile
                _destroy(c)
        except HcclError:
            pass
    for server in _stores:
        server.close()
    _stores.clear()


# -- what hccl-py's communicators lack: declared so that programs link, refused when called ----------
def _unsupported(name: str, why: str) -> None:
    def refuse(*args) -> None:
        raise HcclNotSupportedError(f"{name}: {why}", rule="feature")

    c_function(name, HCCL)(refuse)


for _name in (
    "HcclCommSetMemoryRange",
    "HcclCommUnsetMemoryRange",
    "HcclCommActivateCommMemory",
    "HcclCommDeactivateCommMemory",
):
    _unsupported(_name, "hccl-py has no zero-copy memory ranges; pass memory of aclrtMalloc")
for _name in ("HcclCommSymWinRegister", "HcclCommSymWinDeregister"):
    _unsupported(_name, "hccl-py has no symmetric memory windows; pass memory of aclrtMalloc")
