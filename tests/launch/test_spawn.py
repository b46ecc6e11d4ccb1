"""launch.spawn: results in rank order, failures as SpawnError with the rank's own error, no leftovers."""

from __future__ import annotations

import os
import signal
import sys

import pytest

import launch
from hccl_py.errors import HcclTimeoutError
from hccl_py.rendezvous.store import StoreClient
from tests.mp import block_forever, is_gone, run_ranks, wait_until

pytestmark = pytest.mark.usefixtures("no_leaks")

_NAMES = (
    "RANK_ID",
    "RANK_SIZE",
    "DEVICE_ID",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "HCCL_PY_JOB_ID",
    "HCCL_PY_STORE_HOSTED",
    "EXTRA",
    "FROM_CALLER",
)


def _rank() -> int:
    return int(os.environ["RANK_ID"])


def _report(scale: int) -> tuple[int, dict[str, str]]:
    return _rank() * scale, {name: os.environ.get(name, "") for name in _NAMES}


def _rendezvous() -> int:
    with StoreClient.from_env(timeout_s=10) as store:
        store.set(f"up/{_rank()}", b"1")
        store.wait([f"up/{r}" for r in range(int(os.environ["RANK_SIZE"]))], timeout_s=10)
        return store.add("count")


def _raise_on_rank_1(kind: str) -> None:
    if _rank() == 1:
        if kind == "value":
            raise ValueError("bad shape (3, 4)")
        raise HcclTimeoutError("allreduce seq 7: waiting peer rank [0]")
    block_forever()  # the others must be stopped, not waited for


class _Unpicklable(Exception):
    def __init__(self, a: int, b: int):  # pickling passes only args=(message,): cannot come back
        super().__init__(f"{a}/{b}")


def _raise_unpicklable() -> None:
    raise _Unpicklable(1, 2)


def _exit_7_on_rank_0() -> None:
    if _rank() == 0:
        os._exit(7)
    block_forever()


def _sigkill_rank_1() -> None:
    if _rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    block_forever()


def _say_hello() -> None:
    print(f"hello from rank {_rank()}")
    print(f"complaint from rank {_rank()}", file=sys.stderr)


def _rank_1_hangs() -> int:
    if _rank() == 1:
        block_forever()
    return _rank()


@pytest.mark.timeout(30)
def test_results_come_back_in_rank_order_with_the_launch_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    run_ranks(_report, 1, 0, timeout=20)  # the forkserver is running from here on
    monkeypatch.setenv("FROM_CALLER", "now")  # ranks still see the caller's environment of now
    results = run_ranks(_report, 4, 10, env={"EXTRA": "yes"}, timeout=20)
    assert [value for value, _ in results] == [0, 10, 20, 30]
    envs = [e for _, e in results]
    assert len({e["HCCL_PY_JOB_ID"] for e in envs}) == 1
    for r, e in enumerate(envs):
        assert e["RANK_ID"] == e["RANK"] == e["DEVICE_ID"] == e["LOCAL_RANK"] == str(r)
        assert e["RANK_SIZE"] == e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == "4"
        assert (e["MASTER_ADDR"], e["HCCL_PY_STORE_HOSTED"], e["EXTRA"], e["FROM_CALLER"]) == (
            "127.0.0.1",
            "1",
            "yes",
            "now",
        )


@pytest.mark.timeout(30)
def test_ranks_rendezvous_through_the_parents_store() -> None:
    assert sorted(run_ranks(_rendezvous, 3, timeout=20)) == [1, 2, 3]


@pytest.mark.timeout(30)
def test_exception_in_a_rank_becomes_spawn_error_and_stops_the_others() -> None:
    # The others never finish on their own: only stopping them ends the call (else: timeout,
    # and err.rank would be None).
    with pytest.raises(launch.SpawnError) as info:
        run_ranks(_raise_on_rank_1, 3, "value", timeout=20)
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert isinstance(err.exception, ValueError) and str(err.exception) == "bad shape (3, 4)"
    assert "_raise_on_rank_1" in err.traceback and "bad shape (3, 4)" in err.traceback
    assert "rank 1" in str(err) and "ValueError: bad shape (3, 4)" in str(err)
    assert sorted(err.unfinished) == [0, 2]


@pytest.mark.timeout(30)
def test_hccl_error_keeps_its_class_and_code() -> None:
    with pytest.raises(launch.SpawnError) as info:
        run_ranks(_raise_on_rank_1, 2, "timeout", timeout=20)
    assert isinstance(info.value.exception, HcclTimeoutError)
    assert info.value.exception.code == 9
    assert info.value.exc_type == "HcclTimeoutError"


@pytest.mark.timeout(30)
def test_unpicklable_exception_still_reports_type_and_text() -> None:
    with pytest.raises(launch.SpawnError) as info:
        run_ranks(_raise_unpicklable, 1, timeout=20)
    assert info.value.exception is None
    assert info.value.exc_type == "_Unpicklable" and info.value.exc_message == "1/2"


@pytest.mark.timeout(30)
def test_exit_code_and_signal_deaths_are_reported() -> None:
    with pytest.raises(launch.SpawnError) as info:
        run_ranks(_exit_7_on_rank_0, 3, timeout=20)
    assert (info.value.rank, info.value.exitcode, info.value.exception) == (0, 7, None)
    assert "exit code 7" in str(info.value)
    with pytest.raises(launch.SpawnError) as info:
        run_ranks(_sigkill_rank_1, 2, timeout=20)
    assert (info.value.rank, info.value.exitcode) == (1, -signal.SIGKILL)
    assert "SIGKILL" in str(info.value)


@pytest.mark.timeout(60)
def test_timeout_names_the_ranks_that_had_not_finished() -> None:
    # The timeout must not race the ranks' start-up: let ranks 0 and 2 finish first (however
    # long that takes), then give the join a short timeout. Their results are waiting in the
    # pipes, so they count as finished; rank 1 never finishes.
    context = launch.spawn(_rank_1_hangs, 3, join=False)
    pids = context.pids
    wait_until(lambda: is_gone(pids[0]) and is_gone(pids[2]), "ranks 0 and 2 returned", within=40)
    with pytest.raises(launch.SpawnError) as info:
        context.join(timeout=0.5)
    assert info.value.rank is None and info.value.unfinished == [1]


@pytest.mark.timeout(30)
def test_join_false_returns_a_context_to_join_later() -> None:
    context = launch.spawn(_report, 2, args=(1,), join=False)
    assert isinstance(context, launch.SpawnContext) and len(context.pids) == 2
    assert [value for value, _ in context.join(timeout=20)] == [0, 1]


@pytest.mark.timeout(30)
def test_rank_output_goes_to_the_callers_streams(capfd: pytest.CaptureFixture[str]) -> None:
    run_ranks(_say_hello, 2, timeout=20)
    out, err = capfd.readouterr()
    assert "hello from rank 0" in out and "hello from rank 1" in out
    assert "complaint from rank 1" in err
