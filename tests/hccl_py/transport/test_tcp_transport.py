"""The TCP transport (HCCL_PY_TRANSPORT=tcp under launch.spawn): the results and modeled clocks of
shared memory, and a peer that leaves is noticed from its dropped connection, not at the timeout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.mp import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from transport_job import workload  # noqa: E402  (the ranks import it by this name too)

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.mark.timeout(90)
def test_tcp_gives_the_results_and_clocks_of_shm() -> None:
    over_tcp = run_ranks(workload, 3, env={"HCCL_PY_TRANSPORT": "tcp"}, timeout=60)
    over_shm = run_ranks(workload, 3, timeout=60)
    assert over_tcp == over_shm


def _peer_leaves():
    import os

    import numpy as np

    import hccl_py

    # Each rank its own "host": no pid to look at, only the TCP connection tells rank 1 is gone.
    os.environ["HCCL_PY_HOST_ID"] = f"host{os.environ['RANK']}"
    comm = hccl_py.init()
    if comm.rank == 1:
        return "left"
    try:
        comm.all_reduce(np.ones(4, np.float32))
    except hccl_py.HcclRemoteError as err:
        return {"class": type(err).__name__, "peer": err.peer, "op": err.op}
    return "no error"


@pytest.mark.timeout(60)
def test_a_peer_that_leaves_is_noticed_over_tcp() -> None:
    # HCCL_EXEC_TIMEOUT (600 s) is far beyond the call's bound: only noticing the dropped
    # connection passes, whether rank 1 left before rank 0's send or while rank 0 waited.
    got = run_ranks(_peer_leaves, 2, env={"HCCL_PY_TRANSPORT": "tcp", "HCCL_EXEC_TIMEOUT": "600"}, timeout=40)
    assert got[1] == "left"
    assert got[0] == {"class": "HcclRemoteError", "peer": 1, "op": "allreduce"}


SRUN_RANK = """
import numpy as np, hccl_py
comm = hccl_py.init()
x = np.full(3, comm.rank + 1.0)
comm.all_reduce(x)
print(f"rank {comm.rank} of {comm.size}: {x.tolist()}", flush=True)
"""


@pytest.mark.timeout(60)
def test_srun_ranks_without_mpi_meet_through_the_store() -> None:
    """As ``MASTER_ADDR=... MASTER_PORT=... srun -n 4 python prog.py`` starts them (faked here):
    rank and size from Slurm, rank 0 hosts the store, shared memory within a host, TCP across."""
    import os
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HCCL_", "PMI_", "OMPI_", "SLURM_"))
        and k not in ("RANK", "WORLD_SIZE", "RANK_ID", "RANK_SIZE")
    }
    procs = []
    for r in range(4):
        env = {
            **base,
            "SLURM_PROCID": str(r),
            "SLURM_NTASKS": "4",
            "SLURM_LOCALID": str(r % 2),
            "SLURM_STEP_ID": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "HCCL_PY_HOST_ID": f"node{r // 2}",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", SRUN_RANK], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=40) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert [o for o, _ in outs] == [f"rank {r} of 4: [10.0, 10.0, 10.0]\n" for r in range(4)]
    assert "hccl-py: transport shm+tcp (4 ranks, 2 hosts: node0 ranks 0-1, node1 ranks 2-3)" in outs[0][1]


@pytest.mark.timeout(60)
def test_a_stranger_that_names_a_rank_is_not_accepted() -> None:
    # Anyone may reach a TCP port; only a hello carrying the listener's token (published through
    # the store, which takes the job secret) is taken for a rank. The stranger connects first and
    # names rank 0; rank 1 must ignore it and pair with the real rank 0.
    import socket
    import threading
    import time

    import numpy as np

    from hccl_py.transport.base import KIND_HELLO, SliceHeader
    from hccl_py.transport.tcp import LENGTH, TOKEN_BYTES, TcpTransport

    ranks = [TcpTransport(r, 2, [1 - r], "127.0.0.1", 1 << 20) for r in (0, 1)]
    try:
        host, _, port = ranks[1].endpoint.partition("/")[0].rpartition(":")
        stranger = socket.create_connection((host, int(port)))
        forged = (
            LENGTH.pack(TOKEN_BYTES) + SliceHeader.control(KIND_HELLO, 0, nelem=TOKEN_BYTES).pack() + bytes(TOKEN_BYTES)
        )
        stranger.sendall(forged)
        deadline = time.monotonic() + 20
        accepting = threading.Thread(target=ranks[1].connect, args=({0: ranks[0].endpoint}, deadline))
        accepting.start()
        time.sleep(0.2)  # the stranger's hello is read (and refused) before rank 0 connects; order is not asserted
        ranks[0].connect({1: ranks[1].endpoint}, deadline)
        accepting.join(30)
        assert not accepting.is_alive()
        assert stranger.recv(1) == b""  # closed by rank 1
        stranger.close()
        payload = np.arange(4, dtype=np.float32)
        header = SliceHeader(0, 0, 1, 1, 0, 0, 0, 0, 0, 4, 0, 4, 0, 4, -1, 0.0, 0.0)  # comm 1, seq 1: 4 elements
        assert ranks[0].try_send(1, header, payload)
        while not ranks[0].flush():
            pass
        got = []
        while not got and time.monotonic() < deadline:
            got = ranks[1].progress(0.5)
        assert len(got) == 1 and got[0].src == 0
        assert np.array_equal(got[0].array(np.float32), payload)
    finally:
        for t in ranks:
            t.close()
