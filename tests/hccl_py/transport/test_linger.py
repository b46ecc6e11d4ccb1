"""A rank that exits first still delivers what it holds for a live peer: notices queued behind
the peer's full datagram queue (``Engine.linger``) reach it when it reads again."""

from __future__ import annotations

import pytest

from tests.mp import run_ranks

COMM_ID = 4242  # no communicator of the job: the notices are only counted


def _notices_behind_a_full_queue(count: int) -> int:
    import time

    import hccl_py
    from hccl_py.transport.base import KIND_NOTICE

    comm = hccl_py.init()
    transport = comm._engine.transport
    comm.barrier()
    if comm.rank == 0:
        for seq in range(1, count + 1):
            transport.notify(1, COMM_ID, seq, b"notice")
        held = len(transport.backlog())  # rank 1 reads nothing yet: some wait here
        comm.destroy()  # the world's destroy ends this rank's part (as exit does under hccl-launch)
        return held
    time.sleep(2.0)  # not reading while rank 0 sends and exits
    # Counted wherever they land: read here, or taken by this rank's engine (its progress thread
    # may read the transport too, and keeps notices by communicator).
    got, deadline = 0, time.monotonic() + 20
    while got + len(comm._engine.held_notices.get(COMM_ID, ())) < count and time.monotonic() < deadline:
        got += sum(1 for inc in transport.progress(0.1) if inc.kind == KIND_NOTICE and inc.comm_id == COMM_ID)
    return got + len(comm._engine.held_notices.get(COMM_ID, ()))


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_notices_queued_for_a_busy_peer_are_delivered_after_the_sender_exits():
    count = 40  # more than a datagram queue holds (net.unix.max_dgram_qlen, 10 by default)
    held, got = run_ranks(_notices_behind_a_full_queue, 2, count, timeout=50)
    assert held == 1  # the test's premise: rank 0 exited with notices still queued for rank 1
    assert got == count
