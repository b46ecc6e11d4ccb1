"""The torch adapter in one process: registration, tensors as arrays, the c10d store adapter,
Work and futures, a one-rank "hccl" group, and (in a child process: it patches torch) the
torch_npu's place on the path."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import hccl_py.torch  # noqa: E402
from hccl_py import HcclConnectError, HcclNotSupportedError, HcclParamError, HcclTimeoutError, init  # noqa: E402
from hccl_py.dtypes import bfloat16  # noqa: E402
from hccl_py.engine.progress import PROGRESS_THREAD_NAME  # noqa: E402
from hccl_py.rendezvous.torch import C10dStore  # noqa: E402
from hccl_py.torch import backend  # noqa: E402
from hccl_py.torch.tensors import Staged, as_array, check  # noqa: E402
from hccl_py.torch.work import HcclWork  # noqa: E402
from hccl_py.work import Work  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


# -- registration --------------------------------------------------------------------------------
def test_import_registers_hccl_for_cpu():
    assert dist.Backend.HCCL == "hccl"
    assert dist.is_backend_available("hccl")
    assert dist.Backend.backend_capability["hccl"] == ["cpu"]
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"  # gloo stays the CPU default
    assert backend.foreign_registration() is None
    backend.register()  # again: a no-op


@pytest.mark.parametrize(
    "module, devices, holder",
    [
        ("torch_npu.distributed", ["npu"], "torch_npu"),
        ("habana_frameworks.torch.distributed", ["hpu"], "habana"),
        ("someone.else", ["cpu"], "someone.else"),
    ],
)
def test_a_foreign_hccl_is_never_shadowed(monkeypatch, module, devices, holder):
    def creator(*args):  # pragma: no cover - never called
        raise AssertionError

    creator.__module__ = module
    monkeypatch.setitem(dist.Backend._plugins, "HCCL", dist.Backend._BackendPlugin(creator, False))
    monkeypatch.setitem(dist.Backend.backend_capability, "hccl", devices)
    assert backend.foreign_registration().startswith(holder)
    with pytest.raises(HcclNotSupportedError) as info:
        backend.register()
    assert info.value.holder.startswith(holder) and "does not replace it" in info.value.message


def test_importing_hccl_py_does_not_import_torch():
    code = "import sys, hccl_py, hccl_py.runtime, launch; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


# -- tensors -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float16,
        torch.float64,
        torch.bfloat16,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    ],
)
def test_contiguous_tensors_are_seen_without_a_copy(dtype):
    t = torch.zeros(6, dtype=dtype)[1:5]  # a storage offset too
    a = as_array(t)
    assert a.ctypes.data == t.data_ptr() and a.shape == (4,)
    assert a.dtype == {torch.bfloat16: bfloat16, torch.bool: np.uint8}.get(dtype, a.dtype)
    a[0] = 1
    assert t[0].item() == 1


def test_requires_grad_and_0d():
    w = torch.zeros(3, requires_grad=True)
    assert as_array(w).ctypes.data == w.data_ptr()
    s = torch.tensor(2.5, dtype=torch.bfloat16)
    assert as_array(s).shape == () and float(as_array(s)) == 2.5


def test_strided_tensors_are_staged_and_copied_back():
    base = torch.zeros(4, 4)
    view = base.t()  # not contiguous
    staged = Staged(view, "test")
    assert staged.buffer is not view and staged.array.flags.c_contiguous
    staged.array[:] = np.arange(16, dtype=np.float32).reshape(4, 4)
    assert base.sum() == 0
    staged.copy_back()
    assert torch.equal(view, torch.arange(16, dtype=torch.float32).reshape(4, 4))
    plain = torch.zeros(3)
    assert Staged(plain, "test").buffer is plain


@pytest.mark.parametrize(
    "t, rule",
    [
        (torch.zeros(2, dtype=torch.complex64), "choices"),
        (torch.zeros(2, dtype=torch.uint16), "choices"),
        (torch.zeros(2, device="meta"), "device"),
        ("x", "type"),
    ],
)
def test_what_hccl_py_cannot_carry_is_refused(t, rule):
    with pytest.raises(HcclParamError) as info:
        check(t, "all_reduce")
    assert info.value.rule == rule


# -- the c10d store adapter ------------------------------------------------------------------------------
def test_c10d_store_adapter_offers_what_connect_needs():
    store = C10dStore(dist.HashStore(), "127.0.0.1:0", job_id="job-a")
    store.set("a", b"1")
    assert store.get("a", 1.0) == b"1"
    assert store.check(["a", "b"]) == [True, False]
    assert store.add("n", 2) == 2 and store.add("n", 1) == 3
    assert store.set_if_absent("slot", b"me") == (True, b"me")
    assert store.set_if_absent("slot", b"you") == (False, b"me")
    assert store.job_id() == "job-a"
    store.wait(["a"], 1.0)
    with pytest.raises(HcclTimeoutError) as info:
        store.wait(["a", "never"], 0.2)
    assert info.value.missing_keys == ["never"] and info.value.timeout_s == 0.2
    store.close()


def test_the_first_rank_to_ask_names_the_job():
    shared = dist.HashStore()
    first, second = C10dStore(shared, "h:1", job_id="first"), C10dStore(shared, "h:1", job_id="second")
    assert first.job_id() == second.job_id() == "first"


def test_torchrun_agent_store_that_is_not_there():
    with pytest.raises(HcclConnectError) as info:
        C10dStore.connect("127.0.0.1", _closed_port(), 2, 0.5)
    assert "torchrun" in info.value.message


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- Work and futures ------------------------------------------------------------------------------------------
def _card():
    from hccl_py.modeled.card import Device
    from topology import CARD_MODELS

    return Device(CARD_MODELS["ascend910b"])


def test_work_completes_its_future_after_post_and_then_runs_in_the_caller():
    inner = Work("allreduce #1", None, _card())
    t = torch.zeros(2)
    seen, threads = [], []
    work = HcclWork("all_reduce", [inner], [t], post=lambda: t.add_(1))
    assert not work.is_completed() and work.exception() is None
    threading.Timer(0.05, lambda: inner.finish(None, 1e-6)).start()  # the progress thread ends it later
    chained = work.get_future().then(
        lambda f: threads.append(threading.current_thread()) or seen.append(f.value()[0].tolist()) or "chained"
    )
    # then() waited for the call and ran the callback here, after post, as NCCL's runs in the caller
    assert chained.done() and threads == [threading.current_thread()] and seen == [[1.0, 1.0]]
    assert work.is_completed() and work.wait() is True
    assert work.is_success() and work.result() == [t]
    assert t.tolist() == [1.0, 1.0] and chained.wait() == "chained"


def test_then_on_the_progress_thread_runs_when_the_call_ends():
    """A then() on the thread that ends calls cannot wait for them: its callback runs as the call ends."""
    inner = Work("allreduce #3", None, _card())
    work = HcclWork("all_reduce", [inner], [])
    threads, chained = [], []

    def on_progress_thread():
        chained.append(work.get_future().then(lambda f: threads.append(threading.current_thread()) or "chained"))

    progress = threading.Thread(target=on_progress_thread, name=PROGRESS_THREAD_NAME)
    progress.start()
    progress.join(30)
    assert not progress.is_alive() and not chained[0].done() and threads == []
    inner.finish(None, 0.0)  # ends the call on this thread: the callback runs here
    assert chained[0].wait() == "chained" and threads == [threading.current_thread()]


def test_a_failed_call_raises_dist_backend_error_everywhere():
    inner = Work("allreduce #2", None, _card())
    work = HcclWork("all_reduce", [inner], [])
    inner.finish(HcclTimeoutError("allreduce #2: timed out. Waiting peer rank(s): 3", ranks=[3]), 1.0)
    with pytest.raises(dist.DistBackendError, match="Waiting peer rank") as info:
        work.wait()
    assert isinstance(info.value.__cause__, HcclTimeoutError) and info.value.__cause__.ranks == [3]
    assert isinstance(work.exception(), dist.DistBackendError) and not work.is_success()
    with pytest.raises(dist.DistBackendError):
        work.get_future().wait()


def test_wait_with_a_timeout_bounds_only_the_wait():
    inner = Work("barrier #1", None, _card())
    work = HcclWork("barrier", [inner], [])
    with pytest.raises(dist.DistBackendError, match="not done within"):
        work.wait(timedelta(milliseconds=20))
    inner.finish(None, 0.0)
    assert work.wait(timedelta(seconds=5))


# -- one rank ---------------------------------------------------------------------------------------------------
@pytest.fixture
def one_rank(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "RANK_ID", "RANK_SIZE", "HCCL_PY_STORE_PORT", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=42))
    yield
    dist.destroy_process_group()


def test_one_rank_group(one_rank):
    pg = dist.group.WORLD
    assert isinstance(pg, hccl_py.torch.HcclProcessGroup) and dist.get_backend() == "hccl" and pg.name() == "hccl"
    comm = hccl_py.torch.communicator()
    assert comm.size == 1 and comm.timeout_s == 42.0  # init_process_group(timeout=) is HCCL_EXEC_TIMEOUT
    t = torch.arange(4, dtype=torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert t.tolist() == [0, 1, 2, 3]
    work = dist.all_gather_into_tensor(torch.empty(4), t, async_op=True)
    assert work.wait() and work.get_future().value()[0].tolist() == [0, 1, 2, 3]
    assert dist.get_backend(dist.new_group([0])) == "hccl"
    assert init() is comm  # hccl_py.init() in the same process: the backend's world
    with pytest.raises(dist.DistBackendError, match="not supported") as info:
        dist.all_reduce(torch.ones(1), op=dist.ReduceOp.BXOR)
    assert isinstance(info.value.__cause__, HcclNotSupportedError)


def test_every_form_of_reduce_op(one_rank):
    R = dist.ReduceOp
    forms = [
        (R.SUM, 3.0),
        (R.RedOpType.SUM, 3.0),
        (R(R.RedOpType.SUM), 3.0),
        (R.MAX, 3.0),
        (R(R.RedOpType.MIN), 3.0),
        (R.PRODUCT, 3.0),
        (R.AVG, 3.0),
        (R(R.RedOpType.AVG), 3.0),
    ]
    for red_op, expected in forms:  # a one-rank group: every op leaves the value, AVG divides by 1
        for t in (torch.full((4,), 3.0), torch.full((4,), 3.0, dtype=torch.float64), torch.full((8,), 3.0)[::2]):
            dist.all_reduce(t, op=red_op)  # float32 contiguous (the short path), float64, strided
            assert t.tolist() == [expected] * 4, (red_op, t)
    opts = dist.AllreduceOptions()
    opts.reduceOp = R.MAX  # what torch hands the group: a ReduceOp instance
    assert dist.group.WORLD.allreduce([torch.ones(2)], opts).wait()
    for red_op in (
        R.BAND,
        R.BOR,
        R.BXOR,
        dist._make_nccl_premul_sum(2.0),
        dist._make_nccl_premul_sum(torch.tensor(2.0)),
    ):
        for t in (torch.ones(2), torch.ones(2, dtype=torch.int32)):
            with pytest.raises(dist.DistBackendError, match="not supported") as info:
                dist.all_reduce(t, op=red_op)
            assert isinstance(info.value.__cause__, HcclNotSupportedError)
    with pytest.raises(dist.DistBackendError, match="AVG is not supported"):
        dist.all_reduce(torch.ones(2, dtype=torch.bool), op=R.AVG)
    from hccl_py.torch.args import reduce_op

    for other in (0, 1, True, "sum", hccl_py.ReduceOp.SUM):  # no torch ReduceOp: refused, whatever it hashes to
        with pytest.raises(HcclNotSupportedError):
            reduce_op(other, torch.float32, "all_reduce")


def test_destroy_releases_the_world_it_made(one_rank):
    comm = hccl_py.torch.communicator()
    dist.destroy_process_group()
    from hccl_py import runtime

    assert runtime.current() is None and comm.closed_reason == "was destroyed"
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1)  # and joins anew


def test_exec_timeout_rule(monkeypatch):
    from torch.distributed.constants import default_pg_timeout

    monkeypatch.delenv("HCCL_EXEC_TIMEOUT", raising=False)
    assert backend._exec_timeout_s(timedelta(seconds=7)) == 7.0
    assert backend._exec_timeout_s(default_pg_timeout) == default_pg_timeout.total_seconds()
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "99")
    assert backend._exec_timeout_s(default_pg_timeout) == 99.0  # torch's default: the environment wins
    assert backend._exec_timeout_s(timedelta(seconds=7)) == 7.0  # given: it wins


# -- hccl-py's torch_npu (the device itself: test_npu_device.py) ----------------------------------------------
def test_the_standin_is_not_importable_without_npu():
    from launch.config import NPU_STANDIN

    assert (NPU_STANDIN / "torch_npu" / "__init__.py").is_file()
    import importlib.util

    assert importlib.util.find_spec("torch_npu") is None  # only hccl-launch --npu puts it on a path


def test_the_adapter_without_torch_says_what_to_install():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import hccl_py\n"
        "try:\n    import hccl_py.torch\nexcept hccl_py.HcclNotSupportedError as err:\n"
        "    print(err.code, err.module)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["5", "torch"], done.stderr


def test_all_to_all_single_split_sizes_are_refused_with_torchs_text(one_rank):
    """c10d's checkSplitSizes text (gloo, NCCL and Ascend's backend say the same; Ascend's
    test_all_to_all_single.py compares it), the values in hccl-py's error behind it."""
    out, inp = torch.empty(4), torch.arange(4.0)
    cases = [
        (dict(input_split_sizes=[3]), "Split sizes doesn't match total dim 0 size", "sum to 3; input has 4 rows"),
        (dict(output_split_sizes=[2, 2]), "Number of tensor splits not equal to group size", "2 sizes for 1 ranks"),
    ]
    for kwargs, torch_text, detail in cases:
        with pytest.raises(RuntimeError) as info:
            dist.all_to_all_single(out, inp, **kwargs)
        assert str(info.value) == torch_text
        assert isinstance(info.value.__cause__, HcclParamError) and detail in str(info.value.__cause__)
    dist.all_to_all_single(out, inp, input_split_sizes=[4], output_split_sizes=[4])  # usable afterwards
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
