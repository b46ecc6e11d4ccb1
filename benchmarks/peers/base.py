"""The driver-side interface of an implementation, and the process plumbing the peers share."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..collectives import Collective
from ..config import BenchConfig
from ..harness import BackendError, ExtraColumn

__all__ = ["Backend", "importable", "run_workers", "read_result", "worker_env"]

REPO_ROOT = Path(__file__).resolve().parents[2]  # holds the benchmarks package


class Backend(ABC):
    """One implementation as the driver sees it: can it run, and one sweep of it."""

    name: str  # hccl, mpi, gloo: the --vs name
    label: str  # for tables and plots
    extra_columns: tuple[ExtraColumn, ...] = ()  # see harness.ExtraColumn

    @abstractmethod
    def unavailable(self) -> str | None:
        """Why it cannot run on this machine (a one-line reason with the fix), or None."""

    def unsupported(self, cfg: BenchConfig) -> str | None:
        """Why it cannot run this collective/dtype/op, or None."""
        return None

    @abstractmethod
    def version(self) -> str:
        """What exactly is measured (library and version), for headers and JSON."""

    @abstractmethod
    def mode(self, coll: Collective) -> str:
        """How the collective is called: ``in place`` or ``out of place`` (and the call's name)."""

    @abstractmethod
    def run(self, cfg: BenchConfig, progress_path: str | None, workdir: str) -> list[dict[str, Any]]:
        """One whole sweep on ``cfg.nranks`` fresh ranks; rank 0's rows (see harness.run_sweep).

        Raises :class:`BackendError` if the run fails or exceeds ``cfg.timeout_s``.
        """


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


def _kill_tree(proc: subprocess.Popen[bytes], grace_s: float = 2.0) -> None:
    """Stop ``proc`` and its process group (it was started as a group leader): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_workers(commands: Sequence[Sequence[str]], env: dict[str, str], timeout_s: float,
                what: str) -> None:
    """Run ``commands`` concurrently (each in its own process group) until all exit 0.

    If one fails or ``timeout_s`` passes, the others are stopped and :class:`BackendError` says
    which command failed with its last lines of output.
    """
    from launch._proc import pdeathsig_preexec  # the rank's life tied to ours, as hccl-launch does

    procs = []
    try:
        for cmd in commands:
            procs.append(subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          start_new_session=True, preexec_fn=pdeathsig_preexec()))
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
                    raise BackendError(f"{what}: {' '.join(cmd_name(commands[i]))} exited with "
                                       f"{proc.returncode}:\n    " + "\n    ".join(tail))
            if pending and time.monotonic() > deadline:
                raise BackendError(f"{what}: timed out after {timeout_s:g} s (--timeout); stopped")
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill_tree(proc)
            if proc.stdout is not None:
                proc.stdout.close()


def cmd_name(cmd: Sequence[str]) -> list[str]:
    return [Path(cmd[0]).name, *cmd[1:6]]


def read_result(path: str, what: str) -> list[dict[str, Any]]:
    """Rank 0's rows, written by a worker as JSON."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise BackendError(f"{what}: rank 0 wrote no result ({err})") from None
    return data["rows"]
