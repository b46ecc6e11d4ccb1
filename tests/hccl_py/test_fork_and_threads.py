"""A rank's communicators belong to its own process and to one thread at a time: a forked child
and a second concurrent thread get a clear HcclError, and the rank's job goes on unharmed."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from tests.mp import run_ranks


def _fork_uses_communicator() -> dict:
    import hccl_py

    comm = hccl_py.init()
    x = np.full(64, comm.rank + 1, np.float32)
    comm.all_reduce(x)
    child = {}
    if comm.rank == 0:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: every use of the parent's job is refused
            os.close(read)
            found = []
            for attempt in (lambda: comm.all_reduce(np.ones(4, np.float32)), comm.barrier, hccl_py.init):
                try:
                    attempt()
                    found.append("no error")
                except hccl_py.HcclInternalError as err:
                    found.append(int(err.code))
                except BaseException as err:  # noqa: BLE001  (anything else is the bug this test catches)
                    found.append(type(err).__name__)
            os.write(write, repr(found).encode())
            os._exit(0)
        os.close(write)
        child["codes"] = eval(os.read(read, 4096).decode())
        os.close(read)
        child["status"] = os.waitpid(pid, 0)[1]
    y = np.full(1 << 16, comm.rank + 1, np.float32)  # the parent's job goes on, with a slot-sized payload too
    comm.all_reduce(y)
    comm.all_reduce(x)
    return {"child": child, "y": float(y[0]), "x": float(x[0])}


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_forked_child_cannot_use_or_join_the_job():
    results = run_ranks(_fork_uses_communicator, 3, timeout=50)
    assert results[0]["child"] == {"codes": [4, 4, 4], "status": 0}
    for r in results:
        assert r["y"] == 6.0 and r["x"] == 3 * 6.0


def _two_threads(go: str) -> dict:
    import hccl_py

    comm = hccl_py.init()
    errors, refused = [], []
    if comm.rank == 0:
        started = threading.Event()

        def worker():
            started.set()
            x = np.ones(8, np.float32)
            try:
                comm.all_reduce(x)  # waits for rank 1, which waits for `go`
            except hccl_py.HcclError as err:
                errors.append(str(err))

        thread = threading.Thread(target=worker)
        thread.start()
        started.wait()
        while not comm._engine.guard.busy.locked():  # the worker is inside its call
            threading.Event().wait(0.001)
        try:
            comm.all_reduce(np.ones(8, np.float32))
        except hccl_py.HcclParamError as err:
            refused.append(
                {
                    "code": int(err.code),
                    "rule": err.rule,
                    "holder_op": err.holder_op,
                    "holder_thread": err.holder_thread == thread.ident,
                }
            )
        open(go, "w").close()
        thread.join()
    else:
        while not os.path.exists(go):  # rank 0's worker is inside the call until this rank joins it
            threading.Event().wait(0.005)
        try:
            comm.all_reduce(np.ones(8, np.float32))
        except hccl_py.HcclError as err:
            errors.append(str(err))
    try:
        comm.barrier()
    except hccl_py.HcclInternalError as err:
        errors.append(err.state)
    return {"refused": refused, "errors": errors}


@pytest.mark.timeout(60)
def test_second_thread_is_refused_at_once_and_the_communicator_aborted_on_every_rank(tmp_path):
    # The ranks cannot agree which thread's call comes first (another rank may have refused the
    # other thread), so a collision aborts the communicator everywhere, never a silent divergence.
    results = run_ranks(_two_threads, 2, str(tmp_path / "go"), env={"HCCL_EXEC_TIMEOUT": "30"}, timeout=50)
    assert results[0]["refused"] == [{"code": 1, "rule": "thread", "holder_op": "all_reduce", "holder_thread": True}]
    for r in results:
        first, state = r["errors"]
        assert "in use by thread" in first and "aborted on every rank" in first
        assert state == "aborted"
