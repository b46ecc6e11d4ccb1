"""Every collective x every algorithm x dtypes, ops rotating, x world sizes against the numpy
reference on random inputs, through real processes and the shared-memory transport."""

from __future__ import annotations

import numpy as np
import pytest

from hccl_py.algorithms.registry import algos_for
from hccl_py.dtypes import ReduceOp, bfloat16
from tests.hccl_py.reference import ALL_DTYPES, assert_matches, digest, rank_input, reduce_reference
from tests.mp import run_ranks

REDUCING = ("allreduce", "reduce", "reduce_scatter")
COLLECTIVES = ("allreduce", "allgather", "broadcast", "reduce", "reduce_scatter")


def _counts(size: int) -> list[int]:
    return [0, 1, 2, size - 1 if size > 1 else 3, size + 1, 37, 1000, 4099]


def _ops_for(dtype: np.dtype) -> list[ReduceOp]:
    ops = [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN]
    if dtype not in (np.dtype(np.int16), bfloat16):
        ops.append(ReduceOp.PROD)
    return ops


def _cases(size: int):
    """(collective, algo, dtype, op, count, root), rotating counts, roots and ops so every value is
    hit: each algorithm runs every dtype, and every op on some dtype (the conformance suite runs
    every algorithm, dtype and op together, on exact inputs)."""
    counts = _counts(size)
    i = 0
    for collective in COLLECTIVES:
        for a, algo in enumerate((*algos_for(collective), "auto")):
            for d, dtype in enumerate(ALL_DTYPES):
                ops = _ops_for(dtype) if collective in REDUCING else [None]
                count = counts[i % len(counts)]
                root = (i * 7) % size
                i += 1
                yield collective, algo, dtype, ops[(a + d) % len(ops)], count, root


def run_case(comm, collective, algo, dtype, op, count, root, case):
    """Run one case on this rank and check it; returns the digest of what must agree across ranks."""
    size, rank = comm.size, comm.rank
    where = f"{case} on rank {rank}"
    if collective == "reduce_scatter":
        inputs = [rank_input(case, r, count * size, dtype, op) for r in range(size)]
        y = inputs[rank].copy()
        part = comm.reduce_scatter(y, op=op, algo=algo)
        assert np.array_equal(y.view(np.uint8), inputs[rank].view(np.uint8)), f"{where}: input modified"
        full = reduce_reference(inputs, op)
        assert_matches(part, full[rank * count : (rank + 1) * count], op, where)
        return None
    inputs = [rank_input(case, r, count, dtype, op) for r in range(size)]
    x = inputs[rank].copy()
    if collective == "allreduce":
        out = comm.all_reduce(x, op=op, algo=algo)
        assert out is x
        assert_matches(x, reduce_reference(inputs, op), op, where)
        return digest(x)
    if collective == "allgather":
        out = comm.all_gather(x, algo=algo)
        assert out.shape == (size, count)
        assert_matches(out, np.stack(inputs), None, where)
        return digest(out)
    if collective == "broadcast":
        comm.broadcast(x, root=root, algo=algo)
        assert_matches(x, inputs[root], None, where)
        return digest(x)
    if collective == "reduce":
        comm.reduce(x, root=root, op=op, algo=algo)
        if rank == root:
            assert_matches(x, reduce_reference(inputs, op), op, where)
        else:
            assert_matches(x, inputs[rank], None, f"{where} (non-root buffer must stay untouched)")
        return None
    raise AssertionError(collective)


def _matrix(size: int) -> list:
    import hccl_py

    comm = hccl_py.init()
    assert (comm.rank, comm.size) == (comm.rank, size)
    digests = []
    for n, (collective, algo, dtype, op, count, root) in enumerate(_cases(size)):
        case = f"{collective}/{algo}/{dtype}/{op}/{count}/{root}/{n}"
        digests.append((case, run_case(comm, collective, algo, dtype, op, count, root, case)))
    comm.barrier()
    return digests


def _assert_identical(results: list) -> None:
    for case_index, (case, first) in enumerate(results[0]):
        for rank, rank_digests in enumerate(results[1:], start=1):
            assert rank_digests[case_index] == (case, first), f"{case}: rank {rank}'s result differs from rank 0's"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
def test_every_collective_algorithm_dtype_and_op(size):
    results = run_ranks(_matrix, size, size, timeout=170)
    _assert_identical(results)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [3, 4])
def test_large_payloads_stream_through_small_staging(size):
    """HCCL_BUFFSIZE=1 (MB): messages are cut into many slot-sized slices and still exact."""
    results = run_ranks(_large, size, 400_003, timeout=110, env={"HCCL_BUFFSIZE": "1"})
    _assert_identical(results)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("single_copy", ["1", "0"])
def test_large_payloads_read_directly_or_through_slots(single_copy):
    """Slices of >= 2 MiB are read straight from the sender's buffer (process_vm_readv), or, with
    HCCL_PY_CMA=0, go through the shared slots: both exact."""
    # int64: every piece is at least 2 MiB but hd's 6 MB halves (a 4 MiB slot's worth + 1.8 MB) in
    # allreduce, broadcast and reduce; float32's ring pieces (2,000,008 B) were all below it
    results = run_ranks(_large, 3, 1_500_007, (("int64", "max"),), timeout=110, env={"HCCL_PY_CMA": single_copy})
    _assert_identical(results)


def _large(count: int, kinds=(("float32", "sum"), ("int64", "max"))) -> list:
    import hccl_py

    comm = hccl_py.init()
    digests = []
    for collective in COLLECTIVES:
        for algo in (*algos_for(collective), "auto"):
            for dtype, op in ((np.dtype(d), ReduceOp[o.upper()]) for d, o in kinds):
                case = f"large/{collective}/{algo}/{dtype}"
                digests.append((case, run_case(comm, collective, algo, dtype, op, count, 1 % comm.size, case)))
    return digests
