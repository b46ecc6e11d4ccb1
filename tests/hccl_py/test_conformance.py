"""The conformance suite (``conformance.py``): mpi4py's and torch's collective semantics, case by
case, at world sizes 1-5 and 8, every algorithm, on the world and on sub-groups."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.hccl_py import conformance
from tests.mp import run_ranks

LARGE_COUNT = 300_007  # float32: 1.2 MB, above HCCL_BUFFSIZE=1 (MB): many slices per message
SUBGROUP_DTYPES = [np.dtype(np.int8), np.dtype(np.float32), conformance.bfloat16]
SIZES = [1, 2, 3, 4, 5, 8]


def _groups(world):
    """torch's ``_init_group_test`` group [1, 2], MPI_Comm_split by parity, and a group listed
    in reverse order (its rank 0 is the world's last rank)."""
    size = world.size
    yield world, conformance.DTYPES
    halves = world.split(color=world.rank % 2, key=world.rank)
    yield halves, SUBGROUP_DTYPES
    if size >= 3:
        pair = world.create_group([1, 2])
        if pair is not None:
            yield pair, SUBGROUP_DTYPES
    if size >= 2:
        backwards = world.create_group(list(reversed(range(size))))
        yield backwards, SUBGROUP_DTYPES


def _run_suite(size: int) -> dict:
    import hccl_py

    world = hccl_py.init()
    digests, ran = [], 0
    started = time.monotonic()
    for comm, dtypes in _groups(world):
        cases = [*conformance.basic_cases(comm.size, dtypes), *conformance.operator_cases(comm.size, dtypes)]
        if comm is world:
            cases += [
                *conformance.overlap_cases(comm.size),
                *conformance.out_overlap_cases(comm.size),
                *conformance.bitwise_cases(comm.size),
                # At 8 ranks one kind: the slicing is the same at every size, and 8 ranks on 2 cores
                # is the suite's longest test (the int64/max pass runs at 1-5 ranks)
                *conformance.large_cases(
                    comm.size, LARGE_COUNT, conformance.LARGE_KINDS if comm.size <= 5 else conformance.LARGE_KINDS[:1]
                ),
            ]
        for case in cases:
            try:
                result = case.run(comm)
            except AssertionError as err:
                raise AssertionError(f"{comm.name}: {case.name}: {err}") from None
            ran += 1
            if result is not None:
                digests.append((comm.name, tuple(comm.world_ranks), case.name, result))
    world.barrier()
    return {"digests": digests, "cases": ran, "wall_s": time.monotonic() - started}


def _assert_identical_on_every_member(results: list[dict]) -> None:
    by_case: dict[tuple, dict[int, str]] = {}
    for world_rank, result in enumerate(results):
        for comm, members, case, value in result["digests"]:
            by_case.setdefault((comm, members, case), {})[world_rank] = value
    for (comm, members, case), values in by_case.items():
        assert set(values) == set(members), f"{comm}: {case}: ran on {sorted(values)}, members {members}"
        assert len(set(values.values())) == 1, f"{comm}: {case}: results differ between ranks: {values}"


@pytest.mark.parametrize("size", SIZES)
def test_rotated_ops_still_meet_every_algorithm_dtype_op_and_count(size):
    """The reduction cases rotate the op instead of multiplying by it; every (algorithm, dtype, op),
    (algorithm, count, op) and (algorithm, dtype, count or root) is still run."""
    met = {"dtype-op": set(), "count-op": set(), "dtype-place": set()}
    for case in conformance.basic_cases(size):
        collective, *fields = case.name.split("/")
        if collective in ("allreduce", "reduce", "reduce_scatter"):
            algo, dtype, op, *place = fields
            met["dtype-op"].add((collective, algo, dtype, op))
            met["dtype-place"].add((collective, algo, dtype, place[0]))
            if collective != "reduce":
                met["count-op"].add((collective, algo, place[0], op))
    for collective in ("allreduce", "reduce", "reduce_scatter"):
        for algo in conformance.algos(collective):
            places = (
                [f"root{r}" for r in range(size)]
                if collective == "reduce"
                else [f"n{n}" for n in conformance.counts(size)]
            )
            for dtype in conformance.DTYPES:
                for op in conformance.ops_for(dtype):
                    assert (collective, algo, str(dtype), op.name) in met["dtype-op"]
                for place in places:
                    assert (collective, algo, str(dtype), place) in met["dtype-place"]
            if collective != "reduce":
                for place in places:
                    for op in conformance.OPS:
                        assert (collective, algo, place, op.name) in met["count-op"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("size", SIZES)
def test_conformance(size):
    results = run_ranks(_run_suite, size, size, timeout=230, env={"HCCL_BUFFSIZE": "1"})
    _assert_identical_on_every_member(results)
    print(f"conformance n={size}: {results[0]['cases']} cases on rank 0 in {results[0]['wall_s']:.1f} s")
