"""``launch.proc.stop_all``: how every launcher path stops its ranks (SIGTERM, grace, SIGKILL),
on real child processes that each lead their own process group."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from launch.proc import stop_all
from tests.mp import LIVENESS_S

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_leaks")]

# Says "ready" once its SIGTERM disposition is in place, then waits to be signalled.
_CHILD = """
import signal, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def _start(mode: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, mode], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    return proc


def _reap(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    codes = []
    for proc in procs:
        codes.append(proc.wait(LIVENESS_S))
        assert proc.stdout is not None
        proc.stdout.close()
    return codes


def test_sigterm_then_sigkill_after_the_grace():
    procs = [_start("default"), _start("ignore")]
    try:
        grace_s = 1.0
        start = time.monotonic()
        killed = stop_all(procs, grace_s)
        elapsed = time.monotonic() - start
    finally:
        for proc in procs:
            proc.kill()
        codes = _reap(procs)
    assert codes == [-signal.SIGTERM, -signal.SIGKILL]
    assert killed == [procs[1]]  # only the one that ignored SIGTERM
    assert elapsed >= grace_s  # SIGKILL never comes before the grace is over


def test_no_grace_waited_when_all_exit():
    procs = [_start("default"), _start("default")]
    try:
        start = time.monotonic()
        killed = stop_all(procs, grace_s=10 * LIVENESS_S)
        elapsed = time.monotonic() - start
    finally:
        for proc in procs:
            proc.kill()
        codes = _reap(procs)
    assert killed == [] and codes == [-signal.SIGTERM, -signal.SIGTERM]
    assert elapsed < LIVENESS_S  # returned once they exited, not after the grace


def test_sigkill_has_no_grace_and_exited_ones_are_left_alone():
    done = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    done.wait(LIVENESS_S)
    procs = [_start("ignore")]
    sent: list[tuple[int, int]] = []

    def send(proc: subprocess.Popen[bytes], sig: int) -> None:
        sent.append((proc.pid, sig))
        proc.send_signal(sig)

    try:
        killed = stop_all([done, *procs], grace_s=10 * LIVENESS_S, sig=signal.SIGKILL, send=send)
    finally:
        for proc in procs:
            proc.kill()
        codes = _reap(procs)
    assert sent == [(procs[0].pid, signal.SIGKILL)]  # nothing to the process that had exited
    assert killed == [] and codes == [-signal.SIGKILL]


def test_give_up_ends_the_grace():
    procs = [_start("ignore")]
    try:
        killed = stop_all(procs, grace_s=10 * LIVENESS_S, give_up=lambda: True)
    finally:
        for proc in procs:
            proc.kill()
        codes = _reap(procs)
    assert killed == procs and codes == [-signal.SIGKILL]
