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
    errors, results = [], []
    if comm.rank == 0:
        started = threading.Event()

        def worker():
            started.set()
            x = np.ones(8, np.float32)
            results.append(float(comm.all_reduce(x)[0]))  # waits for rank 1, which waits for `go`

        thread = threading.Thread(target=worker)
        thread.start()
        started.wait()
        while not comm._engine.busy.locked():  # the worker is inside its call
            threading.Event().wait(0.001)
        try:
            comm.all_reduce(np.ones(8, np.float32))
        except hccl_py.HcclParamError as err:
            errors.append(int(err.code))
        open(go, "w").close()
        thread.join()
    else:
        while not os.path.exists(go):  # rank 0's worker is inside the call until this rank joins it
            threading.Event().wait(0.005)
        x = np.ones(8, np.float32)
        results.append(float(comm.all_reduce(x)[0]))
    comm.barrier()
    z = np.ones(8, np.float32)
    comm.all_reduce(z)  # still usable, the rejected call consumed nothing
    return {"errors": errors, "results": results, "z": float(z[0])}


@pytest.mark.timeout(60)
def test_second_thread_is_refused_at_once_and_the_first_completes(tmp_path):
    results = run_ranks(_two_threads, 2, str(tmp_path / "go"), timeout=50)
    assert results[0]["errors"] == [1]
    assert results[0]["results"] == [2.0] and results[1]["results"] == [2.0]
    assert results[0]["z"] == results[1]["z"] == 2.0
