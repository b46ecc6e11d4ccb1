"""The shared-memory rings of the shm transport: framing, wrap-around, a full ring, the sleeping
flag, and the transport with rings on, off, and on for some pairs only."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from hccl_py.transport import shm_ring
from hccl_py.transport.shm_ring import RING_BYTES, Rings
from tests.mp import run_ranks

pytestmark = pytest.mark.skipif(not shm_ring.supported(), reason="rings are used on x86-64 only")


def _pair() -> tuple[Rings, Rings, list[mmap.mmap]]:
    """Ranks 0 and 1 of a world of 2, in one process: each one's segment, the other's attached."""
    maps = []
    for _ in range(2):
        fd = os.memfd_create("ring-test")
        os.ftruncate(fd, shm_ring.area_bytes(2))
        maps.append(mmap.mmap(fd, shm_ring.area_bytes(2)))
        os.close(fd)
    a, b = Rings(maps[0], 0, 0, 2), Rings(maps[1], 0, 1, 2)
    a.attach(1, maps[1], 0)
    b.attach(0, maps[0], 0)
    return a, b, maps


def _receive(rings: Rings) -> list[bytes]:
    got: list[bytes] = []
    rings.read(lambda data, into: into.append(data), got)
    return got


def test_messages_arrive_whole_and_in_order_across_many_wrap_arounds():
    a, b, _maps = _pair()
    rng = np.random.default_rng(3)
    sent: list[bytes] = []
    received: list[bytes] = []
    for i in range(600):  # ~12 MB through a 256 KiB ring
        size = int(rng.integers(1, 70_000))
        body = rng.integers(0, 256, size, dtype=np.uint8)
        head, payload = (body[:100].tobytes(), body[100:]) if i % 2 else (body.tobytes(), None)
        while not a.write(1, head, payload):  # full: the reader makes room
            received += _receive(b)
        sent.append(body.tobytes())
        if rng.random() < 0.3:
            received += _receive(b)
    received += _receive(b)
    assert received == sent
    assert _receive(b) == []


def test_a_full_ring_refuses_until_the_reader_has_read():
    a, b, _maps = _pair()
    message = b"x" * 60_000
    written = 0
    while a.write(1, message):
        written += 1
    assert written == RING_BYTES // (60_000 + 8 + 0)  # 4 whole messages; a fifth does not fit
    assert b.waiting()
    assert len(_receive(b)) == written and not b.waiting()
    assert a.write(1, message)


def test_a_sender_sees_whether_the_receiver_sleeps():
    a, b, _maps = _pair()
    assert not a.peer_sleeping(1)
    b.set_sleeping(True)
    assert a.peer_sleeping(1) and not b.peer_sleeping(0)
    b.set_sleeping(False)
    assert not a.peer_sleeping(1)


def _exchange(ring_off_ranks: tuple[int, ...], sleeper: int | None) -> dict:
    if int(os.environ["RANK"]) in ring_off_ranks:
        os.environ["HCCL_PY_SHM_RING"] = "0"
    import time

    import hccl_py

    comm = hccl_py.init()
    rank, size = comm.rank, comm.size
    transport = comm._engine.transport
    ok = True
    for count in (2, 12_000, 300_000):  # inline, inline gathered, slots
        inputs = [np.arange(count, dtype=np.float32) * (r + 1) for r in range(size)]
        x = inputs[rank].copy()
        comm.all_reduce(x, algo="oneshot" if count < 100_000 else "ring")
        ok &= np.array_equal(x, np.sum(inputs, axis=0))
        out = comm.all_gather(inputs[rank], algo="mesh")
        ok &= np.array_equal(out.reshape(-1), np.concatenate(inputs))
    if sleeper is not None:  # everyone else waits long enough to fall asleep; the sleeper's send wakes them
        y = np.full(4, rank, np.float32)
        if rank == sleeper:
            time.sleep(0.3)
        comm.all_reduce(y)
        ok &= bool(np.all(y == sum(range(size))))
    doorbells = transport.doorbells
    ring_peers = sorted(transport._ring_peers)
    comm.destroy()
    return {"ok": ok, "ring_peers": ring_peers, "doorbells": doorbells}


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("ring_off, expected_pairs", [
    ((), {0: [1, 2], 1: [0, 2], 2: [0, 1]}),  # every pair by ring
    ((0, 1, 2), {0: [], 1: [], 2: []}),  # HCCL_PY_SHM_RING=0 everywhere: datagrams
    ((1,), {0: [2], 1: [], 2: [0]}),  # rank 1 without rings: its pairs by datagram, 0-2 by ring
])
def test_collectives_are_exact_with_rings_on_off_and_mixed(ring_off, expected_pairs):
    results = run_ranks(_exchange, 3, ring_off, None, timeout=80)
    for rank, result in enumerate(results):
        assert result["ok"]
        assert result["ring_peers"] == expected_pairs[rank]


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_a_rank_asleep_on_its_rings_is_woken_by_the_doorbell():
    results = run_ranks(_exchange, 2, (), 1, timeout=50)
    assert all(r["ok"] for r in results)
    assert results[1]["doorbells"] >= 1  # rank 0 fell asleep waiting; rank 1's message rang for it
