"""Fault injection: the spec language, and what each action does to a real job."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccl_py.errors import HcclParamError
from hccl_py.faults import check_ranks, parse_fault, parse_faults
from tests.mp import run_ranks, wait_for_file


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("rank=2,op=allreduce,seq=3,action=hang", dict(action="hang", rank=2, op="allreduce", seq=3)),
        ("rank=1,action=crash,at=allgather#2", dict(action="crash", rank=1, op="allgather", seq=2)),
        ("rank=3,action=delay,seconds=2.5", dict(action="delay", rank=3, seconds=2.5)),
        ("rank=1,action=slow,factor=1.8", dict(action="slow", rank=1, factor=1.8)),
        ("link=0-1,action=degrade,factor=0.25", dict(action="degrade", link=(0, 1), factor=0.25)),
        ("rank=0,action=drop", dict(action="drop", rank=0)),
        (" rank = 0 , action = DROP , comm = world/split(1) ", dict(action="drop", rank=0, comm="world/split(1)")),
        ("rank=0,action=hang,at=reducescatter#4", dict(op="reduce_scatter", seq=4)),
    ],
)
def test_valid_specs(spec, expected):
    fault = parse_fault(spec)
    for key, value in expected.items():
        assert getattr(fault, key) == value


# (spec, fields of the error): the key at fault, its value as written, and the check it failed
@pytest.mark.parametrize(
    "spec, facts",
    [
        ("", {"rule": "nonempty"}),
        ("rank=1", {"field": "action", "rule": "required"}),
        ("rank=1,action=explode", {"field": "action", "value": "explode", "rule": "choices"}),
        ("rank=1,action=hang,colour=red", {"field": "colour", "rule": "unknown"}),
        ("rank=1,rank=2,action=hang", {"field": "rank", "rule": "unique"}),
        ("rank=1,action", {"value": "action", "rule": "format", "expected": "key=value"}),
        ("rank=x,action=hang", {"field": "rank", "value": "x", "rule": "type", "expected": "int"}),
        ("rank=-1,action=hang", {"field": "rank", "value": "-1", "rule": "range", "expected": ">= 0"}),
        ("action=hang", {"field": "rank", "rule": "required", "action": "hang"}),
        ("rank=1,action=delay", {"field": "seconds", "rule": "required", "action": "delay"}),
        ("rank=1,action=delay,seconds=-2", {"field": "seconds", "value": "-2", "rule": "range", "expected": ">= 0"}),
        (
            "rank=1,action=slow,factor=0.5",
            {"field": "factor", "value": "0.5", "rule": "range", "expected": ">= 1", "action": "slow"},
        ),
        (
            "link=0-1,action=degrade,factor=2",
            {"field": "factor", "value": "2", "rule": "range", "expected": "(0, 1]", "action": "degrade"},
        ),
        ("link=0-0,action=degrade,factor=0.5", {"field": "link", "value": "0-0", "rule": "format"}),
        ("link=a-b,action=degrade,factor=0.5", {"field": "link", "value": "a-b", "rule": "format"}),
        ("rank=1,action=slow,factor=2,op=allreduce", {"field": "op", "rule": "unknown", "action": "slow"}),
        ("rank=1,action=hang,op=alltoallw", {"field": "op", "value": "alltoallw", "rule": "choices"}),
        (
            "rank=1,action=hang,at=allgather",
            {"field": "at", "value": "allgather", "rule": "format", "expected": "OP#SEQ"},
        ),
        ("rank=1,action=hang,at=allgather#2,seq=3", {"field": "at", "rule": "exclusive"}),
        ("rank=1,action=slow,factor=nan", {"field": "factor", "value": "nan", "rule": "range", "expected": "> 0"}),
    ],
)
def test_malformed_specs_name_the_exact_problem(spec, facts):
    with pytest.raises(HcclParamError) as info:
        parse_fault(spec)
    assert info.value.code == 1 and info.value.spec == spec
    assert {name: getattr(info.value, name) for name in facts} == facts


def test_faults_naming_ranks_outside_the_job_are_rejected():
    check_ranks(parse_faults("rank=3,action=drop;link=0-3,action=degrade,factor=0.5"), 4)
    with pytest.raises(HcclParamError) as info:
        check_ranks(parse_faults("rank=4,action=drop"), 4)
    assert (info.value.field, info.value.value, info.value.rule, info.value.expected) == ("rank", 4, "range", "0..3")
    with pytest.raises(HcclParamError) as info:
        check_ranks(parse_faults("link=0-7,action=degrade,factor=0.5"), 4)
    assert (info.value.field, info.value.value, info.value.spec) == ("link", 7, "link=0-7,action=degrade,factor=0.5")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="rankopseqactiohgdlyfr=,#-0123456789.;_ ", max_size=60))
def test_fuzzed_specs_raise_only_the_documented_error(text):
    try:
        parse_faults(text)
    except HcclParamError:
        pass


def _dropped(folder: str) -> dict:
    import hccl_py

    comm = hccl_py.init()
    y = np.zeros(1000, np.float32)
    done = Path(folder) / "receiver_done"
    if comm.rank == 0:
        comm.send(np.ones(1000, np.float32), dst=1)  # lost on the way
        wait_for_file(done)  # alive until rank 1 is done: it must time out, not see rank 0 exit
        return {"sent": True}
    try:
        comm.recv(y, src=0)
    except hccl_py.HcclTimeoutError as err:
        return {"class": type(err).__name__, "ranks": err.ranks, "untouched": bool(np.all(y == 0))}
    finally:
        done.touch()
    return {"class": None}


@pytest.mark.timeout(60)
def test_dropped_message_times_out_the_peer_and_writes_nothing(tmp_path):
    results = run_ranks(
        _dropped, 2, str(tmp_path), env={"HCCL_PY_FAULTS": "rank=0,action=drop", "HCCL_EXEC_TIMEOUT": "1"}, timeout=50
    )
    assert results[1] == {"class": "HcclTimeoutError", "ranks": [0], "untouched": True}


def _imbalanced(rounds: int) -> dict:
    import hccl_py

    comm = hccl_py.init()
    x = np.ones(4096, np.float32)
    for _ in range(rounds):
        comm.device.run(flops=2e11, nbytes=0)  # the same work on every card
        comm.all_reduce(x, algo="ring")
    comm.barrier()
    t = comm.device.time
    return {"clock": comm.clock, "compute": t.compute_s, "wait": t.wait_s, "waited_for": dict(comm.device.waited_for)}


@pytest.mark.timeout(90)
def test_straggler_shows_as_others_waiting_for_it_deterministically():
    env = {"HCCL_PY_FAULTS": "rank=2,action=slow,factor=3"}
    first = run_ranks(_imbalanced, 4, 5, env=env, timeout=60)
    assert run_ranks(_imbalanced, 4, 5, env=env, timeout=60) == first  # same spec, same modeled outcome
    balanced = run_ranks(_imbalanced, 4, 5, timeout=60)
    assert first[2]["compute"] == pytest.approx(3 * balanced[2]["compute"])
    for rank in (0, 1, 3):
        assert first[rank]["wait"] > 0.9 * 2 * first[rank]["compute"]  # idle while the slow card computes
        assert max(first[rank]["waited_for"], key=first[rank]["waited_for"].get) in (2, (rank - 1) % 4)
    assert first[2]["wait"] < first[0]["wait"] / 10
    assert max(r["clock"] for r in first) > 2.5 * max(r["clock"] for r in balanced)


def _timed_allreduce() -> float:
    import hccl_py

    comm = hccl_py.init()
    x = np.ones(1 << 20, np.float32)
    comm.all_reduce(x, algo="ring")
    return comm.clock


@pytest.mark.timeout(90)
def test_degraded_link_slows_the_modeled_collective():
    healthy = run_ranks(_timed_allreduce, 4, timeout=60)
    degraded = run_ranks(_timed_allreduce, 4, env={"HCCL_PY_FAULTS": "link=0-1,action=degrade,factor=0.25"}, timeout=60)
    assert degraded == run_ranks(
        _timed_allreduce, 4, env={"HCCL_PY_FAULTS": "link=0-1,action=degrade,factor=0.25"}, timeout=60
    )
    assert min(degraded) > 1.5 * max(healthy)


def _delayed() -> dict:
    import hccl_py

    comm = hccl_py.init()
    x = np.ones(8, np.float32)
    entered = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the host
    comm.all_reduce(x)
    return {"entered": entered, "left": time.monotonic(), "clock": comm.clock, "wait": comm.device.time.wait_s}


@pytest.mark.timeout(60)
def test_delay_is_late_in_wall_and_in_modeled_time():
    results = run_ranks(_delayed, 3, env={"HCCL_PY_FAULTS": "rank=1,action=delay,seconds=0.5"}, timeout=50)
    # Late in wall time, as an order of events rather than a duration: nobody can leave the
    # allreduce before rank 1 has slept its 0.5 s inside it (true however loaded the machine is).
    for r in results:
        assert r["left"] >= results[1]["entered"] + 0.5
        assert r["clock"] >= 0.5
    assert results[0]["wait"] >= 0.49 and results[2]["wait"] >= 0.49 and results[1]["wait"] < 0.01


def _delayed_behind_async(pause_s: float, mode: str) -> dict:
    """Rank 0: an asynchronous allreduce, a pause (wall time only), then an allgather (blocking or
    asynchronous) or an asynchronous all-to-all-v that the fault delays; rank 1 plain blocking
    calls. The delayed call queues behind the allreduce or runs at once depending on the pause."""
    import hccl_py

    comm = hccl_py.init()
    x, y = np.ones(1 << 16, np.float32), np.ones(1 << 10, np.float32)
    counts = [256] * comm.size
    op = "alltoallv" if mode == "alltoallv" else "allgather"
    if comm.rank == 0:
        work = comm.all_reduce(x, async_op=True)
        time.sleep(pause_s)
        if mode == "alltoallv":  # its shape is settled on the progress thread, after the counts exchange
            comm.all_to_all_v(y[:512], counts, None, np.empty(512, np.float32), counts, None, async_op=True).wait()
        else:
            gathered = comm.all_gather(y, async_op=mode == "async")
            if mode == "async":
                gathered.wait()
        work.wait()
    else:
        comm.all_reduce(x)
        if mode == "alltoallv":
            comm.all_to_all_v(y[:512], counts, None, np.empty(512, np.float32), counts, None)
        else:
            comm.all_gather(y)
    t = comm.device.time
    return {
        "clock": comm.clock,
        "compute": t.compute_s,
        "wait": t.wait_s,
        "comm": t.comm_s,
        "start": [r.modeled_start for r in comm._rc.recorder.records if r.op == op],
    }


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["blocking", "async", "alltoallv"])
def test_a_delay_makes_a_queued_call_late_as_one_run_at_once(mode):
    """The same fault spec, the same modeled outcome, whether the delayed call queued behind an
    asynchronous one or ran at once (wall time decides): it starts the delay later. A queued call
    started at its issue clock before the delay, so the delay was lost (rank 1 did not wait)."""
    op = "alltoallv" if mode == "alltoallv" else "allgather"
    env = {"HCCL_PY_TOPOLOGY": "ascend910b-8p", "HCCL_PY_FAULTS": f"rank=0,op={op},action=delay,seconds=0.001"}
    queued = run_ranks(_delayed_behind_async, 2, 0.0, mode, env=env, timeout=40)
    at_once = run_ranks(_delayed_behind_async, 2, 1.0, mode, env=env, timeout=40)
    assert queued == at_once
    # late by the delay: rank 0's call starts at its 1 ms or later, which rank 1 waits for
    assert queued[0]["start"][-1] >= 0.001 and queued[1]["wait"] > 0.0009


def _monitored(missing: tuple, folder: str) -> dict | str:
    import hccl_py

    comm = hccl_py.init()
    comm.barrier()  # all four meet first: the monitored barrier's timeout starts together
    if comm.rank in missing:
        # Skip the monitored barrier, and stay alive until the others have their error (an
        # exited rank would be noticed as gone instead).
        for r in range(comm.size):
            if r not in missing:
                wait_for_file(Path(folder) / f"reported_{r}")
        return "skipped"
    try:
        comm.barrier(monitored=True)
    except hccl_py.HcclTimeoutError as err:
        return {"class": type(err).__name__, "ranks": err.ranks, "reporter": err.fields.get("reporter")}
    finally:
        (Path(folder) / f"reported_{comm.rank}").touch()
    return "passed"


@pytest.mark.timeout(60)
def test_monitored_barrier_names_every_missing_rank(tmp_path):
    results = run_ranks(_monitored, 4, (2, 3), str(tmp_path), env={"HCCL_EXEC_TIMEOUT": "2"}, timeout=50)
    assert results[2] == results[3] == "skipped"
    assert results[0] == {"class": "HcclTimeoutError", "ranks": [2, 3], "reporter": None}  # rank 0 watches the barrier
    assert results[1] == {"class": "HcclTimeoutError", "ranks": [2, 3], "reporter": 0}  # and tells the others
