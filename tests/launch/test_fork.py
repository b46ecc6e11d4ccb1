"""hccl-launch's two ways to start a rank (``--start fork``, the default, and ``--start exec``)
give a rank the same interpreter as ``python script.py`` would: argv, path, ``__main__``, its own
random numbers, threads and atexit at exit, and the same exit statuses and tracebacks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch.config import NPU_STANDIN, LaunchConfig

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "scripts" / "semantics.py"

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(60)]


def _launch(start: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", "--start", start, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )


def _lines(stdout: str, rank: int) -> dict[str, str]:
    found = {}
    for line in stdout.splitlines():
        match = re.fullmatch(rf"\[{rank}\] (\w+)=(.*)", line)
        if match:
            found[match[1]] = match[2]
    return found


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_a_rank_sees_the_interpreter_python_script_gives(start):
    done = _launch(start, "--npu", "-n", "3", str(SCRIPT), "ok", "--flag")
    assert done.returncode == 0, done.stderr
    ranks = [_lines(done.stdout, r) for r in range(3)]
    for got in ranks:
        assert got["argv"] == repr([str(SCRIPT), "ok", "--flag"])
        assert got["path0"] == str(SCRIPT.parent)
        assert got["path1"] == str(NPU_STANDIN)  # PYTHONPATH's entries come next, --npu's stand-in first
        assert got["name"] == "__main__" and got["file"] == str(SCRIPT)
        assert got["stdin"] == "''"
        assert got["thread"] == "done" and got["atexit"] == "ran"
    assert len({got["random"] for got in ranks}) == 3  # numpy draws differ per rank, as in fresh processes


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_exit_statuses_and_tracebacks_are_the_interpreters(start):
    exited = _launch(start, "-n", "2", str(SCRIPT), "exit3")
    assert exited.returncode == 3
    assert "exit code 3" in exited.stderr
    assert _lines(exited.stdout, 1)["atexit"] == "ran"  # sys.exit runs atexit handlers

    raised = _launch(start, "-n", "2", str(SCRIPT), "raise")
    assert raised.returncode == 1
    traceback = [line[4:] for line in raised.stderr.splitlines() if line.startswith("[1] ")]
    assert traceback[0] == "Traceback (most recent call last):"
    assert traceback[1].startswith(f'  File "{SCRIPT}"')  # the program's frame first: no launcher frames
    assert traceback[-1] == "ValueError: rank 1 raised this"

    interrupted = _launch(start, "-n", "2", str(SCRIPT), "interrupt")
    assert interrupted.returncode == 130  # an uncaught KeyboardInterrupt ends the process by SIGINT
    assert "signal SIGINT" in interrupted.stderr


def test_a_launcher_with_threads_execs_its_ranks():
    # In a fresh interpreter: the test process itself may hold threads of earlier tests.
    probe = (
        "import sys, threading\n"
        "from launch.config import LaunchConfig\n"
        f"config = LaunchConfig(nproc=2, target={str(SCRIPT)!r})\n"
        "before = config.forks()\n"
        "stop = threading.Event(); other = threading.Thread(target=stop.wait); other.start()\n"
        "after = config.forks()\n"
        "stop.set(); other.join()\n"
        "print(before, after, LaunchConfig(nproc=2, target='x', start='exec').forks(),"
        " LaunchConfig(nproc=2, target='x', python='/usr/bin/python3').forks())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    # a fork copies one thread: only a single-threaded launcher of this interpreter forks
    assert done.stdout.split() == ["True", "False", "False", "False"]
    with pytest.raises(ValueError, match="start must be one of fork, exec"):
        LaunchConfig(nproc=2, target=str(SCRIPT), start="spawn")
