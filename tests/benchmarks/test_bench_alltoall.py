"""alltoall, scatter and gather in hccl-bench: sizes as nccl-tests, each rank's input and
expected output against a numpy reference (no processes), root-only buffers in the harness, a
peer that lacks the operation refused at its own column; then the console script end to end
(hccl-py alone, and with --vs mpi where mpi4py is installed)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.collectives import Case, get
from benchmarks.config import DTYPES, BenchConfig
from benchmarks.harness import count_wrong, run_benchmark, run_sweep, size_plan
from tests.benchmarks.bench_fakes import FaultyComm, ThreadBackend, ThreadComm, run_threads

ROOT = Path(__file__).resolve().parents[2]
NEW = ("alltoall", "scatter", "gather")


def _init(name: str, n: int, count: int, dtype: str, root: int = 0) -> list[tuple[np.ndarray, np.ndarray | None]]:
    coll = get(name)
    return [coll.init(Case(r, n, count, DTYPES[dtype].np, "sum", root)) for r in range(n)]


def _reference(name: str, inputs: list[np.ndarray], root: int) -> list[np.ndarray | None]:
    """What each rank must hold afterwards, computed from the inputs alone."""
    n = len(inputs)
    if name == "alltoall":
        blocks = np.stack(inputs).reshape(n, n, -1)  # [source, destination, element]
        return [blocks[:, r, :].reshape(-1) for r in range(n)]
    if name == "scatter":
        return list(inputs[root].reshape(n, -1))
    return [np.concatenate(inputs) if r == root else None for r in range(n)]


# ------------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("name, send_blocks, recv_blocks", [("alltoall", 3, 3), ("scatter", 3, 1), ("gather", 1, 3)])
def test_sizes_are_nccl_tests(name, send_blocks, recv_blocks):
    """Size = the whole n-block buffer (alltoall: the send buffer; scatter: the root's input;
    gather: the gathered output), rounded down to a multiple of n elements, at least one per rank."""
    plan = size_plan(BenchConfig(collective=name, nranks=3, minbytes=8, maxbytes=1024, stepfactor=4))
    assert [p.nbytes for p in plan] == [12, 24, 120, 504]
    for p in plan:
        assert (p.send_count, p.recv_count) == (send_blocks * p.count, recv_blocks * p.count)
        assert p.elements == 3 * p.count


def test_counts_at_four_ranks_fp64():
    assert get("alltoall").counts(64, 8, 4) == (2, 8, 8)
    assert get("scatter").counts(64, 8, 4) == (2, 8, 2)
    assert get("gather").counts(64, 8, 4) == (2, 2, 8)
    assert get("alltoall").counts(8, 8, 4) == (1, 4, 4)  # at least one element per block


# ------------------------------------------------------------------- data against numpy


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("n, root", [(1, 0), (2, 1), (3, 0), (5, 3)])
@pytest.mark.parametrize("count", [1, 7, 101])
@pytest.mark.parametrize("dtype", ["fp32", "int8", "bf16", "uint8"])
def test_expected_output_is_the_numpy_reference(name, n, root, count, dtype):
    cases = _init(name, n, count, dtype, root)
    inputs = [send for send, _ in cases]
    point_count = get(name).counts(n * count * DTYPES[dtype].itemsize, DTYPES[dtype].itemsize, n)
    assert point_count[0] == count
    for r, send in enumerate(inputs):
        assert send.dtype == DTYPES[dtype].np
        sends_nothing = name == "scatter" and r != root
        assert send.size == (0 if sends_nothing else point_count[1])
    for r, (want, (_, expected)) in enumerate(zip(_reference(name, inputs, root), cases)):
        if want is None:
            assert expected is None  # gather off the root: nothing received, nothing checked
            continue
        assert expected.size == point_count[2] and expected.dtype == want.dtype
        assert count_wrong(expected, want) == 0, (name, r)


@pytest.mark.parametrize("name", NEW)
def test_every_block_differs_from_every_other_at_every_element(name):
    """A block that reaches the wrong rank or the wrong slot is wrong in all its elements, even
    when the block is a multiple of the pattern's period (101)."""
    n, count = 5, 101
    cases = _init(name, n, count, "int8", root=2)
    buffers = [send for send, _ in cases if send.size] if name != "gather" else [cases[2][1]]
    blocks = [b for buf in buffers for b in buf.reshape(-1, count)]
    assert len(blocks) == (n * n if name == "alltoall" else n)
    for i, a in enumerate(blocks):
        for b in blocks[i + 1 :]:
            assert np.all(a != b)


# ------------------------------------------------------------ the harness, in process


class _Recording(ThreadComm):
    """Records the buffer sizes the harness binds."""

    def bind(self, coll, send, recv, op, root):
        self.seen = getattr(self, "seen", set()) | {(send.size, None if recv is None else recv.size)}
        return super().bind(coll, send, recv, op, root)


@pytest.mark.parametrize("name, budget", [("scatter", 20), ("gather", 50)])
def test_only_the_root_has_the_root_only_buffer_and_chunks_stay_in_step(name, budget):
    # 5 iterations, outputs of 8 (scatter) or 24 (gather, at the root) bytes: 2 per chunk on
    # every rank (the chunking follows the sizes, not the rank's buffers, or the barriers would not match)
    cfg = BenchConfig(
        collective=name,
        nranks=3,
        root=1,
        minbytes=24,
        maxbytes=24,
        stepfactor=1,
        warmup=1,
        iters=5,
        repeats=1,
        mem_budget=budget,
    )
    rows = run_threads(3, lambda comm: (run_sweep(comm, cfg), comm.seen), comm_class=_Recording)
    (row,), _ = rows[0]
    assert row["wrong"] == 0 and row["buffers"] == 2 and row["size"] == 24
    seen = [s for _, s in rows]
    if name == "scatter":
        assert seen == [{(0, 2)}, {(6, 2)}, {(0, 2)}]
    else:
        assert seen == [{(2, 0)}, {(2, 6)}, {(2, 0)}]


@pytest.mark.parametrize(
    "name, bad_rank, wrong",
    [
        ("alltoall", 1, 7),
        ("scatter", 2, 7),
        ("gather", 1, 7),
        ("gather", 0, 0),
    ],
)
def test_the_check_catches_a_wrong_result(name, bad_rank, wrong):
    class Bad(FaultyComm):
        pass

    Bad.bad_rank = bad_rank
    cfg = BenchConfig(
        collective=name, nranks=3, root=1, minbytes=96, maxbytes=96, stepfactor=1, warmup=2, iters=5, repeats=1
    )
    rows = run_threads(3, lambda comm: run_sweep(comm, cfg), comm_class=Bad)
    assert rows[0][0]["wrong"] == wrong  # one element in each of 7 calls; gather off the root is not checked


def test_a_peer_without_the_operation_is_refused_at_its_column(monkeypatch):
    from benchmarks.peers import gloo, mpi
    from benchmarks.report import format_report, to_json

    for backend in (mpi.MpiBackend(), gloo.GlooBackend()):
        for name in NEW:
            assert backend.unsupported(BenchConfig(collective=name)) is None
            assert backend.mode(get(name))
    monkeypatch.delitem(gloo.TORCH_CALLS, "alltoall")
    monkeypatch.setattr(gloo.GlooBackend, "unavailable", lambda self: None)
    log = io.StringIO()
    cfg = BenchConfig(
        collective="alltoall",
        nranks=2,
        minbytes=8,
        maxbytes=64,
        stepfactor=8,
        warmup=1,
        iters=2,
        repeats=1,
        peers=("gloo",),
    )
    result = run_benchmark(cfg, [ThreadBackend("hccl", []), gloo.GlooBackend()], log=log, progress=False)
    assert log.getvalue() == "# skipping gloo: no torch.distributed binding for alltoall\n"
    assert [i.name for i in result.ok] == ["hccl"] and [r.wrong for r in result.impls["hccl"].rows] == [0, 0]
    doc = to_json(result)
    assert doc["implementations"]["gloo"]["status"] == "skipped"
    assert doc["implementations"]["gloo"]["reason"] == "no torch.distributed binding for alltoall"
    assert doc["title"] == "AlltoAll" and doc["bus_factor"] == 0.5
    assert "# hccl-bench alltoall (AlltoAll): 2 ranks" in format_report(result)


def test_scatter_and_gather_report_their_root():
    from benchmarks.report import format_report

    for name in ("scatter", "gather"):
        cfg = BenchConfig(
            collective=name, nranks=3, root=2, minbytes=12, maxbytes=12, stepfactor=1, warmup=0, iters=1, repeats=1
        )
        result = run_benchmark(cfg, [ThreadBackend("hccl", [])], log=io.StringIO(), progress=False)
        text = format_report(result)
        assert "root 2" in text.splitlines()[0]
        (row,) = [line.split() for line in text.splitlines() if not line.startswith("#")]
        assert row[:5] == ["12", "3", "float", "none", "2"] and row[8] == "0"


# ------------------------------------------------------------------------- end to end


def _hccl_bench() -> list[str]:
    script = Path(sys.executable).parent / "hccl-bench"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "benchmarks.cli"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _run(args: str, timeout: float = 80) -> subprocess.CompletedProcess:
    return subprocess.run(
        _hccl_bench() + args.split(), capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT
    )


def _data(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
def test_console_script_alltoall(tmp_path):
    out_json, out_png = tmp_path / "a2a.json", tmp_path / "a2a.png"
    plot = f" --plot {out_png}" if _has("matplotlib") else ""
    proc = _run(f"alltoall -n 2 -b 8 -e 64K -f 8 --no-progress --json {out_json}{plot}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# hccl-bench alltoall (AlltoAll): 2 ranks, type float," in proc.stdout
    assert "# hccl-py: hccl-py" in proc.stdout and "all_to_all(x, out=buf); algo=auto" in proc.stdout
    rows = _data(proc.stdout)
    assert [int(r[0]) for r in rows] == [8, 64, 512, 4096, 32768]
    assert [int(r[1]) for r in rows] == [2, 16, 128, 1024, 8192]
    assert all(r[2:5] == ["float", "none", "-1"] and r[8] == "0" and float(r[5]) > 0 for r in rows)
    assert "# Out of bounds values : 0 OK" in proc.stdout
    doc = json.loads(out_json.read_text())
    assert (doc["collective"], doc["title"], doc["bus_factor"]) == ("alltoall", "AlltoAll", 0.5)
    hccl = doc["implementations"]["hccl"]
    assert hccl["status"] == "ok" and [r["wrong"] for r in hccl["rows"]] == [0] * 5
    assert all(r["extra"]["modeled_us"] > 0 for r in hccl["rows"])
    if plot:
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _has(module: str) -> bool:
    from benchmarks.peers.base import importable

    return importable(module)


def _require_mpi() -> None:
    from benchmarks.peers import get_backend

    reason = get_backend("mpi").unavailable()
    if reason:
        pytest.skip(f"mpi: {reason}")


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize(
    "args, call",
    [
        ("alltoall -b 8 -e 64K -f 8", "Alltoall(x, out)"),
        ("scatter -r 1 -b 8 -e 512 -f 64 -d int8", "Scatter(x on root / None, out, root)"),
        ("gather -r 1 -b 8 -e 512 -f 64 -d bf16", "Gather(x, out on root / None, root)"),
    ],
)
def test_console_script_vs_mpi(tmp_path, args, call):
    _require_mpi()
    out_json = tmp_path / "r.json"
    proc = _run(f"{args} -n 2 -w 1 -i 2 --repeats 1 --vs mpi --timeout 60 --no-progress --json {out_json}", timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# MPICH (mpi4py): " in proc.stdout and call in proc.stdout
    assert "time/mpi" in proc.stdout
    doc = json.loads(out_json.read_text())
    for name in ("hccl", "mpi"):
        impl = doc["implementations"][name]
        assert impl["status"] == "ok" and impl["rows"] and all(r["wrong"] == 0 for r in impl["rows"]), name
    assert [d["size"] for d in doc["ratios"]["mpi"]] == [r["size"] for r in doc["implementations"]["hccl"]["rows"]]
