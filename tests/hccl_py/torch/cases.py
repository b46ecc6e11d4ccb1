"""The collective cases of torch's own distributed tests (``test/distributed/distributed_test.py``:
values from the rank, every op, every root, sub-groups, async), re-expressed against the "hccl"
backend. :func:`run_all` runs every case on one rank of a job and returns {case: None or the
failure}; the test module runs it once on 4 ranks and reports each case as its own test.

Every rank issues the same collectives whatever the outcome of its checks (checks come after
the calls), so a failed case never leaves the others waiting; a hang becomes a DistBackendError
after the default group's timeout (init_process_group(timeout=)).
"""

from __future__ import annotations

import traceback
from datetime import timedelta

WORLD = 4
GROUP_TIMEOUT_S = 60  # a case that hangs fails after this (HCCL_EXEC_TIMEOUT of the default group)
SHORT_S = 2.0  # the group whose timeouts the error cases provoke

CASES: dict = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def _torch():
    import torch
    import torch.distributed as dist

    return torch, dist


# dtypes hccl-py carries, with a sum that stays exact for WORLD ranks
def _dtypes():
    torch, _ = _torch()
    return [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.int64,
    ]


def _close(got, expected, what=""):
    torch, _ = _torch()
    torch.testing.assert_close(got, expected, msg=lambda m: f"{what}: {m}", rtol=0, atol=0)


# -- all_reduce: master value on one rank, worker value elsewhere, for every source (torch's helper) ------
@case
def all_reduce_every_op_and_dtype(rank, world):
    torch, dist = _torch()
    R = dist.ReduceOp
    for dtype in _dtypes():
        for op, master, worker, expected in (
            (R.SUM, 2, 10, 2 + 10 * (world - 1)),
            (R.PRODUCT, 2, 1, 2),
            (R.MIN, 1, 5, 1),
            (R.MAX, 7, 3, 7),
        ):
            if op == R.PRODUCT and dtype is torch.bfloat16:
                continue  # HCCL's prod takes no bfloat16 (checked in the error case below)
            for src in range(world):
                t = torch.full((5, 3), master if rank == src else worker, dtype=dtype)
                dist.all_reduce(t, op=op)
                _close(t, torch.full((5, 3), expected, dtype=dtype), f"{op} {dtype} src {src}")


@case
def all_reduce_avg(rank, world):
    torch, dist = _torch()
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        t = torch.full((4,), float(rank + 1), dtype=dtype)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        _close(t, torch.full((4,), sum(range(1, world + 1)) / world, dtype=dtype), str(dtype))
    t = torch.full((2,), rank, dtype=torch.int32)  # integers truncate, as NCCL's average
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    _close(t, torch.full((2,), sum(range(world)) // world, dtype=torch.int32))


@case
def all_reduce_non_contiguous_and_scalar(rank, world):
    torch, dist = _torch()
    base = torch.zeros(4, 6)
    view = base[:, ::2]  # strided: staged through a copy, written back
    view.fill_(rank + 1.0)
    dist.all_reduce(view)
    _close(base[:, ::2], torch.full((4, 3), float(sum(range(1, world + 1)))))
    _close(base[:, 1::2], torch.zeros(4, 3), "untouched columns")
    s = torch.tensor(float(rank))  # 0-d
    dist.all_reduce(s, op=dist.ReduceOp.MAX)
    assert s.item() == world - 1


@case
def all_reduce_short_path_on_reused_and_new_memory(rank, world):
    """The blocking float32 path (views straight into hccl-py's call, without all_reduce's checks):
    every call writes the tensor it was given, reused, new at a freed one's address, or a slice."""
    torch, dist = _torch()
    total = float(sum(range(1, world + 1)))
    kept = torch.full((3, 2), float(rank + 1))
    for step in range(3):  # the same tensor again and again
        kept.fill_(rank + 1.0)
        dist.all_reduce(kept)
        _close(kept, torch.full((3, 2), total), f"same tensor, step {step}")
    for step in range(20):  # new tensors, often at a freed one's address
        t = torch.full((6,), float(rank + 1 + step))
        dist.all_reduce(t, op=dist.ReduceOp.MAX if step % 2 else dist.ReduceOp.SUM)
        expected = float(world + step) if step % 2 else total + world * step
        _close(t, torch.full((6,), expected), f"new tensor, step {step}")
        del t
    base = torch.zeros(4, 8)  # rows of one storage: same length, different addresses
    for row in range(4):
        base[row].fill_(rank + 1.0)
        dist.all_reduce(base[row])
    _close(base, torch.full((4, 8), total), "rows")
    big = torch.zeros(1 << 17)  # a slice of a large storage
    big[:5].fill_(rank + 1.0)
    dist.all_reduce(big[:5])
    _close(big[:6], torch.tensor([total] * 5 + [0.0]), "slice of a large storage")


@case
def ddp_and_functional_collectives(rank, world):
    """What reaches the group from torch's C++ side: DDP's gradient all_reduce, and the
    functional collectives under DTensor/FSDP2."""
    torch, dist = _torch()
    import torch.distributed._functional_collectives as funcol

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(torch.full((3, 4), float(rank + 1))).sum().backward()  # d/dW of the sum: 3 * (rank + 1) per entry
    _close(model.weight.grad, torch.full((2, 4), 3.0 * sum(range(1, world + 1)) / world), "DDP averaged gradient")
    group = dist.group.WORLD
    total = float(sum(range(world)))
    _close(funcol.wait_tensor(funcol.all_reduce(torch.full((2,), float(rank)), "sum", group)), torch.full((2,), total))
    _close(funcol.wait_tensor(funcol.broadcast(torch.full((2,), float(rank)), 1, group)), torch.full((2,), 1.0))
    gathered = funcol.wait_tensor(funcol.all_gather_tensor(torch.full((2,), float(rank)), 0, group))
    _close(gathered, torch.arange(world, dtype=torch.float32).repeat_interleave(2))
    part = funcol.wait_tensor(funcol.reduce_scatter_tensor(torch.arange(2.0 * world) + rank, "sum", 0, group))
    _close(part, world * torch.arange(2.0 * rank, 2.0 * rank + 2) + total)
    moved = funcol.wait_tensor(funcol.all_to_all_single(torch.arange(float(world)) + 10 * rank, None, None, group))
    _close(moved, torch.full((world,), float(rank)) + 10 * torch.arange(float(world)))


@case
def all_reduce_async_and_future(rank, world):
    torch, dist = _torch()
    ts = [torch.full((8,), float(rank * 10 + i)) for i in range(3)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futures = [w.get_future() for w in works]
    chained = futures[0].then(lambda f: f.value()[0] * 2)
    for w in works:
        assert w.wait() is True
        assert w.is_completed() and w.is_success() and w.exception() is None
    for i, (t, f) in enumerate(zip(ts, futures)):
        expected = torch.full((8,), float(sum(r * 10 + i for r in range(world))))
        _close(t, expected)
        _close(f.wait()[0], expected)
    _close(chained.wait(), torch.full((8,), float(2 * sum(r * 10 for r in range(world)))))


@case
def future_then_issues_collectives(rank, world):
    """A then callback that issues collectives and waits for them (DDP's ZeRO hook
    hook_with_zero_step_interleaved does): it runs in the caller, in program order, so the
    collective issued after then() comes after the callback's on every rank."""
    import threading

    torch, dist = _torch()
    threads = []

    def step(fut):
        threads.append(threading.current_thread())
        b = torch.full((2,), float(rank + 1))
        dist.broadcast(b, src=world - 1)
        inner = torch.full((3,), float(rank))
        dist.all_reduce(inner, op=dist.ReduceOp.MAX, async_op=True).wait()
        return fut.value()[0] * b[0] + inner.sum()

    t = torch.full((4,), float(rank))
    chained = dist.all_reduce(t, async_op=True).get_future().then(step)
    after = torch.full((5,), float(rank))
    dist.all_reduce(after)
    total = float(sum(range(world)))
    _close(chained.wait(), torch.full((4,), total * world + 3 * (world - 1)))
    _close(after, torch.full((5,), total))
    assert threads == [threading.current_thread()], threads


@case
def all_reduce_coalesced(rank, world):
    torch, dist = _torch()
    ts = [torch.full((3,), float(rank)), torch.full((2, 2), float(rank))[:, :1]]  # one of them strided
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX)
    _close(ts[0], torch.full((3,), float(world - 1)))
    _close(ts[1], torch.full((2, 1), float(world - 1)))


# -- broadcast / reduce: every root -------------------------------------------------------------------------
@case
def broadcast_every_root_and_dtype(rank, world):
    torch, dist = _torch()
    for dtype in (*_dtypes(), torch.bool):
        for src in range(world):
            value = (src + 1) % 2 if dtype is torch.bool else src + 1
            t = torch.full((3, 4), value if rank == src else 0, dtype=dtype)
            work = dist.broadcast(t, src=src, async_op=(src % 2 == 1))
            if work is not None:
                work.wait()
            _close(t, torch.full((3, 4), value, dtype=dtype), f"{dtype} src {src}")


@case
def reduce_every_root_and_op(rank, world):
    torch, dist = _torch()
    R = dist.ReduceOp
    for dst in range(world):
        for op, expected in (
            (R.SUM, sum(range(1, world + 1))),
            (R.MAX, world),
            (R.MIN, 1),
            (R.PRODUCT, 24 if world == 4 else None),
        ):
            if expected is None:
                continue
            t = torch.full((6,), rank + 1, dtype=torch.int64)
            dist.reduce(t, dst=dst, op=op)
            if rank == dst:
                _close(t, torch.full((6,), expected, dtype=torch.int64), f"{op} dst {dst}")
            else:
                _close(t, torch.full((6,), rank + 1, dtype=torch.int64), "non-root unchanged")


# -- gather family -------------------------------------------------------------------------------------------
@case
def all_gather_list_and_tensor(rank, world):
    torch, dist = _torch()
    for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.bool):
        t = torch.full((2, 3), rank % 2 if dtype is torch.bool else rank, dtype=dtype)
        outs = [torch.empty(2, 3, dtype=dtype) for _ in range(world)]
        dist.all_gather(outs, t)
        for r, o in enumerate(outs):
            _close(o, torch.full((2, 3), r % 2 if dtype is torch.bool else r, dtype=dtype), f"{dtype} from {r}")
    out = torch.empty(world * 2, 3)
    dist.all_gather_into_tensor(out, torch.full((2, 3), float(rank)))
    _close(out, torch.arange(world, dtype=torch.float32).repeat_interleave(2).unsqueeze(1).expand(-1, 3))
    stacked = torch.empty(world, 5, dtype=torch.int32)  # the (world, n) output form
    work = dist.all_gather_into_tensor(stacked, torch.full((5,), rank, dtype=torch.int32), async_op=True)
    work.wait()
    _close(stacked, torch.arange(world, dtype=torch.int32).unsqueeze(1).expand(-1, 5))
    inplace = torch.zeros(world * 4)  # the input is this rank's block of the output
    inplace[rank * 4 : (rank + 1) * 4] = rank + 0.5
    dist.all_gather_into_tensor(inplace, inplace[rank * 4 : (rank + 1) * 4])
    _close(inplace, torch.arange(world, dtype=torch.float32).repeat_interleave(4) + 0.5)


@case
def all_gather_object(rank, world):
    _, dist = _torch()
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "text": "x" * rank})
    assert objs == [{"rank": r, "text": "x" * r} for r in range(world)], objs
    box = [{"from": rank}] if rank == 2 else [None]
    dist.broadcast_object_list(box, src=2)
    assert box == [{"from": 2}]


@case
def gather_and_scatter_every_root(rank, world):
    torch, dist = _torch()
    for root in range(world):
        t = torch.full((3,), float(rank * 100 + root))
        outs = [torch.empty(3) for _ in range(world)] if rank == root else None
        dist.gather(t, outs, dst=root)
        if rank == root:
            for r, o in enumerate(outs):
                _close(o, torch.full((3,), float(r * 100 + root)))
        got = torch.empty(2, 2, dtype=torch.int64)
        parts = [torch.full((2, 2), r * 7 + root, dtype=torch.int64) for r in range(world)] if rank == root else None
        work = dist.scatter(got, parts, src=root, async_op=True)
        work.wait()
        _close(got, torch.full((2, 2), rank * 7 + root, dtype=torch.int64), f"scatter root {root}")


@case
def reduce_scatter_list_and_tensor(rank, world):
    torch, dist = _torch()
    ins = [torch.full((4,), float(rank + 10 * i)) for i in range(world)]
    out = torch.empty(4)
    dist.reduce_scatter(out, ins)
    _close(out, torch.full((4,), float(sum(range(world)) + world * 10 * rank)))
    full = torch.arange(world * 3, dtype=torch.float64) * (rank + 1)
    part = torch.empty(3, dtype=torch.float64)
    dist.reduce_scatter_tensor(part, full, op=dist.ReduceOp.MAX)
    _close(part, torch.arange(rank * 3, rank * 3 + 3, dtype=torch.float64) * world)
    avg = torch.empty(2)
    dist.reduce_scatter_tensor(avg, torch.full((world * 2,), float(rank)), op=dist.ReduceOp.AVG)
    _close(avg, torch.full((2,), sum(range(world)) / world))


# -- all-to-all ----------------------------------------------------------------------------------------------------
@case
def all_to_all_single_equal_split(rank, world):
    torch, dist = _torch()
    x = torch.arange(world * 2, dtype=torch.float32).reshape(world, 2) + rank * 100
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    expected = torch.stack([torch.arange(rank * 2, rank * 2 + 2, dtype=torch.float32) + r * 100 for r in range(world)])
    _close(out, expected)


@case
def all_to_all_single_unequal_split(rank, world):
    torch, dist = _torch()
    # torch's case: rank r sends i+1 rows to rank i, and so receives r+1 rows from each
    in_splits = [i + 1 for i in range(world)]
    out_splits = [rank + 1] * world
    x = torch.full((sum(in_splits), 3), float(rank))
    out = torch.empty(sum(out_splits), 3)
    work = dist.all_to_all_single(out, x, out_splits, in_splits, async_op=True)
    work.wait()
    expected = torch.cat([torch.full((rank + 1, 3), float(r)) for r in range(world)])
    _close(out, expected)
    zero_in = [0 if i == rank else 1 for i in range(world)]  # zero-sized blocks too
    got = torch.empty(world - 1, dtype=torch.int64)
    dist.all_to_all_single(
        got, torch.full((world - 1,), rank, dtype=torch.int64), [0 if i == rank else 1 for i in range(world)], zero_in
    )
    _close(got, torch.tensor([r for r in range(world) if r != rank], dtype=torch.int64))


@case
def all_to_all_lists(rank, world):
    torch, dist = _torch()
    ins = [torch.full((i + 1,), float(rank)) for i in range(world)]
    outs = [torch.empty(rank + 1) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for r, o in enumerate(outs):
        _close(o, torch.full((rank + 1,), float(r)))


# -- point to point ------------------------------------------------------------------------------------------------
@case
def send_recv_every_pair(rank, world):
    torch, dist = _torch()
    for src in range(world):
        if rank == src:
            for dst in range(world):
                if dst != src:
                    dist.send(torch.full((5,), float(src * 10 + dst)), dst=dst)
        else:
            t = torch.empty(5)
            dist.recv(t, src=src)
            _close(t, torch.full((5,), float(src * 10 + rank)))


@case
def isend_irecv_ring(rank, world):
    torch, dist = _torch()
    right, left = (rank + 1) % world, (rank - 1) % world
    got = torch.empty(4, dtype=torch.bfloat16)
    recv = dist.irecv(got, src=left)
    send = dist.isend(torch.full((4,), float(rank), dtype=torch.bfloat16), dst=right)
    send.wait()
    recv.wait()
    _close(got, torch.full((4,), float(left), dtype=torch.bfloat16))


@case
def batch_isend_irecv_both_directions(rank, world):
    torch, dist = _torch()
    right, left = (rank + 1) % world, (rank - 1) % world
    from_left, from_right = torch.empty(3), torch.empty(3)
    ops = [
        dist.P2POp(dist.isend, torch.full((3,), rank + 0.25), right),  # sends first on every rank
        dist.P2POp(dist.isend, torch.full((3,), rank + 0.75), left),
        dist.P2POp(dist.irecv, from_left, left),
        dist.P2POp(dist.irecv, from_right, right),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    _close(from_left, torch.full((3,), left + 0.25))
    _close(from_right, torch.full((3,), right + 0.75))


@case
def recv_without_source_is_refused(rank, world):
    torch, dist = _torch()
    try:
        dist.recv(torch.empty(1))
    except dist.DistBackendError as err:
        assert "src" in str(err), err
    else:
        raise AssertionError("recv without src did not raise")


# -- barriers and groups -----------------------------------------------------------------------------------
@case
def barrier_sync_async_and_timeout(rank, world):
    _, dist = _torch()
    dist.barrier()
    dist.barrier(async_op=True).wait()
    dist.barrier()  # the timeout form waits at most that long, here it is not reached


@case
def local_synchronization_group(rank, world):
    torch, dist = _torch()
    # Before any asymmetric group: torch names such a group after the groups this rank knows
    # (len(_world.pg_names)), so its members must know the same number of groups, for gloo too.
    if rank in (0, 2):  # only the members call: the group needs nothing from the others
        g = dist.new_group([0, 2], use_local_synchronization=True)
        t = torch.full((2,), float(rank + 1))
        dist.all_reduce(t, group=g)
        _close(t, torch.full((2,), 4.0))
    dist.barrier()


@case
def new_group_and_new_subgroups(rank, world):
    torch, dist = _torch()
    odd = dist.new_group([1, 3])  # every rank calls new_group; non-members get NON_GROUP_MEMBER
    three = dist.new_group([1, 2, 3])  # a non-power-of-two group
    mine, everyone = dist.new_subgroups(group_size=2)
    assert len(everyone) == world // 2
    if rank in (1, 3):
        assert dist.get_rank(odd) == [1, 3].index(rank) and dist.get_world_size(odd) == 2
        t = torch.full((2,), float(rank))
        dist.all_reduce(t, group=odd)
        _close(t, torch.full((2,), 4.0))
        b = torch.full((1,), float(rank))
        dist.broadcast(b, src=3, group=odd)  # src is a global rank
        _close(b, torch.full((1,), 3.0))
    else:
        assert odd == dist.GroupMember.NON_GROUP_MEMBER
    if rank != 0:
        outs = [torch.empty(1, dtype=torch.int64) for _ in range(3)]
        dist.all_gather(outs, torch.tensor([rank]), group=three)
        assert [o.item() for o in outs] == [1, 2, 3]
        w = dist.all_reduce(torch.ones(3), group=three, async_op=True)
        w.wait()
    t = torch.full((3,), float(rank))
    dist.all_reduce(t, group=mine)
    pair = [r for r in range(world) if r // 2 == rank // 2]
    _close(t, torch.full((3,), float(sum(pair))))
    assert dist.get_process_group_ranks(mine) == pair
    dist.barrier(group=mine)
    enumerated, _ = dist.new_subgroups_by_enumeration([[0, 3], [1, 2]])
    s = torch.tensor([rank])
    dist.all_reduce(s, group=enumerated)
    assert s.item() == 3


@case
def modeled_clock_matches_hccl_py(rank, world):
    import numpy as np

    import hccl_py.torch

    torch, dist = _torch()
    comm = hccl_py.torch.communicator()
    t = torch.ones(1 << 14)
    before = comm.clock
    dist.all_reduce(t)
    through_torch = comm.clock - before
    before = comm.clock
    comm.all_reduce(np.ones(1 << 14, np.float32))
    through_numpy = comm.clock - before
    assert through_torch > 0 and through_torch == through_numpy, (through_torch, through_numpy)


@case
def output_shapes_expanded_roots_and_sparse_tensors(rank, world):
    """Outputs a block fills by broadcasting ((1, 2) for an input of (2,)) work; one it does not
    ((2, 1)) is refused on every rank before any data moves, as is a sparse tensor; a broadcast
    root's tensor is only read, so an expanded (stride-0) view of it works."""
    torch, dist = _torch()
    from hccl_py import HcclParamError

    outs = [torch.zeros(1, 2) for _ in range(world)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    for r, o in enumerate(outs):
        _close(o, torch.full((1, 2), float(r)), f"(1, 2) output from {r}")
    listed = [torch.zeros(2) for _ in range(world)]  # an async list form's future holds the list, as gloo's
    value = dist.all_gather(listed, torch.full((2,), float(rank)), async_op=True).get_future().wait()
    assert len(value) == world and all(v is o for v, o in zip(value, listed)), value
    for bad, what in (([torch.zeros(2, 1) for _ in range(world)], "shape"),):
        try:
            dist.all_gather(bad, torch.ones(2))
        except dist.DistBackendError as err:
            assert isinstance(err.__cause__, HcclParamError) and "(2, 1)" in str(err), err
        else:
            raise AssertionError(f"an all_gather output of the wrong {what} was taken")
    try:
        dist.all_reduce(torch.ones(3).to_sparse())
    except dist.DistBackendError as err:
        assert isinstance(err.__cause__, HcclParamError) and "to_dense" in str(err), err
    else:
        raise AssertionError("a sparse tensor was taken")
    root = world - 1
    t = torch.arange(2.0).expand(3, 2) if rank == root else torch.zeros(3, 2)
    dist.broadcast(t, root)
    _close(t, torch.arange(2.0).expand(3, 2), "broadcast from an expanded root tensor")
    dist.barrier()


# -- errors -----------------------------------------------------------------------------------------------------
@case
def errors_come_back_as_dist_backend_errors(rank, world):
    torch, dist = _torch()
    from hccl_py import HcclError, HcclTimeoutError

    short = dist.new_group(list(range(world)), timeout=timedelta(seconds=SHORT_S))
    try:  # HCCL refuses prod on bfloat16 before anything moves, on every rank
        dist.all_reduce(torch.ones(2, dtype=torch.bfloat16), op=dist.ReduceOp.PRODUCT)
    except dist.DistBackendError as err:
        assert isinstance(err.__cause__, HcclError) and err.__cause__.code == 1, err
        assert "prod" in str(err) and "bfloat16" in str(err), err
    else:
        raise AssertionError("prod on bfloat16 did not raise")
    if rank == 1:  # rank 1 never calls: the others time out after new_group(timeout=) and name it
        dist.barrier()
        return
    try:
        dist.all_reduce(torch.ones(4), group=short)
    except dist.DistBackendError as err:
        cause = err.__cause__  # each rank names the peer it waited for (a ring neighbour, or rank 1)
        assert isinstance(cause, HcclTimeoutError) and cause.code == 9 and cause.ranks, repr(cause)
        assert "E_TIMEOUT" in str(err) and "Waiting peer rank" in str(err) and "HCCL_EXEC_TIMEOUT" in str(err), err
    else:
        raise AssertionError("a missing rank did not time out")
    dist.barrier()


@case
def monitored_barrier_names_the_missing_rank(rank, world):
    _, dist = _torch()
    import hccl_py.torch

    group = dist.new_group(list(range(world)))
    try:
        dist.monitored_barrier(group)
    except ValueError as err:  # torch's own: only gloo
        assert "GLOO" in str(err)
    hccl_py.torch.monitored_barrier(group, timeout=timedelta(seconds=30))  # all arrive
    if rank == world - 1:
        dist.barrier()
        return
    try:
        group.monitored_barrier(timedelta(seconds=SHORT_S), wait_all_ranks=True)
    except dist.DistBackendError as err:
        assert str(world - 1) in str(err) and "monitored" in str(err).lower(), err
    else:
        raise AssertionError("monitored barrier without the last rank did not raise")
    dist.barrier()


def run_all() -> dict[str, str | None]:
    """Every case on this rank (module level: launch.spawn calls it by name)."""
    import os
    import warnings

    import torch
    import torch.distributed as dist

    import hccl_py.torch  # noqa: F401  (registers "hccl")

    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    dist.init_process_group("hccl", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == WORLD and rank == int(os.environ["RANK"])
    results: dict[str, str | None] = {}
    for name, fn in CASES.items():
        try:
            fn(rank, world)
            results[name] = None
        except Exception:
            results[name] = traceback.format_exc(limit=6)
    dist.destroy_process_group()
    return results
