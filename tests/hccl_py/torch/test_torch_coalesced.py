"""torch's coalesced collectives on "hccl", each held against gloo on the same inputs.

``all_reduce_coalesced``, ``all_gather_coalesced`` (torch's layout: ``output_tensor_lists[r][i]``
receives rank r's ``input_tensor_list[i]``, one list per rank), ``allgather_into_tensor_coalesced``,
``reduce_scatter_tensor_coalesced`` and torch's ``_coalescing_manager`` (the form FSDP-style code
uses for all_gather_into_tensor / reduce_scatter_tensor), through torch's Python API and the
group's methods, with several tensors of different shapes and dtypes per call, on 2 and 3 ranks.
:func:`_job` runs the same calls on either backend; the test compares every rank's results.

Gathers, MIN/MAX, integer reductions and 16-bit floats (quarters, whose sums are exact) are
compared exactly. float32/float64 SUM, AVG and PRODUCT of random values are compared to the
dtype's tolerance (torch.testing's default): gloo's algorithms and hccl-py's combine the ranks'
contributions in different orders (chunk by chunk), and floating addition and multiplication are
not associative, so the last bits may differ on 3 ranks. Wrong inputs (dtypes that disagree, outputs
of the wrong size or number) are refused with HcclParamError fields on every rank before any
byte moves: a valid first pair's output is left as it was and the next call pairs up as usual.
"""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

from tests.mp import run_ranks  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaks")

ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}  # gloo on one host; one arithmetic order per rank
SHAPES = [(3,), (2, 5), (4, 1, 3), ()]  # several shapes per call, a 0-d tensor among them
FLOAT_ORDER_DEPENDENT = ("SUM", "AVG", "PRODUCT")


def _init(backend: str):
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's new name
    torch.set_num_threads(1)
    if backend == "hccl":
        import hccl_py.torch  # noqa: F401  (registers "hccl")
    dist.init_process_group(backend)
    return dist, dist.get_rank(), dist.get_world_size()


def _random(rank: int, call: int, shape: tuple, dtype) -> torch.Tensor:
    """Rank ``rank``'s input of one call (every rank can make every rank's)."""
    gen = torch.Generator().manual_seed(1000 * rank + call)
    if dtype.itemsize == 2 and dtype.is_floating_point:  # quarters: their sums are exact in 16 bits, in any order
        return (torch.randint(-8, 8, shape, generator=gen) / 4).to(dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=dtype)
    return torch.randint(-40 if dtype.is_signed else 0, 40, shape, generator=gen, dtype=torch.int64).to(dtype)


def _job(backend: str) -> bytes:
    """Every coalesced form on ``backend``; {name: output} of this rank, saved by torch."""
    dist, rank, world = _init(backend)
    pg = dist.group.WORLD
    out: dict[str, torch.Tensor] = {}
    call = 0

    def inputs(shapes, dtype):
        nonlocal call
        call += 1
        return [_random(rank, call, s, dtype) for s in shapes]

    # all_reduce_coalesced: torch's API (sync, async with its future), one strided tensor, every op
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64):
        for op in ("SUM", "MAX", "MIN", "PRODUCT", "AVG"):
            if op == "AVG" and not dtype.is_floating_point or op == "PRODUCT" and dtype is torch.bfloat16:
                continue
            ts = inputs(SHAPES, dtype)
            ts.append(inputs([(4, 6)], dtype)[0][:, ::2])  # not contiguous: written back through the view
            dist.all_reduce_coalesced(ts, op=getattr(dist.ReduceOp, op))
            out.update({f"all_reduce_coalesced/{dtype}/{op}/{i}": t for i, t in enumerate(ts)})
    ts = inputs(SHAPES, torch.float32)
    future = dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX, async_op=True)
    out.update({f"all_reduce_coalesced/async/MAX/{i}": t for i, t in enumerate(future.wait())})
    ts = inputs(SHAPES, torch.int64)
    opts = dist.AllreduceCoalescedOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    pg.allreduce_coalesced(ts, opts).wait()  # the group's method, as C++ callers reach it
    out.update({f"allreduce_coalesced/method/SUM/{i}": t for i, t in enumerate(ts)})

    # all_gather_coalesced: one list per rank, one tensor per input
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
        ins = inputs(SHAPES, dtype)
        lists = [[torch.full_like(t, 7) for t in ins] for _ in range(world)]
        dist.all_gather_coalesced(lists, ins)
        out.update({f"all_gather_coalesced/{dtype}/{r}/{i}": t for r, ts in enumerate(lists) for i, t in enumerate(ts)})
    ins = inputs(SHAPES[:2], torch.float64)
    lists = [[torch.empty_like(t) for t in ins] for _ in range(world)]
    got = dist.all_gather_coalesced(lists, ins, async_op=True).wait()  # the future holds the lists, as gloo's
    out.update({f"all_gather_coalesced/async/{r}/{i}": t for r, ts in enumerate(got) for i, t in enumerate(ts)})

    # allgather_into_tensor_coalesced: pairs of different shapes (one dtype per call: gloo flattens the call)
    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        ins = inputs([(3,), (2, 5), (1, 2, 2)], dtype)
        outs = [torch.full((world * t.shape[0], *t.shape[1:]), 7, dtype=dtype) for t in ins]
        pg.allgather_into_tensor_coalesced(outs, ins).wait()
        out.update({f"allgather_into_tensor_coalesced/{dtype}/{i}": t for i, t in enumerate(outs)})

    # reduce_scatter_tensor_coalesced: inputs of world blocks along dim 0
    for dtype in (torch.float32, torch.float64, torch.int64):
        for op in ("SUM", "MAX"):
            ins = inputs([(world * 3,), (world * 2, 5), (world, 2, 3)], dtype)
            outs = [torch.full((t.shape[0] // world, *t.shape[1:]), 7, dtype=dtype) for t in ins]
            opts = dist.ReduceScatterOptions()
            opts.reduceOp = getattr(dist.ReduceOp, op)
            pg.reduce_scatter_tensor_coalesced(outs, ins, opts).wait()
            out.update({f"reduce_scatter_tensor_coalesced/{dtype}/{op}/{i}": t for i, t in enumerate(outs)})

    # torch's coalescing manager, as FSDP-style code calls it
    ins = inputs([(4,), (3, 2), (5,)], torch.float32)
    outs = [torch.empty((world * t.shape[0], *t.shape[1:])) for t in ins]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    out.update({f"coalescing_manager/all_gather_into_tensor/{i}": t for i, t in enumerate(outs)})
    for op in ("SUM", "MAX"):
        ins = inputs([(world * 4,), (world * 3, 2)], torch.float32)
        outs = [torch.empty((t.shape[0] // world, *t.shape[1:])) for t in ins]
        with dist._coalescing_manager():
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i, op=getattr(dist.ReduceOp, op))
        out.update({f"coalescing_manager/reduce_scatter_tensor/{op}/{i}": t for i, t in enumerate(outs)})
    ts = inputs([(4,), (3, 2)], torch.int32)
    with dist._coalescing_manager():
        for t in ts:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out.update({f"coalescing_manager/all_reduce/MAX/{i}": t for i, t in enumerate(ts)})

    dist.destroy_process_group()
    buffer = io.BytesIO()
    torch.save(out, buffer)  # bytes: a tensor pickled between processes would go through shared memory
    return buffer.getvalue()


def _compare(gloo: dict, hccl: dict, where: str) -> None:
    assert gloo.keys() == hccl.keys(), where
    for key, expected in gloo.items():
        got = hccl[key]
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape), (where, key)
        if expected.dtype in (torch.float32, torch.float64) and any(f"/{op}/" in key for op in FLOAT_ORDER_DEPENDENT):
            torch.testing.assert_close(got, expected, msg=lambda m, key=key: f"{where} {key}: {m}")
        else:
            assert torch.equal(got, expected), f"{where} {key}: {got} != {expected}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_coalesced_collectives_match_gloo(world):
    gloo = run_ranks(_job, world, "gloo", env=ENV, timeout=120)
    hccl = run_ranks(_job, world, "hccl", env=ENV, timeout=120)
    for rank, (g, h) in enumerate(zip(gloo, hccl)):
        _compare(torch.load(io.BytesIO(g)), torch.load(io.BytesIO(h)), f"rank {rank} of {world}:")


# -- hccl only: pairs of several dtypes served exactly, wrong inputs refused before any byte moves -------------
def _refused(fn, dist) -> dict:
    """The fields of the HcclParamError that ``fn`` raised (as the cause of torch's DistBackendError)."""
    from hccl_py import HcclParamError

    try:
        fn()
    except dist.DistBackendError as err:
        cause = err.__cause__
        assert isinstance(cause, HcclParamError) and cause.code == 1, repr(cause)
        return {name: cause.fields.get(name) for name in ("arg", "rule", "value", "expected")}
    raise AssertionError("not refused")


def _hccl_only() -> dict:
    dist, rank, world = _init("hccl")
    pg = dist.group.WORLD
    big = 2**53 + 1  # an int64 that a trip through float64 would change
    found: dict = {}

    # pairs of several dtypes in one call: each pair its own all_gather / reduce_scatter, exact
    def mixed(r):
        return [torch.full((2,), r + 0.5), torch.full((3,), big + r), torch.full((2, 2), r, dtype=torch.bfloat16)]

    ins = mixed(rank)
    outs = [torch.empty((world * t.shape[0], *t.shape[1:]), dtype=t.dtype) for t in ins]
    pg.allgather_into_tensor_coalesced(outs, ins).wait()
    for i, o in enumerate(outs):
        expected = torch.cat([mixed(r)[i] for r in range(world)])
        assert torch.equal(o, expected), (i, o, expected)
    ins = [torch.full((world * 2,), big + rank), torch.arange(world * 3, dtype=torch.float64) + rank]
    outs = [torch.empty(2, dtype=torch.int64), torch.empty(3, dtype=torch.float64)]
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    pg.reduce_scatter_tensor_coalesced(outs, ins, opts).wait()
    assert outs[0].tolist() == [big + world - 1] * 2
    assert outs[1].tolist() == [3 * rank + k + world - 1 for k in range(3)]

    # refusals: every rank passes the same wrong call; the first pair is valid and must stay untouched
    ts = [torch.ones(2), torch.ones(3, dtype=torch.int64)]
    opts = dist.AllreduceCoalescedOptions()
    found["all_reduce_coalesced dtypes"] = _refused(lambda: pg.allreduce_coalesced(ts, opts).wait(), dist)
    ins = [torch.full((2,), float(rank)), torch.full((3,), float(rank))]
    lists = [[torch.full((2,), -1.0), torch.full((3,), -1.0)] for _ in range(world)]
    found["all_gather_coalesced lists"] = _refused(lambda: dist.all_gather_coalesced(lists[1:], ins), dist)
    lists[-1][1] = torch.full((3,), -1, dtype=torch.int64)
    found["all_gather_coalesced dtype"] = _refused(  # the group's method: torch's API refuses mixed lists itself
        lambda: pg.allgather_coalesced(lists, ins).wait(), dist
    )
    lists[-1][1] = torch.full((4,), -1.0)
    found["all_gather_coalesced size"] = _refused(lambda: dist.all_gather_coalesced(lists, ins), dist)
    lists[-1][1] = torch.full((3,), -1.0)
    lists[0].append(torch.full((3,), -1.0))
    found["all_gather_coalesced per input"] = _refused(lambda: dist.all_gather_coalesced(lists, ins), dist)
    lists[0].pop()
    assert all(torch.equal(ts[0], torch.full((2,), -1.0)) for ts in lists), lists  # nothing moved

    outs = [torch.full((world * 2,), -1.0), torch.full((world * 3 - 1,), -1.0)]  # the second one row short

    def manager():
        with dist._coalescing_manager():
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)

    found["all_gather_into_tensor in the manager"] = _refused(manager, dist)
    found["allgather_into_tensor_coalesced lists"] = _refused(
        lambda: pg.allgather_into_tensor_coalesced(outs[:1], ins).wait(), dist
    )
    assert torch.equal(outs[0], torch.full((world * 2,), -1.0)), outs[0]
    rs_ins = [torch.ones(world * 2), torch.ones(world * 3, dtype=torch.float64)]
    rs_outs = [torch.full((2,), -1.0), torch.full((3,), -1.0)]
    found["reduce_scatter_tensor_coalesced dtype"] = _refused(
        lambda: pg.reduce_scatter_tensor_coalesced(rs_outs, rs_ins, dist.ReduceScatterOptions()).wait(), dist
    )
    assert torch.equal(rs_outs[0], torch.full((2,), -1.0)), rs_outs[0]

    # and the next calls pair up as before
    dist.all_gather_coalesced(lists, ins)
    assert [[t.tolist() for t in ts] for ts in lists] == [[[float(r)] * 2, [float(r)] * 3] for r in range(world)]
    dist.destroy_process_group()
    return found


@pytest.mark.timeout(120)
def test_hccl_serves_pairs_of_several_dtypes_and_refuses_wrong_inputs_everywhere():
    world = 3
    results = run_ranks(_hccl_only, world, env=ENV, timeout=90)
    assert all(found == results[0] for found in results)  # every rank refused the same way
    assert results[0] == {
        "all_reduce_coalesced dtypes": {
            "arg": "tensors",
            "rule": "dtype",
            "value": ["torch.float32", "torch.int64"],
            "expected": "torch.float32",
        },
        "all_gather_coalesced lists": {
            "arg": "output_tensor_lists",
            "rule": "length",
            "value": world - 1,
            "expected": world,
        },
        "all_gather_coalesced dtype": {
            "arg": "output_tensor_lists",
            "rule": "dtype",
            "value": "torch.int64",
            "expected": "torch.float32",
        },
        "all_gather_coalesced size": {"arg": "output_tensor_lists", "rule": "size", "value": 4, "expected": 3},
        "all_gather_coalesced per input": {"arg": "output_tensor_lists", "rule": "length", "value": 3, "expected": 2},
        "all_gather_into_tensor in the manager": {
            "arg": "outputs",
            "rule": "size",
            "value": world * 3 - 1,
            "expected": world * 3,
        },
        "allgather_into_tensor_coalesced lists": {"arg": "outputs", "rule": "length", "value": 1, "expected": 2},
        "reduce_scatter_tensor_coalesced dtype": {
            "arg": "inputs",
            "rule": "dtype",
            "value": "torch.float64",
            "expected": "torch.float32",
        },
    }


def _one_rank_refuses() -> dict:
    """Rank 1 alone passes a wrong call: the others' call fails with its reason, nobody waits."""
    from hccl_py import HcclParamError

    dist, rank, world = _init("hccl")
    pg = dist.group.WORLD
    seen = {}
    bad = rank == 1
    ts = [torch.ones(2), torch.ones(3, dtype=torch.int64 if bad else torch.float32)]
    try:
        pg.allreduce_coalesced(ts, dist.AllreduceCoalescedOptions()).wait()
        seen["coalesced"] = "ok"
    except dist.DistBackendError as err:
        cause = err.__cause__
        assert isinstance(cause, HcclParamError), repr(cause)
        seen["coalesced"] = [cause.fields.get("refused_by"), cause.fields.get("rule")]
    if rank in (0, 1):  # rank 1 sends two tensors where torch's send takes one; rank 0 receives
        try:
            if bad:
                pg.send([torch.ones(2), torch.ones(2)], 0).wait()
            else:
                pg.recv([torch.empty(2)], 1).wait()
            seen["p2p"] = "ok"
        except dist.DistBackendError as err:
            seen["p2p"] = [err.__cause__.fields.get("refused_by"), err.__cause__.fields.get("rule")]
    t = torch.full((2,), float(rank))
    dist.all_reduce(t)  # the next call pairs up
    seen["next"] = t.tolist()
    dist.destroy_process_group()
    return seen


@pytest.mark.timeout(120)
def test_a_call_one_rank_refuses_in_the_adapter_fails_on_every_rank():
    results = run_ranks(_one_rank_refuses, 3, env={**ENV, "HCCL_EXEC_TIMEOUT": "30"}, timeout=90)
    assert results[1]["coalesced"] == [None, "dtype"] and results[1]["p2p"][1] == "length"
    for rank in (0, 2):
        assert results[rank]["coalesced"] == [1, "dtype"], results[rank]
    assert results[0]["p2p"] == [1, "length"]
    assert all(r["next"] == [3.0, 3.0] for r in results)
