"""hccl-bench end to end: the console script, skipped peers, bad arguments, running in place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import cli

ROOT = Path(__file__).resolve().parents[2]


def _hccl_bench() -> list[str]:
    script = Path(sys.executable).parent / "hccl-bench"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "benchmarks.cli"]


def _under_hccl_launch(args: str) -> subprocess.CompletedProcess:
    """``hccl-launch <args>`` from the repository root; its output."""
    launcher = Path(sys.executable).parent / "hccl-launch"
    cmd = ([str(launcher)] if launcher.is_file() else [sys.executable, "-m", "launch.cli"]) + args.split()
    return subprocess.run(cmd, capture_output=True, text=True, timeout=50, env=_env(), cwd=ROOT)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _data(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_console_script_prints_a_table_with_no_wrong_results():
    cmd = _hccl_bench() + "allreduce -n 2 -b 8 -e 64K -f 4 -w 1 -i 2".split()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=50, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header = "#       size         count      type   redop    root        time     algbw     busbw   #wrong"
    assert header in proc.stdout
    rows = _data(proc.stdout)
    assert [int(r[0]) for r in rows] == [8, 32, 128, 512, 2048, 8192, 32768]
    assert [r[1:5] for r in rows[:1]] == [["2", "float", "sum", "-1"]]
    assert all(r[8] == "0" for r in rows)
    assert all(float(r[5]) > 0 for r in rows)
    assert "# Out of bounds values : 0 OK" in proc.stdout


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize(
    "peer, module, words",
    [
        ("mpi", "mpi4py", "mpi4py is not installed"),
        ("gloo", "torch", "torch is not installed"),
        ("torch-hccl", "torch", "torch is not installed"),
    ],
)
def test_missing_peer_is_skipped_with_one_line(monkeypatch, capsys, tmp_path, peer, module, words):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: import fails
    out_json = tmp_path / "r.json"
    code = cli.main(
        [
            "broadcast",
            "-n",
            "2",
            "-b",
            "8",
            "-e",
            "32",
            "-f",
            "4",
            "-w",
            "0",
            "-i",
            "1",
            "--repeats",
            "1",
            "--vs",
            peer,
            "--json",
            str(out_json),
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    skip_lines = [line for line in out.splitlines() if line.startswith(f"# skipping {peer}:")]
    assert len(skip_lines) == 1 and words in skip_lines[0]
    assert len(_data(out)) == 2  # hccl-py's two sizes; no ratio table without a peer
    import json

    assert json.loads(out_json.read_text())["implementations"][peer]["status"] == "skipped"


@pytest.mark.parametrize(
    "args, words",
    [
        ("allreduce -b 3X", "not a size"),
        ("allreduce -n 2 -r 2 -b 8 -e 8", "not a rank"),
        ("allreduce -d fp8", "unknown data type"),
        ("allreduce --vs nccl", "unknown peer"),
        ("alltoallvc", "invalid choice"),
        ("allreduce -b 64 -e 8", "-b <= -e"),
        ("allreduce -n 2,x", "comma-separated list"),
    ],
)
def test_bad_arguments_exit_2(capsys, args, words):
    with pytest.raises(SystemExit) as exc:
        cli.main(args.split())
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_runs_in_place_under_hccl_launch():
    proc = _under_hccl_launch("-n 2 -m benchmarks.cli reduce -r 1 -o max -b 8 -e 512 -f 64 -w 1 -i 2 --repeats 1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line[len("[0] ") :] for line in proc.stdout.splitlines() if line.startswith("[0] ")]
    assert not [line for line in proc.stdout.splitlines() if line.startswith("[1] ")]  # rank 0 reports
    rows = _data("\n".join(lines))
    assert [(r[0], r[3], r[4], r[8]) for r in rows] == [("8", "max", "1", "0"), ("512", "max", "1", "0")]


@pytest.mark.parametrize(
    "args, words",
    [
        ("allreduce --algo nosuch -b 8 -e 8", "no algorithm 'nosuch'"),
        ("allreduce -o prod -d bf16 -b 8 -e 8", "does not take dtype bfloat16"),
        ("alltoall --algo ring -b 8 -e 8", "no algorithm 'ring'"),
    ],
)
def test_what_hccl_py_refuses_fails_before_any_rank_starts(capsys, args, words):
    assert cli.main(args.split() + ["--no-progress"]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
def test_several_world_sizes_print_a_scaling_table(tmp_path):
    out_json = tmp_path / "scaling.json"
    cmd = (
        _hccl_bench()
        + f"allreduce -n 3,2 -b 8 -e 512 -f 64 -w 1 -i 2 --repeats 1 --no-progress --json {out_json}".split()
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=80, env=_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# hccl-bench allreduce (AllReduce): 2 ranks" in proc.stdout
    assert "# hccl-bench allreduce (AllReduce): 3 ranks" in proc.stdout
    scaling = proc.stdout[proc.stdout.index("# scaling:") :]
    assert "hccl-py 3/2" in scaling
    rows = _data(scaling)
    assert [r[0] for r in rows] == ["8", "512"] and all(float(r[1]) > 0 for r in rows)
    import json

    doc = json.loads(out_json.read_text())
    assert doc["nranks"] == [2, 3]
    assert all(row["wrong"] == 0 for d in doc["results"] for row in d["implementations"]["hccl"]["rows"])
    assert [round(d["time_ratio"], 2) for d in doc["scaling"]["hccl"]] == [float(r[1]) for r in rows]


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_several_world_sizes_are_refused_in_place():
    """Under a launcher the job's size is given: -n 2,4 cannot start ranks, so it says so."""
    proc = _under_hccl_launch("-n 2 -m benchmarks.cli allreduce -n 2,4 -b 8 -e 8")
    assert proc.returncode != 0
    assert "as ranks of a launcher's job (2 ranks) hccl-bench runs at that size only" in proc.stdout + proc.stderr
