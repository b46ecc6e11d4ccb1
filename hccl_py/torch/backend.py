"""The ``"hccl"`` backend: registration with torch.distributed and the making of its groups.

How a rank meets the others when ``init_process_group("hccl")`` makes the default group:

- it already joined hccl-py (``hccl_py.init()`` earlier in the process): that world communicator
  is the group's (torch's rank and size must be its own);
- under ``hccl-launch`` (``HCCL_PY_STORE_PORT`` set): through hccl-launch's store, exactly as any
  hccl-py program (fault injection, flight recorder, traces as usual);
- otherwise (torchrun, ``env://`` or ``tcp://`` by hand): through the c10d store torch hands the
  backend (``hccl_py.rendezvous.torch.C10dStore``), so nothing listens besides torch's own store.

``init_process_group(timeout=...)`` becomes the group's HCCL_EXEC_TIMEOUT; when it is torch's
default (30 minutes, i.e. none was given) a HCCL_EXEC_TIMEOUT in the environment wins.
``new_group``/``new_subgroups``: torch makes a group only on its members, so each group's
communicator is made by its members alone, named after torch's group name (no collective over
the world); ``new_group(timeout=)`` is its HCCL_EXEC_TIMEOUT.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed.constants import default_pg_timeout

from .. import env, runtime
from ..communicator import Communicator
from ..errors import HcclError, HcclNotSupportedError
from ..job import JobConfig, read_job
from ..rendezvous.torch import C10dStore
from .process_group import HcclProcessGroup
from .tensors import strict
from .work import backend_error

NAME = "hccl"
_epoch = 0  # default groups this process has made: part of every sub-group's communicator id


def foreign_registration() -> str | None:
    """Who registered a backend named "hccl" in this process, when it is not hccl-py: the real
    torch_npu (Ascend), Habana's (Gaudi), or the module of its creator function; None otherwise."""
    plugin = dist.Backend._plugins.get(NAME.upper())
    if plugin is None:
        return None
    module = getattr(plugin.creator_fn, "__module__", "") or ""
    if module.startswith(__package__):
        return None
    devices = dist.Backend.backend_capability.get(NAME, [])
    if module.startswith("torch_npu") or "npu" in devices:
        return "torch_npu"
    if module.startswith("habana") or "hpu" in devices:
        return "habana_frameworks (Gaudi)"
    return module or "an unknown module"


def register() -> None:
    """Register the "hccl" backend for CPU tensors (done by ``import hccl_py.torch``). If another
    library already registered "hccl" (the real torch_npu on an Ascend machine), refuse rather
    than shadow it: HcclNotSupportedError names the holder."""
    holder = foreign_registration()
    if holder is not None:
        raise HcclNotSupportedError(
            f"torch.distributed backend 'hccl' is already registered by {holder}; hccl-py does not replace it. On an "
            "Ascend machine with torch_npu, the real HCCL serves 'hccl'. To emulate instead, run without torch_npu "
            "(TORCH_DEVICE_BACKEND_AUTOLOAD=0 keeps `import torch` from loading it, and hccl-launch --npu puts a "
            "stand-in first on the path)",
            holder=holder,
            rule="unique",
        )
    if NAME.upper() in dist.Backend._plugins:
        return  # ours already (a reload)
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])


def serve_npu() -> None:
    """The "hccl" backend also serves npu tensors, and is torch's choice for them when
    ``init_process_group()`` names no backend (done when the npu device is installed). Under
    hccl-npu it serves npu tensors only, as Ascend's: torch itself then refuses a CPU tensor, and
    object collectives stage through the current npu."""
    register()
    capability = dist.Backend.backend_capability.setdefault(NAME, [])
    if "npu" not in capability:
        capability.append("npu")
    if strict() and "cpu" in capability:
        capability.remove("cpu")
    dist.Backend.default_device_backend_map["npu"] = NAME
    _route_npu_kernels()


_npu_kernels: list = []  # the torch.library holding the npu kernels below, once registered


def _route_npu_kernels() -> None:
    """torch's C++ reaches a group's ``all_gather_single`` (``_allgather_base``, which the functional
    collectives' ``all_gather_into_tensor_out`` calls) only through its dispatcher, whose npu kernel
    asks the group for a C++ backend of the device. A "hccl" group is a Python group with no C++
    backend, so for npu tensors this kernel hands the call to the group's own method (any other
    group keeps torch's way: its backend for the device). torch's C++ waits on the Work it returns
    through the call's future, as on the Works of the other collectives it reaches in Python."""
    if _npu_kernels:
        return

    def allgather_base(output, input, process_group, async_op=True, timeout=-1):
        group = dist.ProcessGroup.unbox(process_group)
        opts = dist.distributed_c10d.AllgatherOptions()
        opts.asyncOp = async_op
        if timeout >= 0:
            opts.timeout = timedelta(milliseconds=timeout)
        if isinstance(group, HcclProcessGroup):
            work = group.all_gather_single(output, input, opts)
        else:
            work = group._get_backend(output.device)._allgather_base(output, input, opts)
        return output, _create_work_from_future(work.get_future()).boxed()

    lib = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():  # torch warns that a kernel it registered is replaced: the point here
        warnings.simplefilter("ignore")
        lib.impl("_allgather_base_", allgather_base, "PrivateUse1")
    _npu_kernels.append(lib)


def _exec_timeout_s(timeout: timedelta | None) -> float | None:
    """HCCL_EXEC_TIMEOUT of a group torch made with ``timeout``: that timeout, unless it is torch's
    default and the environment sets HCCL_EXEC_TIMEOUT. None: no limit."""
    if timeout is None or (timeout == default_pg_timeout and os.environ.get(env.HCCL_EXEC_TIMEOUT, "").strip()):
        return env.exec_timeout_s()
    seconds = timeout.total_seconds()
    return min(seconds, env.MAX_TIMEOUT_S) if seconds > 0 else None


def _job(rank: int, size: int, timeout: timedelta | None) -> JobConfig:
    """This rank's job as torch sees it: its rank, size and timeout over the environment's settings."""
    environ = {k: v for k, v in os.environ.items() if k not in (env.RANK_ID, env.RANK_SIZE)}
    environ[env.RANK], environ[env.WORLD_SIZE] = str(rank), str(size)
    seconds = _exec_timeout_s(timeout)
    environ[env.HCCL_EXEC_TIMEOUT] = "0" if seconds is None else repr(seconds)
    return read_job(environ)


def _store_where() -> str:
    host, port = os.environ.get(env.MASTER_ADDR) or "127.0.0.1", os.environ.get(env.MASTER_PORT) or "0"
    return f"{host}:{port}"


def _share_cores() -> None:
    """Ranks of one host share its cores: torch's intra-op threads = cores // ranks here, unless
    the user chose (OMP_NUM_THREADS; torchrun sets 1), as hccl-py limits numpy's BLAS threads."""
    import torch

    local = os.environ.get(env.LOCAL_WORLD_SIZE, "")
    if os.environ.get("OMP_NUM_THREADS") or not local.isdigit() or int(local) < 1:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores // int(local)))


def _monitor(world: Communicator, ranks: list[int], key: tuple, default_s: float | None):
    """The communicators a group's monitored barriers run on, one per timeout (seconds)."""
    made: dict[float, Communicator] = {}

    def comm_for(timeout_s: float) -> Communicator:
        if timeout_s == default_s:
            return None
        if timeout_s not in made:
            made[timeout_s] = world.create_sub_comm(
                ranks, ("torch", *key, "monitored", timeout_s), name=f"torch:{key[-1]}:monitored", timeout_s=timeout_s
            )
        return made[timeout_s]

    return comm_for


def _create(opts, backend_options) -> HcclProcessGroup:
    """torch's creator of the backend (``extended_api``): the default group, or a sub-group."""
    try:
        if not dist.is_initialized():
            return _default_group(opts)
        return _subgroup(opts)
    except HcclError as err:
        raise backend_error(err, "init_process_group" if not dist.is_initialized() else "new_group") from err


def _default_group(opts) -> HcclProcessGroup:
    global _epoch
    rank, size = opts.group_rank, opts.group_size
    world = runtime.current()
    owns = world is None
    if owns:
        store = None if os.environ.get(env.STORE_PORT) else C10dStore(opts.store, _store_where())
        world = runtime.join(_job(rank, size, opts.timeout), store)
    if (world.rank, world.size) != (rank, size):
        raise HcclNotSupportedError(
            f"init_process_group: torch says rank {rank} of {size}, but this process joined hccl-py as rank {world.rank} "
            f"of {world.size} (hccl_py.init() earlier); start both from the same launcher environment",
            rank=world.rank,
            value=[rank, size],
            expected=[world.rank, world.size],
        )
    _share_cores()
    _epoch += 1
    key = ("world", _epoch, opts.group_id)
    group = HcclProcessGroup(
        world,
        monitor=_monitor(world, list(range(size)), key, world.timeout_s),
        on_shutdown=world.destroy if owns else None,
    )
    return group


def _subgroup(opts) -> HcclProcessGroup:
    world = runtime.current()
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    if world is None or world.size != dist.get_world_size() or world.rank != dist.get_rank():
        raise HcclNotSupportedError(
            f"new_group(backend='hccl'): the default group is {dist.get_backend()!r} and this process has no hccl-py world "
            "of the same ranks; make the default group with init_process_group('hccl') (or call hccl_py.init() first)",
            rule="required",
        )
    timeout_s = _exec_timeout_s(opts.timeout)
    key = ("group", _epoch, opts.group_id)
    # torch calls a backend on a new group's members only: a members-only sub-communicator
    comm = world.create_sub_comm(ranks, ("torch", *key), name=f"torch:{opts.group_id}{ranks}", timeout_s=timeout_s)
    return HcclProcessGroup(comm, monitor=_monitor(world, ranks, key, timeout_s), on_shutdown=comm.destroy)


def communicator(group=None) -> Communicator:
    """The hccl-py communicator under a torch "hccl" group (default: the default group), e.g. to
    read its card's modeled clock or mix hccl-py calls in::

        comm = hccl_py.torch.communicator(); comm.device.clock
    """
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, HcclProcessGroup):
        raise HcclNotSupportedError(f"group {pg!r} is not an hccl group", rule="type", expected="HcclProcessGroup")
    return pg.comm


def monitored_barrier(group=None, timeout: timedelta | float | None = None, wait_all_ranks: bool = False) -> None:
    """``dist.monitored_barrier`` for "hccl" groups too (torch's refuses any backend but gloo
    before it reaches the group); other groups go to torch's."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(timeout, (int, float)):
        timeout = timedelta(seconds=timeout)
    if isinstance(pg, HcclProcessGroup):
        pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        return
    dist.monitored_barrier(group, timeout, wait_all_ranks)
