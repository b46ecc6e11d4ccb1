"""Issue 27 item 6: an asynchronous call's handle in a forked child, and bad arguments to
``Work.wait``, ``dump_flight_recorder`` and the simulated card's kernels: each an HcclError with
fields (never a raw TypeError, ValueError or AttributeError, never a wait without end)."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import numpy as np
import pytest

import hccl_py
from hccl_py import HcclInternalError, HcclParamError, HcclSyscallError
from hccl_py.modeled.card import Device
from tests.mp import run_ranks, wait_for_file
from topology import Topology

CHILD_BOUND_S = 20  # a forked child that would wait forever is killed by SIGALRM after this


@pytest.fixture
def comm(monkeypatch):
    """A world of one (this process), destroyed after the test."""
    for name in ("RANK_ID", "RANK_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    c = hccl_py.init()
    yield c
    c.destroy()


def _wait_in_forked_child(go: str) -> dict:
    import hccl_py

    comm = hccl_py.init()
    x = np.full(1024, comm.rank + 1, np.float32)
    if comm.rank == 1:
        wait_for_file(go, within=40)  # rank 0's call stays pending until its child has tried
        comm.all_reduce(x)
        return {"sum": float(x[0])}
    work = comm.all_reduce(x, async_op=True)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the handle is the parent's, its call ends on the parent's progress thread
        os.close(read)
        signal.alarm(CHILD_BOUND_S)  # without the fix wait() never returns
        try:
            work.wait()
            found = {"raised": None}
        except hccl_py.HcclError as err:
            found = {
                "raised": type(err).__name__,
                "state": err.state,
                "owner_pid": err.owner_pid,
                "message": err.message,
            }
        except BaseException as err:  # noqa: BLE001  (anything else is the bug this test catches)
            found = {"raised": type(err).__name__}
        os.write(write, repr(found).encode())
        os._exit(0)
    os.close(write)
    child = eval(os.read(read, 65536).decode() or "{}")
    os.close(read)
    status = os.waitpid(pid, 0)[1]
    Path(go).write_text("go")
    work.wait()  # the parent's handle is unharmed
    return {"sum": float(x[0]), "child": child, "status": status, "pid": os.getpid()}


@pytest.mark.timeout(90)
@pytest.mark.usefixtures("no_leaks")
def test_wait_in_a_child_forked_after_the_call_raises_naming_the_fork(tmp_path):
    rank0, rank1 = run_ranks(_wait_in_forked_child, 2, str(tmp_path / "go"), timeout=70)
    assert rank0["status"] == 0, "the child did not get an error (killed by its alarm: wait() blocked)"
    child = rank0["child"]
    assert (child["raised"], child["state"], child["owner_pid"]) == ("HcclInternalError", "forked", rank0["pid"])
    assert "forked" in child["message"] and str(rank0["pid"]) in child["message"]
    assert rank0["sum"] == rank1["sum"] == 3.0


def test_wait_in_a_forked_child_of_a_plain_process_raises_too(comm):
    work = comm.all_reduce(np.ones(4, np.float32), async_op=True)
    pid = os.fork()
    if pid == 0:
        signal.alarm(CHILD_BOUND_S)
        try:
            work.wait(timeout=5)
            os._exit(1)
        except HcclInternalError as err:
            os._exit(0 if err.state == "forked" else 2)
        except BaseException:  # noqa: BLE001
            os._exit(3)
    assert os.waitpid(pid, 0)[1] == 0
    assert work.wait() is not None  # still fine in the process that issued it


@pytest.mark.parametrize(
    "timeout, rule",
    [
        ("1", "type"),
        (b"1", "type"),
        (True, "type"),
        ([1], "type"),
        (float("nan"), "range"),
        (-1, "range"),
        (-0.5, "range"),
    ],
)
def test_wait_refuses_a_timeout_that_is_not_seconds(comm, timeout, rule):
    work = comm.all_reduce(np.ones(4, np.float32), async_op=True)
    with pytest.raises(HcclParamError) as info:
        work.wait(timeout=timeout)
    assert (info.value.arg, info.value.rule) == ("timeout", rule)
    assert "seconds" in info.value.message or ">= 0" in info.value.message
    assert work.wait() is not None  # the refusal left the handle usable


@pytest.mark.parametrize("timeout", [None, 0, 0.5, 3, np.float32(2.0), np.int64(1), math.inf, 1e300])
def test_wait_takes_any_number_of_seconds_and_inf_as_no_bound(comm, timeout):
    x = np.ones(4, np.float32)
    work = comm.all_reduce(x, async_op=True)
    work.wait()
    assert work.wait(timeout=timeout) is x


@pytest.mark.parametrize("path, rule", [(123, "type"), (b"flight.json", "type"), (["f.json"], "type"), ("", "format")])
def test_dump_flight_recorder_refuses_a_path_that_is_not_one(path, rule):
    with pytest.raises(HcclParamError) as info:
        hccl_py.dump_flight_recorder(path=path)
    assert (info.value.arg, info.value.rule) == ("path", rule)


def test_dump_flight_recorder_names_a_path_it_cannot_write(comm, tmp_path):
    with pytest.raises(HcclParamError) as info:
        hccl_py.dump_flight_recorder(path=tmp_path)  # a directory
    assert (info.value.arg, info.value.rule, info.value.value) == ("path", "format", str(tmp_path))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(HcclSyscallError) as info:
        hccl_py.dump_flight_recorder(path=blocker / "flight.json")  # its parent is a file
    assert info.value.path == str(blocker / "flight.json") and info.value.errno is not None
    with pytest.raises(HcclParamError) as info:
        hccl_py.dump_flight_recorder(reason=7, path=tmp_path / "f.json")
    assert (info.value.arg, info.value.rule) == ("reason", "type")
    written = hccl_py.dump_flight_recorder(path=tmp_path / "f.json")  # path-like is fine
    assert Path(written).is_file()


# -- the simulated card's kernels -------------------------------------------------------------------

CARD = Topology.preset("ascend910-8p").card(0)
F = np.float32


def _a(*shape, dtype=F):
    return np.ones(shape, dtype)


# (case, call, fields the error must carry)
BAD_KERNELS = [
    (
        "matmul inner axes",
        lambda d: d.matmul(_a(2, 3), _a(4, 5)),
        {"arg": "a, b", "rule": "shape", "value": [[2, 3], [4, 5]]},
    ),
    ("matmul vector", lambda d: d.matmul(_a(2, 3), _a(4)), {"rule": "shape", "value": [[2, 3], [4]]}),
    (
        "matmul batch axes",
        lambda d: d.matmul(_a(2, 2, 3), _a(3, 3, 4)),
        {"rule": "shape", "value": [[2, 2, 3], [3, 3, 4]]},
    ),
    ("matmul scalar", lambda d: d.matmul(_a(), _a(3)), {"arg": "a", "rule": "shape"}),
    ("matmul lists", lambda d: d.matmul([[1.0, 2.0]], [[3.0], [4.0]]), {"arg": "a", "rule": "type", "value": "list"}),
    (
        "matmul list b",
        lambda d: d.matmul(_a(1, 2), [[3.0], [4.0]]),
        {"arg": "b", "rule": "type", "expected": "numpy.ndarray"},
    ),
    ("matmul strings", lambda d: d.matmul(np.array([["a"]]), np.array([["b"]])), {"arg": "a", "rule": "dtype"}),
    ("linear inner axes", lambda d: d.linear(_a(2, 3), _a(4, 5)), {"arg": "x, w", "rule": "shape"}),
    (
        "linear bias shape",
        lambda d: d.linear(_a(2, 3), _a(3, 4), _a(5)),
        {"arg": "b", "rule": "shape", "value": [5], "expected": [2, 4]},
    ),
    ("linear bias grows", lambda d: d.linear(_a(2, 3), _a(3, 4), _a(3, 2, 4)), {"arg": "b", "rule": "shape"}),
    (
        "linear bias dtype",
        lambda d: d.linear(_a(2, 3, dtype=np.int32), _a(3, 4, dtype=np.int32), _a(4)),
        {"arg": "b", "rule": "dtype", "expected": "int32"},
    ),
    ("linear list", lambda d: d.linear(_a(2, 3), _a(3, 4), [0.0] * 4), {"arg": "b", "rule": "type"}),
    ("softmax axis", lambda d: d.softmax(_a(2, 3), axis=2), {"arg": "axis", "rule": "range", "value": 2}),
    ("softmax ints", lambda d: d.softmax(_a(2, 3, dtype=np.int64)), {"arg": "x", "rule": "dtype"}),
    ("softmax scale", lambda d: d.softmax(_a(2, 3), scale="2"), {"arg": "scale", "rule": "type"}),
    (
        "layer_norm gamma",
        lambda d: d.layer_norm(_a(2, 3), _a(4), _a(3)),
        {"arg": "gamma", "rule": "shape", "value": [4]},
    ),
    ("layer_norm beta", lambda d: d.layer_norm(_a(2, 3), _a(3), _a(2, 2, 3)), {"arg": "beta", "rule": "shape"}),
    ("layer_norm eps", lambda d: d.layer_norm(_a(2, 3), _a(3), _a(3), eps=-1.0), {"arg": "eps", "rule": "range"}),
    ("layer_norm list", lambda d: d.layer_norm([[1.0, 2.0]], _a(2), _a(2)), {"arg": "x", "rule": "type"}),
    ("gelu list", lambda d: d.gelu([1.0, 2.0]), {"arg": "x", "rule": "type"}),
    ("gelu ints", lambda d: d.gelu(_a(3, dtype=np.int32)), {"arg": "x", "rule": "dtype"}),
    (
        "embedding id past the table",
        lambda d: d.embedding(_a(5, 4), np.array([1, 5])),
        {"arg": "ids", "rule": "range", "value": 5, "expected": "0..4"},
    ),
    (
        "embedding negative id",
        lambda d: d.embedding(_a(5, 4), np.array([1, -1])),
        {"arg": "ids", "rule": "range", "value": -1},
    ),
    ("embedding float ids", lambda d: d.embedding(_a(5, 4), np.array([1.0])), {"arg": "ids", "rule": "dtype"}),
    ("embedding 1-D table", lambda d: d.embedding(_a(5), np.array([1])), {"arg": "table", "rule": "shape"}),
    (
        "embedding short positions",
        lambda d: d.embedding(_a(5, 4), np.array([[1, 2, 3]]), _a(2, 4)),
        {"arg": "positions", "rule": "shape", "value": [2, 4], "expected": [3, 4]},
    ),
    ("embedding list ids", lambda d: d.embedding(_a(5, 4), [1, 2]), {"arg": "ids", "rule": "type"}),
    ("mean axis", lambda d: d.mean(_a(2, 3), 2), {"arg": "axis", "rule": "range"}),
    ("mean scalar", lambda d: d.mean(_a(), 0), {"arg": "axis", "rule": "range"}),
    ("mean list", lambda d: d.mean([1.0, 2.0], 0), {"arg": "x", "rule": "type"}),
    (
        "elementwise shapes",
        lambda d: d.elementwise(np.add, _a(3), _a(4)),
        {"arg": "arrays[0], arrays[1]", "rule": "shape", "value": [[3], [4]]},
    ),
    ("elementwise list", lambda d: d.elementwise(np.add, [1.0], _a(1)), {"arg": "arrays[0]", "rule": "type"}),
    ("elementwise fn", lambda d: d.elementwise("add", _a(1)), {"arg": "fn", "rule": "type"}),
    ("elementwise nothing", lambda d: d.elementwise(np.negative), {"arg": "arrays", "rule": "required"}),
    ("empty negative", lambda d: d.empty((2, -1)), {"arg": "shape", "rule": "range"}),
    ("empty shape", lambda d: d.empty("ab"), {"arg": "shape", "rule": "type"}),
    ("empty dtype", lambda d: d.empty((2,), "not-a-dtype"), {"arg": "dtype", "rule": "type"}),
    ("malloc float", lambda d: d.malloc(1.5), {"arg": "nbytes", "rule": "type"}),
    ("adopt list", lambda d: d.adopt([1, 2]), {"arg": "array", "rule": "type"}),
    ("run negative flops", lambda d: d.run(-1.0, 0), {"arg": "flops", "rule": "range"}),
    ("run nan bytes", lambda d: d.run(0.0, float("nan")), {"arg": "nbytes", "rule": "range"}),
    ("run text", lambda d: d.run("1", 0), {"arg": "flops", "rule": "type"}),
]


@pytest.mark.parametrize("dry", [False, True], ids=["real", "dry"])
@pytest.mark.parametrize("case, call, fields", BAD_KERNELS, ids=[c[0] for c in BAD_KERNELS])
def test_a_kernel_refuses_operands_that_do_not_fit_naming_them(case, call, fields, dry):
    dev = Device(CARD, dry=dry)
    if dry and case.startswith("embedding") and fields["rule"] == "range":
        pytest.skip("a dry card does not compute ids, so it does not read them")
    with pytest.raises(HcclParamError) as info:
        call(dev)
    err = info.value
    assert err.code == 1
    for name, value in fields.items():
        assert getattr(err, name) == value, (name, getattr(err, name), err.message)
    # nothing was charged or kept
    assert dev.clock == 0.0 and dev.used_bytes == 0


def test_the_kernels_still_compute_what_numpy_does():
    dev = Device(CARD)
    x, w = np.arange(6, dtype=F).reshape(2, 3), np.arange(12, dtype=F).reshape(3, 4)
    assert np.array_equal(dev.matmul(x, w), x @ w)
    assert np.array_equal(dev.matmul(x, np.ones(3, F)), x @ np.ones(3, F))  # a vector operand
    assert np.array_equal(dev.matmul(np.ones((5, 2, 3), F), w), np.ones((5, 2, 3), F) @ w)  # batched
    assert np.array_equal(dev.linear(x, w, np.ones(4, np.float64)), x @ w + 1)  # a float64 bias into float32
    table = np.arange(20, dtype=F).reshape(5, 4)
    out = dev.embedding(table, np.array([[0, 4, 2]]), np.ones((8, 4), F))
    assert np.array_equal(out, table[[[0, 4, 2]]] + 1)
    assert dev.mean(x, -1).shape == (2,) and dev.empty(3).shape == (3,) and dev.empty((2, 0)).size == 0
    assert np.array_equal(dev.elementwise(np.add, x, np.ones(3, F)), x + 1)
    assert dev.clock > 0
