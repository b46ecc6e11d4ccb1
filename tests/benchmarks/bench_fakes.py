"""In-process stand-ins for an implementation: n threads play n ranks of a numpy reference.

    results = run_threads(2, lambda comm: run_sweep(comm, cfg))      # ThreadComm per rank

The reference computes each collective from the inputs every rank really passed (np.stack and
ufunc.reduce), independently of the expected values the collectives' init() builds, so a
sweep over it checks the data patterns too. ``FaultyComm`` corrupts chosen results.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.harness import ExtraColumn, RankComm

_UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


class _Shared:
    def __init__(self, n: int):
        self.barrier = threading.Barrier(n, timeout=20)
        self.slots: list[Any] = [None] * n


class ThreadComm(RankComm):
    """One rank of the in-process reference implementation."""

    def __init__(self, shared: _Shared, rank: int, size: int):
        self.shared, self.rank, self.size = shared, rank, size
        self.calls = 0  # collective calls bound by the harness that ran

    def _exchange(self, value: Any) -> list[Any]:
        self.shared.slots[self.rank] = value
        self.shared.barrier.wait()
        values = list(self.shared.slots)
        self.shared.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return values

    def _result(self, name: str, send: np.ndarray, op: str, root: int) -> np.ndarray | None:
        inputs = self._exchange(send.copy())
        n, me = self.size, self.rank
        if name in ("alltoall", "alltoallv"):  # block `me` of every rank's input, in rank order (v: equal counts)
            return np.concatenate([np.split(x, n)[me] for x in inputs])
        if name == "scatter":  # block `me` of the root's input (the others send nothing)
            return np.split(inputs[root], n)[me]
        if name == "gather":
            return np.concatenate(inputs) if me == root else None
        stacked = np.stack(inputs)
        if name == "allreduce":
            return _UFUNC[op].reduce(stacked, axis=0).astype(send.dtype)
        if name == "reduce":
            return _UFUNC[op].reduce(stacked, axis=0).astype(send.dtype) if self.rank == root else None
        if name == "broadcast":
            return inputs[root]
        if name == "allgather":
            return stacked.reshape(-1)
        if name == "reducescatter":
            block = send.size // self.size
            return _UFUNC[op].reduce(stacked, axis=0).astype(send.dtype)[self.rank * block : (self.rank + 1) * block]
        raise ValueError(name)

    def bind(self, coll, send, recv, op, root) -> Callable[[], np.ndarray | None]:
        def call() -> None:
            result = self._result(coll.name, send, op, root)
            self.calls += 1
            result = self.corrupt(result, self.calls)
            if result is not None:
                np.copyto(send if recv is None else recv, result.reshape(-1))
            return None

        return call

    def corrupt(self, result: np.ndarray | None, call: int) -> np.ndarray | None:
        return result

    def barrier(self) -> None:
        self.shared.barrier.wait()

    def allreduce_scalar(self, value: float, how: str) -> float:
        return float(_UFUNC[{"max": "max", "min": "min", "sum": "sum"}[how]].reduce(np.array(self._exchange(value))))


class FaultyComm(ThreadComm):
    """Flips element 0 of rank ``bad_rank``'s result on every ``every``-th call."""

    bad_rank = 1
    every = 1

    def corrupt(self, result, call):
        if result is not None and self.rank == self.bad_rank and call % self.every == 0 and result.size:
            result = result.copy()
            result.reshape(-1)[0] = result.reshape(-1)[0] + 1
        return result


class ExtraComm(ThreadComm):
    """Reports a fake "modeled" time of 2 us per call (rank r: 2 + r), as a backend with extra columns would."""

    extra_columns = (
        ExtraColumn("fake_us", "fake(us)"),
        ExtraColumn("fake_busbw", "fbusbw", derive=lambda row: row.busbw_for(row.extra["fake_us"])),
    )

    def extra_start(self) -> int:
        return self.calls

    def extra_stop(self, start: int) -> dict[str, float]:
        return {"fake_us": (self.calls - start) * (2.0 + self.rank)}


def run_threads(n: int, work: Callable[[ThreadComm], Any], comm_class: type[ThreadComm] = ThreadComm) -> list[Any]:
    """``work(comm)`` on n threads, one ThreadComm each; their results in rank order (re-raises)."""
    shared = _Shared(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = work(comm_class(shared, rank, n))
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            shared.barrier.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


class ThreadBackend:
    """A driver-side backend over the thread reference (``run_threads``): records which
    (world size, repeat) it ran in ``log``, for tests of the driver's alternation."""

    extra_columns = ()

    def __init__(self, name: str, log: list[tuple[str, int]], *, refuse_nranks: int | None = None):
        self.name, self.label, self.log, self.refuse_nranks = name, f"ref-{name}", log, refuse_nranks

    def unavailable(self) -> str | None:
        return None

    def unsupported(self, cfg) -> str | None:
        return f"not at {cfg.nranks} ranks" if cfg.nranks == self.refuse_nranks else None

    def version(self) -> str:
        return f"{self.label} 1.0"

    def mode(self, coll) -> str:
        return "in place"

    def run(self, cfg, progress_path, workdir) -> list[dict[str, Any]]:
        from benchmarks.harness import run_sweep

        self.log.append((self.name, cfg.nranks))
        return run_threads(cfg.nranks, lambda comm: run_sweep(comm, cfg))[0]
