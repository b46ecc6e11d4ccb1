"""all_gather_v and reduce_scatter_v (HCCL's AllGatherV and ReduceScatterV): blocks of another
size per rank, against a numpy reference at 2-4 ranks, blocking and asynchronous; counts that
disagree between ranks are a call mismatch on every rank even where the largest count agrees;
counts that do not fit the buffers are refused on every rank before anything moves."""

from __future__ import annotations

import numpy as np
import pytest

from tests.mp import run_ranks

pytestmark = pytest.mark.usefixtures("no_leaks")


def _counts(size: int) -> list[int]:
    return [(3 * r + 1) % 4 for r in range(size)]  # 1, 0, 3, 2: an empty block among them


def _block(rank: int, n: int, dtype) -> np.ndarray:
    return (np.arange(n) + 10 * rank).astype(dtype)


def _job() -> dict:
    import hccl_py

    comm = hccl_py.init()
    rank, size = comm.rank, comm.size
    counts = _counts(size)
    seen = {}
    for dtype in (np.float32, np.int64):
        rows = comm.all_gather_v(_block(rank, counts[rank], dtype), counts)
        seen[f"all_gather_v {np.dtype(dtype).name}"] = rows.tolist()
        work = comm.all_gather_v(_block(rank, counts[rank], dtype), counts, async_op=True)
        seen[f"all_gather_v async {np.dtype(dtype).name}"] = work.wait().tolist()
        y = np.concatenate([_block(rank, n, dtype) for n in counts])
        seen[f"reduce_scatter_v {np.dtype(dtype).name}"] = comm.reduce_scatter_v(y, counts).tolist()
        seen[f"reduce_scatter_v max {np.dtype(dtype).name}"] = comm.reduce_scatter_v(y, counts, "max").tolist()
    for name, call in {
        "short counts": lambda: comm.all_gather_v(np.ones(counts[rank], np.float32), counts[:-1]),
        "own count": lambda: comm.all_gather_v(np.ones(counts[rank] + (rank == 0), np.float32), counts),
        "y size": lambda: comm.reduce_scatter_v(np.ones(sum(counts) + (rank == 0), np.float32), counts),
    }.items():
        try:
            call()
            seen[name] = "ok"
        except hccl_py.HcclParamError as err:
            seen[name] = [err.rule, err.fields.get("refused_by")]
    x = np.ones(2, np.float32)
    comm.all_reduce(x)  # the communicator stays usable
    seen["after"] = x.tolist()
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_blocks_of_other_sizes_gather_and_reduce_as_numpy_says(size):
    results = run_ranks(_job, size, timeout=100)
    counts = _counts(size)
    width = max(counts)
    for dtype in ("float32", "int64"):
        rows = np.zeros((size, width))
        for r, n in enumerate(counts):
            rows[r, :n] = _block(r, n, np.float64)
        total = [sum(_block(r, n, np.float64) for r in range(size)) for n in counts]
        biggest = [np.max([_block(r, n, np.float64) for r in range(size)], axis=0) if n else [] for n in counts]
        for rank, seen in enumerate(results):
            assert seen[f"all_gather_v {dtype}"] == rows.tolist() == seen[f"all_gather_v async {dtype}"]
            assert seen[f"reduce_scatter_v {dtype}"] == list(np.asarray(total[rank]).reshape(-1))
            assert seen[f"reduce_scatter_v max {dtype}"] == list(np.asarray(biggest[rank]).reshape(-1))
    for rank, seen in enumerate(results):
        assert seen["short counts"] == ["shape", None]
        assert seen["own count"] == (["own", None] if rank == 0 else ["own", 0])
        assert seen["y size"] == (["size", None] if rank == 0 else ["size", 0])
        assert seen["after"] == [float(size)] * 2


def _disagree(kind: str) -> str:
    import hccl_py

    comm = hccl_py.init()
    counts = [3, 1, 2] if comm.rank == 0 else [1, 3, 2]  # the same largest count, other blocks
    try:
        if kind == "all_gather_v":
            comm.all_gather_v(np.ones(counts[comm.rank], np.float32), counts)
        else:
            comm.reduce_scatter_v(np.ones(6, np.float32), counts)
        return "returned"
    except hccl_py.HcclError as err:
        return str(err)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["all_gather_v", "reduce_scatter_v"])
def test_ranks_whose_counts_differ_fail_with_a_call_mismatch(kind):
    results = run_ranks(_disagree, 3, kind, env={"HCCL_EXEC_TIMEOUT": "600"}, timeout=100)
    assert all("call mismatch" in seen for seen in results), results
    assert any("counts #" in seen for seen in results), results
