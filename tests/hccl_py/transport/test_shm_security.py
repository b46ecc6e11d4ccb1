"""Who can reach a rank over shared memory, and what a malformed message does (issue 13 item 5).

Only the job's own ranks (this user's processes) can reach a rank's socket: the kernel refuses
anyone else at the job directory (EACCES). A malformed datagram from a process that can reach
it becomes an HcclRemoteError naming the sender, never a crash or a wrong result. Tests run as
root, which passes every permission check: the attacker is a child that drops to ``nobody``.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time

import numpy as np
import pytest

import launch
from hccl_py import rundir
from hccl_py.dtypes import DTYPE_CODES
from hccl_py.errors import HcclRemoteError
from hccl_py.transport.base import KIND_ACK, KIND_FIN, KIND_HELLO, KIND_INLINE, KIND_SLOT, SliceHeader
from hccl_py.transport.shm import ShmTransport, socket_name
from tests.mp import run_as_nobody, run_ranks

F32 = DTYPE_CODES[np.dtype(np.float32)]


def _header(
    kind: int, src: int, *, dtype: int = F32, count: int = 4, offset: int = 0, nelem: int = 4, slot: int = -1
) -> bytes:
    return SliceHeader(kind, src, 1, 1, 0, 1, 0, dtype, 0, count, 0, count, offset, nelem, slot, 0.0, 0.0).pack()


@pytest.fixture
def pair():
    """Two connected shared-memory transports (ranks 0 and 1 of a job) in this process."""
    job = f"sec-{os.getpid()}-{time.monotonic_ns()}"
    ranks = [ShmTransport(job, r, 2, 4 << 20, spin_s=0.0, yield_when_spinning=False) for r in range(2)]
    failures: list[BaseException] = []

    def connect(t: ShmTransport) -> None:
        try:
            t.connect({1 - t.world_rank: os.getpid()}, time.monotonic() + 10)
        except BaseException as err:  # noqa: BLE001 - reported below
            failures.append(err)

    threads = [threading.Thread(target=connect, args=(t,)) for t in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not failures, failures
        yield job, ranks
    finally:
        for t in ranks:
            t.close()


def _send_to_rank0(job: str, datagram: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(datagram, rundir.socket_path(job, socket_name("g1", 0, os.getpid())))


MALFORMED = {
    "one byte": (b"\x01", None),
    "empty": (b"", None),
    "a header cut short": (_header(KIND_INLINE, 1)[:20], None),
    "an unknown kind": (_header(99, 1), 1),
    "a sender that is no rank of the job": (_header(KIND_INLINE, 7) + bytes(16), None),
    "an inline payload shorter than its header says": (_header(KIND_INLINE, 1) + bytes(3), 1),
    "elements past the end of the message": (_header(KIND_INLINE, 1, count=4, offset=2, nelem=4) + bytes(16), 1),
    "an unknown dtype": (_header(KIND_INLINE, 1, dtype=250) + bytes(16), 1),
    "a slot outside the sender's segment": (_header(KIND_SLOT, 1, slot=1 << 40), 1),
    "a negative slot": (_header(KIND_SLOT, 1, slot=-4096), 1),
    "an ack for a slot never lent": (_header(KIND_ACK, 1, nelem=1) + np.array([0], np.int64).tobytes(), 1),
    "an ack whose length lies": (_header(KIND_ACK, 1, nelem=3) + np.array([0], np.int64).tobytes(), 1),
    "a read receipt nobody asked for": (_header(KIND_FIN, 1, nelem=1), 1),
    "a second handshake": (_header(KIND_HELLO, 1), 1),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_datagram_is_an_error_naming_its_sender(pair, case: str) -> None:
    job, (rank0, rank1) = pair
    datagram, sender = MALFORMED[case]
    _send_to_rank0(job, datagram)
    with pytest.raises(HcclRemoteError) as info:
        for _ in range(50):
            rank0.progress(0.05)
    err = info.value
    assert err.code == 21 and err.peer == sender and err.nbytes == len(datagram)
    # The transport goes on: a well-formed message still arrives intact.
    rank1.try_send(
        0, SliceHeader(0, 1, 1, 1, 0, 1, 0, F32, 0, 4, 0, 4, 0, 4, -1, 0.0, 0.0), np.arange(4, dtype=np.float32)
    )
    got = []
    for _ in range(50):
        got += rank0.progress(0.05)
        if got:
            break
    assert len(got) == 1 and got[0].array(np.dtype(np.float32)).tolist() == [0.0, 1.0, 2.0, 3.0]


# -- a real job under attack --------------------------------------------------------------------


def _steady_job(flag: str) -> dict:
    """Allreduce integers until ``flag`` exists (and at least 200 times); count wrong results."""
    import hccl_py

    comm = hccl_py.init()
    wrong = done = 0
    while True:
        x = np.full(16384, comm.rank + 1 + done, np.int64)  # 128 KiB: through the slots, not inline
        y = np.full(8, comm.rank + 1 + done, np.int64)
        comm.all_reduce(x)
        comm.all_reduce(y)
        expected = sum(r + 1 + done for r in range(comm.size))
        wrong += int((x != expected).any() or (y != expected).any())
        done += 1
        stop = np.array([done >= 200 and os.path.exists(flag)], np.int32)
        comm.all_reduce(stop, op=hccl_py.ReduceOp.MAX)  # every rank stops after the same call
        if stop[0] or done > 100_000:
            break
    comm.destroy()
    return {"wrong": wrong, "done": done}


def _attack(job_dir: str, paths: list[str], job_id: str) -> dict:
    """As another user: list the job's directory, connect and send to every rank's socket, and
    try the abstract name the ranks used to listen on. The errno of each attempt."""
    seen: dict[str, str] = {}
    try:
        os.listdir(job_dir)
        seen["listdir"] = "ok"
    except OSError as err:
        seen["listdir"] = errno.errorcode[err.errno]
    for i, path in enumerate(paths):
        for how in ("connect", "sendto"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                if how == "connect":
                    s.connect(path)
                else:
                    s.sendto(b"\x03" + bytes(100), path)  # a forged "slot free"
                seen[f"{how} {i}"] = "ok"
            except OSError as err:
                seen[f"{how} {i}"] = errno.errorcode[err.errno]
            finally:
                s.close()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.connect(f"\0hccl_py.{job_id}.0".encode())
        seen["abstract"] = "ok"
    except OSError as err:
        seen["abstract"] = errno.errorcode[err.errno]
    finally:
        s.close()
    return seen


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the attacker as another user (nobody)")
def test_another_user_cannot_reach_the_ranks_and_results_stay_right(tmp_path) -> None:
    job_id = f"attacked-{os.getpid()}"
    flag = str(tmp_path / "attack-done")
    ctx = launch.spawn(_steady_job, 2, args=(flag,), env={"HCCL_PY_JOB_ID": job_id}, timeout=60, join=False)
    try:
        job_dir = rundir.job_dir(job_id)
        deadline = time.monotonic() + 30
        paths: list[str] = []
        while len(paths) < 2 and time.monotonic() < deadline:  # root sees the sockets once both ranks bound
            time.sleep(0.05)
            if os.path.isdir(job_dir):
                paths = sorted(os.path.join(job_dir, name) for name in os.listdir(job_dir))
        assert len(paths) == 2, paths
        seen = run_as_nobody(_attack, job_dir, paths, job_id)
    finally:
        open(flag, "w").close()
    results = ctx.join()
    assert seen["listdir"] == "EACCES"
    assert all(seen[f"{how} {i}"] == "EACCES" for how in ("connect", "sendto") for i in range(2)), seen
    assert seen["abstract"] == "ECONNREFUSED"  # nothing listens in the abstract namespace any more
    assert [r["wrong"] for r in results] == [0, 0]


def _rank1_sends_junk(junk: bytes, ready: str) -> dict:
    """Rank 1, a member of the job, sends ``junk`` to rank 0 once rank 0 is past init and the
    barrier (it says so with the file ``ready``); rank 0 reports what its allreduce raised."""
    import hccl_py
    from tests.mp import wait_for_file

    comm = hccl_py.init()
    comm.barrier()
    if comm.rank == 0:
        open(ready, "w").close()
    else:
        wait_for_file(ready, within=30)
        comm._engine.transport._out_socks[0].send(junk)
    try:
        comm.all_reduce(np.ones(4, np.float32))
    except hccl_py.HcclError as err:
        return {"class": type(err).__name__, "code": int(err.code), "peer": getattr(err, "peer", "absent")}
    finally:
        comm.destroy()
    return {"class": None}


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("junk, sender", [(b"\x01", None), (_header(42, 1), 1)], ids=["one byte", "unknown kind"])
def test_a_malformed_datagram_inside_a_job_fails_the_call_naming_the_sender(junk: bytes, sender, tmp_path) -> None:
    results = run_ranks(_rank1_sends_junk, 2, junk, str(tmp_path / "ready"), timeout=40)
    assert results[0] == {"class": "HcclRemoteError", "code": 21, "peer": sender}
