"""Property-based: arbitrary shapes (including empty and prime-sized), dtypes, ops, roots and
algorithms, drawn by hypothesis in this process and run by real ranks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccl_py.algorithms.registry import algos_for
from hccl_py.dtypes import ReduceOp, bfloat16
from tests.hccl_py.reference import ALL_DTYPES, assert_matches, rank_input, reduce_reference
from tests.mp import run_ranks

COLLECTIVES = ("allreduce", "allgather", "broadcast", "reduce", "reduce_scatter")


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(ALL_DTYPES))
    ops = [op for op in ReduceOp if not (op is ReduceOp.PROD and dtype in (np.dtype(np.int16), bfloat16))]
    collective = draw(st.sampled_from(COLLECTIVES))
    return (
        collective,
        draw(st.sampled_from((*algos_for(collective), "auto"))),
        dtype.name if dtype != bfloat16 else "bfloat16",
        draw(st.sampled_from(ops)).name,
        tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 5, 7, 13, 64, 257]), max_size=3))),
        draw(st.integers(0, 7)),
    )


def _run_cases(cases_to_run) -> int:
    import hccl_py

    comm = hccl_py.init()
    size, rank = comm.size, comm.rank
    for n, (collective, algo, dtype_name, op_name, shape, root) in enumerate(cases_to_run):
        dtype = bfloat16 if dtype_name == "bfloat16" else np.dtype(dtype_name)
        op = ReduceOp[op_name]
        root %= size
        where = f"case {n} {collective}/{algo}/{dtype}/{op_name}/shape={shape}/root={root} on rank {rank}"
        if collective == "reduce_scatter":
            shape = ((shape[0] if shape else 1) * size, *shape[1:])
        count = int(np.prod(shape))
        inputs = [rank_input(where[: where.index(" on rank")], r, count, dtype, op).reshape(shape) for r in range(size)]
        x = inputs[rank].copy()
        if collective == "allreduce":
            comm.all_reduce(x, op=op, algo=algo)
            assert x.shape == shape
            assert_matches(x, reduce_reference(inputs, op), op, where)
        elif collective == "allgather":
            out = comm.all_gather(x, algo=algo)
            assert out.shape == (size, *shape)
            assert_matches(out, np.stack(inputs), None, where)
        elif collective == "broadcast":
            comm.broadcast(x, root=root, algo=algo)
            assert_matches(x, inputs[root], None, where)
        elif collective == "reduce":
            comm.reduce(x, root=root, op=op, algo=algo)
            assert_matches(
                x, reduce_reference(inputs, op) if rank == root else inputs[rank], op if rank == root else None, where
            )
        else:
            part = comm.reduce_scatter(x, op=op, algo=algo)
            assert part.shape == (shape[0] // size, *shape[1:])
            assert_matches(part, np.split(reduce_reference(inputs, op), size)[rank], op, where)
    comm.barrier()
    return len(cases_to_run)


@pytest.mark.timeout(180)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(size=st.sampled_from([2, 3, 4, 5]), batch=st.lists(cases(), min_size=25, max_size=25))
def test_random_shapes_dtypes_ops_and_algorithms(size, batch):
    assert run_ranks(_run_cases, size, batch, timeout=60) == [len(batch)] * size
