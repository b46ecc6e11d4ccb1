"""Bad input is rejected with a clear HcclError before a byte moves, buffer untouched."""

from __future__ import annotations

import numpy as np
import pytest

import hccl_py
from hccl_py import HcclInternalError, HcclParamError, ReduceOp


@pytest.fixture
def comm(monkeypatch):
    for name in ("RANK_ID", "RANK_SIZE", "RANK", "WORLD_SIZE", "HCCL_ALGO"):
        monkeypatch.delenv(name, raising=False)
    c = hccl_py.init()
    yield c
    c.destroy()


def test_world_of_one_when_run_plainly(comm):
    assert (comm.rank, comm.size) == (0, 1)
    x = np.arange(5, dtype=np.float32)
    assert comm.all_reduce(x) is x and np.array_equal(x, np.arange(5))
    assert np.array_equal(comm.all_gather(x), x[None])
    assert np.array_equal(comm.reduce_scatter(np.arange(4)), np.arange(4))
    comm.barrier()


# (case, call, fields the error must carry): each names the rejected argument and the check it failed
BAD_CALLS = [
    ("not an array", lambda c, x: c.all_reduce([1, 2, 3]), {"arg": "x", "rule": "type", "expected": "numpy.ndarray"}),
    (
        "unsupported dtype",
        lambda c, x: c.all_reduce(np.zeros(3, np.complex64)),
        {"arg": "x", "dtype": "complex64", "rule": "choices"},
    ),
    (
        "unsupported dtype bool",
        lambda c, x: c.all_gather(np.zeros(3, bool)),
        {"arg": "x", "dtype": "bool", "rule": "choices"},
    ),
    (
        "non-contiguous",
        lambda c, x: c.all_reduce(np.zeros((4, 4), np.float32)[:, 1]),
        {"arg": "x", "rule": "contiguous"},
    ),
    ("read-only", lambda c, x: c.broadcast(np.frombuffer(b"\0" * 16, np.float32)), {"arg": "x", "rule": "writable"}),
    ("bad op", lambda c, x: c.all_reduce(x, op="avg"), {"arg": "op", "value": "avg", "rule": "choices"}),
    (
        "prod on int16",
        lambda c, x: c.all_reduce(np.ones(3, np.int16), op="prod"),
        {"arg": "op", "value": "prod", "dtype": "int16", "rule": "dtype"},
    ),
    (
        "prod on bfloat16",
        lambda c, x: c.reduce(np.ones(3, hccl_py.bfloat16), op=ReduceOp.PROD),
        {"arg": "op", "value": "prod", "dtype": "bfloat16", "rule": "dtype"},
    ),
    (
        "root out of range",
        lambda c, x: c.broadcast(x, root=1),
        {"arg": "root", "value": 1, "rule": "range", "expected": "0..0"},
    ),
    ("negative root", lambda c, x: c.reduce(x, root=-1), {"arg": "root", "value": -1, "rule": "range"}),
    ("root not int", lambda c, x: c.reduce(x, root=0.5), {"arg": "root", "value": 0.5, "rule": "range"}),
    ("send to self", lambda c, x: c.send(x, dst=0), {"arg": "dst", "value": 0, "rule": "self"}),
    ("recv from self", lambda c, x: c.recv(x, src=0), {"arg": "src", "value": 0, "rule": "self"}),
    ("peer out of range", lambda c, x: c.send(x, dst=3), {"arg": "dst", "value": 3, "rule": "range"}),
    (
        "unknown algo",
        lambda c, x: c.all_reduce(x, algo="fast"),
        {"arg": "algo", "value": "fast", "collective": "allreduce"},
    ),
    ("empty group", lambda c, x: c.create_group([]), {"arg": "ranks", "rule": "nonempty"}),
    ("group rank out of range", lambda c, x: c.create_group([0, 5]), {"arg": "rank", "value": 5, "rule": "range"}),
    ("group duplicate", lambda c, x: c.create_group([0, 0]), {"arg": "ranks", "value": [0, 0], "rule": "unique"}),
    ("split color type", lambda c, x: c.split(color="a"), {"arg": "color", "value": "a", "rule": "type"}),
    ("split negative color", lambda c, x: c.split(color=-2), {"arg": "color", "value": -2, "rule": "range"}),
    ("split color past 63 bits", lambda c, x: c.split(color=2**63), {"arg": "color", "value": 2**63, "rule": "range"}),
    ("split key past 64 bits", lambda c, x: c.split(color=0, key=-(2**63) - 1), {"arg": "key", "rule": "range"}),
    ("batch of None", lambda c, x: c.batch_send_recv(None), {"arg": "items", "rule": "type"}),
    (
        "fractional count",
        lambda c, x: c.all_to_all_v(x, [1.5], None, np.empty(6, np.float32), [1], None),
        {"arg": "send_counts", "rule": "type"},
    ),
    (
        "fractional matrix",
        lambda c, x: c.all_to_all_vc(x, [[0.5]], np.empty(6, np.float32)),
        {"arg": "counts", "rule": "type"},
    ),
]


@pytest.mark.parametrize("case, call, fields", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_is_rejected_before_anything_moves(comm, case, call, fields):
    x = np.arange(6, dtype=np.float32)
    before = x.copy()
    with pytest.raises(HcclParamError) as info:
        call(comm, x)
    assert info.value.code == 1
    assert {name: getattr(info.value, name) for name in fields} == fields
    if fields.get("arg") != "algo":  # the algorithm is resolved apart from any communicator
        assert (info.value.rank, info.value.comm) == (0, "world")
    assert np.array_equal(x, before)
    comm.all_reduce(x)  # the communicator is still usable after rejected input


def test_calls_after_destroy_or_abort_fail_at_once(comm):
    x = np.zeros(3, np.float32)
    sub = comm.split(color=0)
    sub.abort()
    with pytest.raises(HcclInternalError) as info:
        sub.all_reduce(x)
    assert (info.value.state, info.value.op, info.value.comm) == ("aborted", "allreduce", sub.name)
    comm.destroy()
    with pytest.raises(HcclInternalError) as info:
        comm.barrier()
    assert (info.value.state, info.value.op, info.value.comm) == ("destroyed", "barrier", "world")
    assert hccl_py.init() is not comm  # a destroyed world can be replaced


def test_context_manager_destroys(monkeypatch):
    for name in ("RANK_ID", "RANK_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with hccl_py.init() as c:
        c.barrier()
    with pytest.raises(HcclInternalError):
        c.barrier()


@pytest.mark.parametrize(
    "name, value", [("HCCL_EXEC_TIMEOUT", "abc"), ("HCCL_CONNECT_TIMEOUT", "0"), ("HCCL_CONNECT_TIMEOUT", "-5")]
)
def test_bad_timeout_env(monkeypatch, name, value):
    for n in ("RANK_ID", "RANK_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(n, raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(HcclParamError) as info:
        hccl_py.init()
    assert (info.value.variable, info.value.value) == (name, value)


def test_error_codes_and_pickling():
    import pickle

    for cls, code in [
        (hccl_py.HcclParamError, 1),
        (hccl_py.HcclInternalError, 4),
        (hccl_py.HcclNotSupportedError, 5),
        (hccl_py.HcclTimeoutError, 9),
        (hccl_py.HcclRemoteError, 21),
    ]:
        err = pickle.loads(pickle.dumps(cls("boom", arg="root", value=5)))
        assert type(err) is cls and err.code == code and err.message == "boom" and isinstance(err, hccl_py.HcclError)
        assert (err.arg, err.value) == ("root", 5)


def test_hccl_algo_env_reaches_the_runtime(monkeypatch):
    for name in ("RANK_ID", "RANK_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HCCL_ALGO", "allreduce=level0:NA;level1:NHR_V1")
    with hccl_py.init() as c:
        x = np.ones(4, np.float32)
        with pytest.raises(hccl_py.HcclNotSupportedError) as info:
            c.all_reduce(x)
        assert info.value.code == 5
        assert (info.value.collective, info.value.algo, info.value.variable) == ("allreduce", "NHR_V1", "HCCL_ALGO")
        assert np.array_equal(c.all_gather(x)[0], x)  # other operators stay automatic


def test_malformed_hccl_algo_fails_init(monkeypatch):
    for name in ("RANK_ID", "RANK_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HCCL_ALGO", "allreduce:ring")
    with pytest.raises(HcclParamError) as info:
        hccl_py.init()
    assert (info.value.variable, info.value.value) == ("HCCL_ALGO", "allreduce:ring")


def test_a_call_whose_buffers_the_host_cannot_hold_is_refused_with_hccl_memory_error(comm):
    from numpy.lib.stride_tricks import as_strided

    huge = as_strided(np.zeros(1, np.float32), shape=(2**40,), strides=(0,))  # 4 TiB as a zero-stride view
    with pytest.raises(hccl_py.HcclMemoryError) as info:
        comm.all_gather(huge)
    assert info.value.rule == "host_memory" and info.value.op == "allgather"
    x = np.ones(3, np.float32)
    comm.all_reduce(x)  # still usable
    assert np.array_equal(x, np.ones(3))
