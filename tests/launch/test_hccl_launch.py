"""hccl-launch end to end: rank environment, output tee, logs, failures, signals, no orphans."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launch.cli import parse_args
from tests.mp import assert_gone, read_pids, wait_for_files

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"

pytestmark = pytest.mark.usefixtures("no_leaks")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # The launcher and its ranks import launch/hccl_py and the -m test module from here.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(SCRIPTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _launcher(*args: str) -> list[str]:
    return [sys.executable, "-m", "launch.cli", *args]


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_launcher(*args), env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _by_rank(stdout: str) -> dict[int, dict[str, str]]:
    ranks: dict[int, dict[str, str]] = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"\[(\d+)\] (\w+)=(.*)", line)
        assert match, f"line without a [rank] prefix: {line!r}"
        ranks.setdefault(int(match[1]), {})[match[2]] = match[3]
    return ranks


def _rank_pids(pid_dir: Path, n: int) -> set[int]:
    """The pids the ``n`` ranks of ranks.py wrote to ``pid_dir`` (waiting until all have)."""
    return read_pids(wait_for_files(pid_dir, "rank_*.pid", n))


@pytest.mark.timeout(40)
def test_npu_puts_the_torch_npu_standin_first_on_the_path() -> None:
    from launch.config import NPU_STANDIN

    done = _run("--npu", "-n", "2", str(SCRIPTS / "print_env.py"))
    assert done.returncode == 0, done.stderr
    for got in _by_rank(done.stdout).values():
        assert got["PYTHONPATH"].split(os.pathsep)[0] == str(NPU_STANDIN)
        assert str(ROOT) in got["PYTHONPATH"].split(os.pathsep)  # the caller's path is kept behind it
        assert got["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "<unset>"  # torch autoloads hccl-py's torch_npu, as the real one
        assert got["HCCL_PY_NPU_STRICT"] == "1"  # the hccl backend refuses what Ascend's refuses


@pytest.mark.timeout(40)
def test_every_rank_gets_its_environment_and_a_prefix() -> None:
    done = _run("-n", "3", str(SCRIPTS / "print_env.py"), "a", "--flag")
    assert done.returncode == 0, done.stderr
    ranks = _by_rank(done.stdout)
    assert sorted(ranks) == [0, 1, 2]
    job_ids = {ranks[r]["HCCL_PY_JOB_ID"] for r in ranks}
    ports = {ranks[r]["MASTER_PORT"] for r in ranks}
    stores = {ranks[r]["HCCL_PY_STORE_PORT"] for r in ranks}
    assert len(job_ids) == 1 and re.fullmatch(r"[0-9a-f]{12}", job_ids.pop())
    # hccl-py's store has its own variables; MASTER_PORT is another port, left to torch's env://
    assert len(ports) == len(stores) == 1 and ports != stores and all(0 < int(p) < 65536 for p in ports | stores)
    for r, got in ranks.items():
        for name in ("RANK_ID", "DEVICE_ID", "RANK", "LOCAL_RANK"):
            assert got[name] == str(r), (name, got)
        for name in ("RANK_SIZE", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
            assert got[name] == "3", (name, got)
        assert got["MASTER_ADDR"] == got["HCCL_PY_STORE_ADDR"] == "127.0.0.1"
        assert got["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "<unset>"  # only --npu turns torch's autoload off
        assert got["HCCL_PY_STORE_HOSTED"] == "1" and got["PYTHONUNBUFFERED"] == "1"
        assert got["ARGV"] == "['a', '--flag']"
    lines = done.stderr.splitlines()
    assert lines[0] == "hccl-launch: 3 ranks on topology ascend910-8p (default for 3 cards)"
    assert sorted(lines[1:]) == [f"[{r}] stderr line of rank {r}" for r in range(3)]


@pytest.mark.timeout(40)
def test_module_mode_log_dir_and_fresh_job_ids(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = _run("-n", "2", "--log-dir", str(logs), "-m", "print_env", "x")
    assert done.returncode == 0, done.stderr
    ranks = _by_rank(done.stdout)
    assert [ranks[r]["ARGV"] for r in (0, 1)] == ["['x']", "['x']"]
    for r in (0, 1):
        text = (logs / f"rank_{r}.log").read_text()
        assert f"RANK_ID={r}\n" in text and f"stderr line of rank {r}\n" in text
        assert "[" not in text.splitlines()[0]  # the per-rank file is not prefixed
    again = _by_rank(_run("-n", "1", str(SCRIPTS / "print_env.py")).stdout)
    assert again[0]["HCCL_PY_JOB_ID"] != ranks[0]["HCCL_PY_JOB_ID"]


@pytest.mark.timeout(40)
def test_ranks_reach_the_launchers_store() -> None:
    done = _run("-n", "3", str(SCRIPTS / "ranks.py"), "--store-check")
    assert done.returncode == 0, done.stderr
    arrivals = sorted(int(m) for m in re.findall(r"arrivals=(\d+)", done.stdout))
    assert arrivals == [1, 2, 3]


@pytest.mark.timeout(90)
def test_failing_rank_stops_the_others_and_is_the_root_cause(tmp_path: Path) -> None:
    # The others never finish on their own (--block): the job ends only if they are stopped.
    done = _run(
        "-n",
        "3",
        "--grace",
        "30",
        str(SCRIPTS / "ranks.py"),
        "--fail-rank",
        "1",
        "--code",
        "3",
        "--block",
        "--pid-dir",
        str(tmp_path),
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    report = done.stderr[done.stderr.index("Root Cause (first observed failure)") :]
    assert re.search(r"rank\s+: 1\n", report)
    assert "exit code 3" in report
    assert "| fatal: rank 1 gives up with code 3" in report
    assert "diagnostic line 29" in report and "diagnostic line 5\n" not in report  # a bounded tail
    assert re.search(r"rank 0 .*terminated by launcher \(SIGTERM\)", report)
    assert re.search(r"rank 2 .*terminated by launcher \(SIGTERM\)", report)
    # The failing rank waited for every rank's check-in, so all three wrote their pid.
    assert_gone(_rank_pids(tmp_path, 3))


@pytest.mark.timeout(90)
def test_rank_killed_by_a_signal_is_reported_by_name() -> None:
    done = _run("-n", "2", "--grace", "30", str(SCRIPTS / "ranks.py"), "--sigkill-rank", "1", "--block", timeout=60)
    assert done.returncode == 128 + signal.SIGKILL, done.stderr
    report = done.stderr[done.stderr.index("Root Cause") :]
    assert "signal SIGKILL" in report and "rank 1 about to SIGKILL itself" in report


@pytest.mark.timeout(90)
def test_a_killed_ranks_socket_directory_is_removed_with_the_job() -> None:
    """Rank 1 is SIGKILLed after init and rank 0 stopped: neither removes its own socket; the
    launcher removes them and the job directory (the no_leaks fixture checks that)."""
    from tests.mp import job_dirs

    before = job_dirs()
    done = _run("-n", "2", "--grace", "2", str(SCRIPTS / "ranks.py"), "--init", "--sigkill-rank", "1", "--sleep", "60")
    assert done.returncode == 128 + signal.SIGKILL, done.stderr
    assert job_dirs() == before


@pytest.mark.timeout(90)
def test_job_timeout_stops_everything_with_124() -> None:
    # The ranks never finish (--block), so the 1 s job timeout fires however slowly they start.
    done = _run("-n", "2", "--timeout", "1", "--grace", "30", str(SCRIPTS / "ranks.py"), "--block", timeout=60)
    assert done.returncode == 124, done.stderr
    assert "--timeout 1 s exceeded" in done.stderr


@pytest.mark.timeout(90)
def test_sigint_forwards_and_exits_130(tmp_path: Path) -> None:
    # A long grace: the ranks must have time to print their KeyboardInterrupt however loaded
    # the machine is (the launcher stops waiting as soon as they have exited).
    launcher = subprocess.Popen(
        _launcher("-n", "3", "--grace", "30", str(SCRIPTS / "ranks.py"), "--block", "--pid-dir", str(tmp_path)),
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = _rank_pids(tmp_path, 3)
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
        launcher.wait()
    assert launcher.returncode == 130, err
    assert "KeyboardInterrupt" in err  # the ranks got SIGINT, not a silent kill
    assert "received SIGINT" in err
    assert_gone(pids)


@pytest.mark.timeout(90)
def test_ranks_die_when_the_launcher_is_killed(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        _launcher("-n", "2", str(SCRIPTS / "ranks.py"), "--block", "--pid-dir", str(tmp_path)),
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        pids = _rank_pids(tmp_path, 2)
        launcher.kill()  # SIGKILL: no chance to clean up; PR_SET_PDEATHSIG must do it
    finally:
        launcher.kill()
        launcher.wait()
    assert_gone(pids)


def test_command_line_becomes_a_frozen_config() -> None:
    script = str(SCRIPTS / "ranks.py")
    cfg = parse_args(["-n", "4", "--grace", "1.5", "--timeout", "9", script, "--sleep", "1", "-n", "7"])
    assert (cfg.nproc, cfg.grace_s, cfg.timeout_s, cfg.is_module) == (4, 1.5, 9.0, False)
    assert cfg.args == ("--sleep", "1", "-n", "7")  # everything after the script is the script's
    assert cfg.command() == [sys.executable, script, "--sleep", "1", "-n", "7"]
    assert parse_args(["-n", "2", "-m", "pkg.mod", "a"]).command() == [sys.executable, "-m", "pkg.mod", "a"]
    with pytest.raises(AttributeError):
        cfg.nproc = 8  # type: ignore[misc]
    with pytest.raises(SystemExit):
        parse_args(["-n", "0", script])
    with pytest.raises(SystemExit):
        parse_args(["-n", "2", "no/such/script.py"])


def test_topology_is_chosen_printed_and_checked_before_any_rank_starts(tmp_path):
    done = _run("-n", "4", "--topology", "mixed-4p", str(SCRIPTS / "print_env.py"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == "hccl-launch: 4 ranks on topology mixed-4p"
    bad = _run("-n", "4", "--topology", "ascend999", str(SCRIPTS / "print_env.py"))
    assert bad.returncode == 2 and "ascend999" in bad.stderr and "[0]" not in bad.stdout
    too_many = _run("-n", "5", "--topology", "pcie-4p", str(SCRIPTS / "print_env.py"))
    assert too_many.returncode == 2 and "pcie-4p" in too_many.stderr


TRACED = """
import numpy as np, hccl_py
comm = hccl_py.init()
x = np.ones(1000, np.float32)
comm.all_reduce(x)
comm.all_gather(x)
"""


def test_trace_dir_gets_one_merged_chrome_trace(tmp_path):
    import json

    script = tmp_path / "traced.py"
    script.write_text(TRACED)
    done = _run("-n", "2", "--trace", str(tmp_path / "trace"), str(script))
    assert done.returncode == 0, done.stderr
    trace = json.loads((tmp_path / "trace" / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sorted({(e["pid"], e["tid"]) for e in spans}) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert "trace of 2 ranks written to" in done.stderr
