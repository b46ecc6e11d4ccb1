"""The process plumbing the peers share: their workers' environment, running them, reading their rows."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..harness import BackendError

__all__ = ["importable", "run_workers", "read_result", "worker_env", "write_result"]

REPO_ROOT = Path(__file__).resolve().parents[2]  # holds the benchmarks package
STOP_GRACE_S = 2.0  # a worker still running when the run ends gets SIGTERM, then SIGKILL after this


def importable(module: str) -> bool:
    """Whether ``import module`` would find it, without importing it (no MPI_Init, no torch load)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for worker processes: ours, with this checkout importable."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    env.update(extra or {})
    return env


def run_workers(commands: Sequence[Sequence[str]], env: dict[str, str], timeout_s: float, what: str) -> None:
    """Run ``commands`` concurrently (each in its own process group) until all exit 0.

    If one fails or ``timeout_s`` passes, the others are stopped and :class:`BackendError` says
    which command failed with its last lines of output.
    """
    # Imported here: the workers import this module and never load launch or hccl_py.
    from launch.proc import pdeathsig_preexec, stop_all  # the ranks' lives tied to ours, as hccl-launch does

    procs = []
    try:
        for cmd in commands:
            procs.append(
                subprocess.Popen(
                    list(cmd),
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=pdeathsig_preexec(),
                )
            )
        deadline = time.monotonic() + timeout_s
        outputs: dict[int, bytes] = {}
        pending = dict(enumerate(procs))
        while pending:
            for i, proc in list(pending.items()):
                try:
                    out, _ = proc.communicate(timeout=0.05)
                except subprocess.TimeoutExpired:
                    continue
                outputs[i] = out
                del pending[i]
                if proc.returncode != 0:
                    tail = out.decode(errors="replace").strip().splitlines()[-12:]
                    raise BackendError(
                        f"{what}: {' '.join(cmd_name(commands[i]))} exited with "
                        f"{proc.returncode}:\n    " + "\n    ".join(tail)
                    )
            if pending and time.monotonic() > deadline:
                raise BackendError(f"{what}: timed out after {timeout_s:g} s (--timeout); stopped")
    finally:
        stop_all(procs, STOP_GRACE_S)  # each process group: SIGTERM, then SIGKILL after the grace
        for proc in procs:
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass  # SIGKILLed but not gone yet (stuck in the kernel): do not hang the driver
            if proc.stdout is not None:
                proc.stdout.close()


def cmd_name(cmd: Sequence[str]) -> list[str]:
    """A command shortened for messages: the program's file name and the next five arguments."""
    return [Path(cmd[0]).name, *cmd[1:6]]


def write_result(path: str, rows: list[dict[str, Any]]) -> None:
    """Rank 0's rows of its sweep, as a worker hands them to the driver (JSON)."""
    Path(path).write_text(json.dumps({"rows": rows}))


def read_result(path: str, what: str) -> list[dict[str, Any]]:
    """Rank 0's rows, written by a worker with :func:`write_result`."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise BackendError(f"{what}: rank 0 wrote no result ({err})") from None
    return data["rows"]
