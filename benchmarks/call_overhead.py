"""What one collective call costs in Python, without peers or the OS scheduler in the way.

Rank 0 of an ``n``-rank world runs against a loopback transport whose peers answer at once:
every message rank 0 sends to peer p comes back as p's message of the same call. So the figure
is the runtime's own path (argument checks, call cache, flight record, executor, modeled clock),
repeatable to a few percent where the two-process figures of ``hccl-bench`` swing by 10-30%
on a shared machine. Modeled time on and off alternate, to show what the bookkeeping costs::

    python -m benchmarks.call_overhead                 # allreduce 8 B at n=2 and n=4
    python -m benchmarks.call_overhead -n 4 --bytes 1K --profile
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import numpy as np

from hccl_py.communicator import Communicator
from hccl_py.engine.context import RankContext, load_topology
from hccl_py.engine.executor import Engine
from hccl_py.modeled.card import Device
from hccl_py.transport.base import KIND_INLINE, Incoming, SliceHeader
from topology.units import parse_size


class LoopbackTransport:
    """Every peer mirrors rank 0: what rank 0 sends to peer p arrives as p's message with the
    same call, index and data (so an allreduce of x sums n copies of x). That serves the
    algorithms whose every step swaps equal regions with a peer (oneshot, rd: the small-message
    ones); others receive what rank 0 never sent to that peer, and time out or fail to match."""

    world_rank = 0

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._arrived: list[Incoming] = []

    def max_slice_bytes(self, peer: int) -> int:
        return 4 << 20

    def try_send(self, peer: int, header: SliceHeader, data: np.ndarray) -> bool:
        incoming = Incoming(header, memoryview(data.tobytes()))  # as the peer's own message to rank 0
        incoming.kind, incoming.src = KIND_INLINE, peer
        self._arrived.append(incoming)
        return True

    def progress(self, timeout_s: float) -> list[Incoming]:
        arrived, self._arrived = self._arrived, []
        return arrived

    def release(self, incoming: Incoming) -> None:
        pass

    def flush(self) -> bool:
        return True

    def backlog(self) -> list[int]:
        return []

    def notify(self, peer: int, comm_id: int, seq: int, body: bytes) -> None:
        pass

    def peer_pid(self, peer: int) -> int | None:
        return None

    def peer_alive(self, peer: int) -> bool:
        return True

    def close(self) -> None:
        pass


def loopback_comm(size: int, *, modeled: bool = True) -> Communicator:
    """Rank 0 of a ``size``-rank world on the default topology, its peers mirrored."""
    topology = load_topology(size)
    rc = RankContext(
        Engine(LoopbackTransport(size)),
        Device(topology.card(0), 0),
        topology,
        2.0,
        {},
        time.monotonic(),
        modeled=modeled,
    )  # an algorithm the mirror cannot serve fails in 2 s
    return Communicator(rc, list(range(size)), 0, 1, "world")


def check_mirrored(comm: Communicator, nbytes: int, algo: str) -> None:
    """Raise ValueError unless the mirror serves ``algo`` (the result is size x the input): a
    figure of an algorithm the mirror cannot play would time a call that computes garbage."""
    x = np.arange(max(nbytes // 4, 1), dtype=np.float32)
    expected = comm.size * x
    comm.all_reduce(x, algo=algo)
    if not np.array_equal(x, expected):
        raise ValueError(
            f"the mirrored peers cannot serve algo={algo!r} (a step that does not swap equal regions); "
            "use rd or oneshot"
        )


def per_call_us(comm: Communicator, nbytes: int, algo: str, calls: int) -> float:
    """Microseconds per ``all_reduce`` of ``nbytes`` of float32, over ``calls`` calls."""
    x = np.ones(max(nbytes // 4, 1), np.float32)
    start = time.perf_counter()
    for _ in range(calls):
        comm.all_reduce(x, algo=algo)
    return (time.perf_counter() - start) / calls * 1e6


def measure(size: int, nbytes: int, algo: str = "rd", calls: int = 20000, repeats: int = 7) -> dict[str, float]:
    """Median per-call µs with modeled time on and off, alternating; and the share it costs."""
    comms = {"modeled": loopback_comm(size), "unmodeled": loopback_comm(size, modeled=False)}
    check_mirrored(comms["modeled"], nbytes, algo)
    for comm in comms.values():
        per_call_us(comm, nbytes, algo, min(calls, 2000))  # warm the call cache and the plan
    times: dict[str, list[float]] = {name: [] for name in comms}
    for _ in range(repeats):
        for name, comm in comms.items():
            times[name].append(per_call_us(comm, nbytes, algo, calls))
    out = {name: statistics.median(values) for name, values in times.items()}
    out["bookkeeping"] = (out["modeled"] - out["unmodeled"]) / out["modeled"]
    return out


def main(argv: list[str] | None = None) -> None:
    """Run ``python -m benchmarks.call_overhead`` with ``argv``: per-call µs (wall) with modeled time on
    and off for each ``-n``, and with ``--profile`` cProfile's top functions."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.call_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nranks", type=int, action="append", help="world size (repeatable); default 2 and 4")
    p.add_argument("--bytes", type=parse_size, default=8, help="allreduce size, default 8")
    p.add_argument("--algo", default="rd", help="rd (default) or oneshot: the algorithms mirrored peers can serve")
    p.add_argument("--calls", type=int, default=20000, help="calls per measurement, default 20000")
    p.add_argument("--repeats", type=int, default=7, help="alternating measurements per mode; the median is shown")
    p.add_argument("--profile", action="store_true", help="also print cProfile's top functions (modeled time on)")
    args = p.parse_args(argv)
    print(f"# allreduce of {args.bytes} B, rank 0 against mirrored peers (no processes); median of {args.repeats}")
    print(f"# {'n':>3} {'modeled us':>12} {'unmodeled us':>13} {'bookkeeping':>12}")
    for size in args.nranks or [2, 4]:
        r = measure(size, args.bytes, args.algo, args.calls, args.repeats)
        print(f"  {size:>3} {r['modeled']:>12.2f} {r['unmodeled']:>13.2f} {100 * r['bookkeeping']:>11.1f}%")
        if args.profile:
            comm = loopback_comm(size)
            per_call_us(comm, args.bytes, args.algo, 2000)
            profiler = cProfile.Profile()
            profiler.runcall(per_call_us, comm, args.bytes, args.algo, args.calls)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
