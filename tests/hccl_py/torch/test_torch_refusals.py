"""The torch layer's refusal sweep, as the numpy API's (tests/conformance): in every torch
collective and coalesced form, blocking and asynchronous, one rank passes what its own checks
refuse (an output of the wrong size, a root or a split out of range) while the others pass a valid
call. The rule (docs/failures.md): the call fails on every rank with the refusing rank's reason
(``refused_by`` on the others), nobody waits, and the next call pairs on every rank. Calls where
the ranks disagree without any one rank being wrong (AVG against SUM, roots that differ) are call
mismatches, found on every rank, never a timeout.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.mp import run_ranks  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaks")

ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "HCCL_EXEC_TIMEOUT": "15"}


def _cases(dist, rank: int, world: int, bad_rank: int) -> dict:
    """{name: (call, async)}: ``call()`` runs one torch call (rank ``bad_rank``'s is wrong; it is
    the root where only the root's list is checked)."""
    n = world
    bad = rank == bad_rank
    big = 1 if bad else 0  # one element too many on the bad rank

    def ones(k, dtype=torch.float32):
        return torch.ones(k, dtype=dtype)

    def coalescing(fn):
        def run(async_op):
            with dist._coalescing_manager(async_ops=async_op) as cm:
                fn()
            if async_op:
                cm.wait()

        return run

    cases = {
        "all_reduce dtype": lambda a: dist.all_reduce(ones(2, torch.float8_e5m2 if bad else torch.float32), async_op=a),
        "broadcast layout": lambda a: dist.broadcast(ones(3).to_sparse() if bad else ones(3), src=0, async_op=a),
        # the group's method: torch's all_gather refuses mixed dtypes itself, on that rank only
        "all_gather list dtype": lambda a: dist.group.WORLD.allgather(
            [[ones(2, torch.float64 if bad and i == 0 else torch.float32) for i in range(n)]],
            [ones(2)],
            _gather_opts(dist, a),
        ),
        "all_reduce list": lambda a: dist.group.WORLD.allreduce([ones(2), ones(2)] if bad else [ones(2)]),
        "broadcast root": lambda a: dist.broadcast(ones(3), src=n if bad else 0, async_op=a),
        "reduce root": lambda a: dist.reduce(ones(3), dst=-1 if bad else 0, async_op=a),
        "all_gather size": lambda a: dist.all_gather([ones(2 + big) for _ in range(n)], ones(2), async_op=a),
        "all_gather_into_tensor size": lambda a: dist.all_gather_into_tensor(ones(2 * n + big), ones(2), async_op=a),
        "gather size": lambda a: dist.gather(
            ones(2), [ones(2 + big) for _ in range(n)] if bad else None, dst=bad_rank, async_op=a
        ),
        "scatter size": lambda a: dist.scatter(
            ones(2), [ones(2 + big) for _ in range(n)] if bad else None, src=bad_rank, async_op=a
        ),
        "reduce_scatter size": lambda a: dist.reduce_scatter(ones(2), [ones(2 + big) for _ in range(n)], async_op=a),
        "reduce_scatter_tensor size": lambda a: dist.reduce_scatter_tensor(ones(2), ones(2 * n + big), async_op=a),
        "all_to_all_single splits": lambda a: dist.all_to_all_single(
            ones(n), ones(n), [1] * n, [2] + [1] * (n - 2) if bad else [1] * n, async_op=a
        ),
        "all_to_all length": lambda a: dist.all_to_all(
            [ones(1) for _ in range(n + big)], [ones(1) for _ in range(n)], async_op=a
        ),
        # the group's method: torch's all_reduce_coalesced refuses mixed dtypes itself, on that rank only
        "all_reduce_coalesced dtypes": lambda a: dist.group.WORLD.allreduce_coalesced(
            [ones(2), ones(3, torch.int64 if bad else torch.float32)], _coalesced_opts(dist, a)
        ),
        "all_gather_coalesced size": lambda a: dist.all_gather_coalesced(
            [[ones(2), ones(3 + big)] for _ in range(n)], [ones(2), ones(3)], async_op=a
        ),
        "all_gather_into_tensor in the manager": coalescing(
            lambda: (
                dist.all_gather_into_tensor(ones(2 * n), ones(2)),
                dist.all_gather_into_tensor(ones(3 * n + big), ones(3)),
            )
        ),
        "reduce_scatter_tensor in the manager": coalescing(
            lambda: (
                dist.reduce_scatter_tensor(ones(2), ones(2 * n)),
                dist.reduce_scatter_tensor(ones(3), ones(3 * n + big)),
            )
        ),
        "all_reduce in the manager": coalescing(
            lambda: (dist.all_reduce(ones(2)), dist.all_reduce(ones(3, torch.int64 if bad else torch.float32)))
        ),
    }
    return cases


def _gather_opts(dist, async_op: bool):
    opts = dist.distributed_c10d.AllgatherOptions()
    opts.asyncOp = async_op
    return opts


def _coalesced_opts(dist, async_op: bool):
    opts = dist.AllreduceCoalescedOptions()
    opts.asyncOp = async_op
    return opts


def _outcome(err) -> list:
    """[error class, refused_by, rule, call mismatch] of a failed torch call."""
    cause = err.__cause__ if err.__cause__ is not None else err
    fields = getattr(cause, "fields", {})
    return [type(cause).__name__, fields.get("refused_by"), fields.get("rule")]


def _verify(dist, rank: int, world: int, tag: int) -> list:
    """all_reduce until two in a row succeed, as the numpy sweep verifies: a rank that only sent in
    the refused call learns at its next call, which then fails on every rank as a refusal. The
    failures on the way ([class, refused_by, rule]); a wrong sum or a non-refusal is a failure of
    the sweep."""
    failures, streak = [], 0
    while streak < 2:
        assert len(failures) <= 2, failures
        t = torch.full((2,), float(rank + tag))
        try:
            dist.all_reduce(t)
        except dist.DistBackendError as err:
            failures.append(_outcome(err))
            assert failures[-1][1] is not None, f"not a refusal: {err}"
            streak = 0
            continue
        assert t.tolist() == [float(sum(range(world)) + world * tag)] * 2, (tag, t)
        streak += 1
    return failures


def _sweep(bad_rank: int) -> dict:
    """Every case, blocking then asynchronous, each followed by :func:`_verify`; {case: (what this
    rank saw, the verification's failures)}, or {case: "lost: ..."} where the sweep could not go on."""
    import warnings

    import torch.distributed as dist

    import hccl_py.torch  # noqa: F401  (registers "hccl")

    warnings.filterwarnings("ignore")
    dist.init_process_group("hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    seen = {}
    for tag, (name, call) in enumerate(_cases(dist, rank, world, bad_rank).items()):
        for async_op in (False, True):
            key = f"{name} {'async' if async_op else 'blocking'}"
            try:
                work = call(async_op)
                if work is not None and hasattr(work, "wait"):
                    work.wait()
                got = "ok"
            except (dist.DistBackendError, RuntimeError, ValueError, TypeError) as err:
                got = _outcome(err)
            try:
                seen[key] = (got, _verify(dist, rank, world, 10 * tag + async_op))
            except (AssertionError, dist.DistBackendError) as err:
                seen[key] = f"lost: {got}: {str(err)[:400]}"
                dist.destroy_process_group()
                return seen  # the communicator is out of step: nothing after this can pair
    dist.destroy_process_group()
    return seen


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("world", "bad"), [(2, 0), (2, 1), (3, 1), (4, 3)])
def test_a_call_one_rank_refuses_fails_on_every_rank_and_the_next_call_pairs(world, bad):
    results = run_ranks(_sweep, world, bad, env=ENV, timeout=360)
    problems = []
    for key, mine in results[bad].items():
        outcomes = [seen.get(key) for seen in results]
        if any(isinstance(o, str) or o is None for o in outcomes):
            problems.append(f"{key}: {outcomes}")
            continue
        if mine[0] == "ok" or mine[0][1] is not None:
            problems.append(f"{key}: the refusing rank saw {mine[0]}")
        # every rank made the same verification calls; a rank whose call passed only sent, and
        # learned at its next call
        if len({len(failures) for _, failures in outcomes}) != 1:
            problems.append(f"{key}: verifications differ: {outcomes}")
        for rank, (got, failures) in enumerate(outcomes):
            if rank != bad and got != "ok" and got[1] != bad:
                problems.append(f"{key} on rank {rank}: {got}, not rank {bad}'s refusal")
    assert not problems, "\n".join(problems)


# -- calls the ranks disagree on, no rank wrong by itself: a call mismatch on every rank, never a wait --
def _disagree(case: str) -> str:
    """One call on which the ranks disagree; what this rank raised (the communicator is lost)."""
    import warnings

    import torch.distributed as dist

    import hccl_py.torch  # noqa: F401  (registers "hccl")

    warnings.filterwarnings("ignore")
    dist.init_process_group("hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    avg, total = dist.ReduceOp.AVG, dist.ReduceOp.SUM
    t = torch.full((4,), float(rank + 1))
    try:
        if case == "all_reduce AVG against SUM":  # the float32 path
            dist.all_reduce(t, op=avg if rank == 0 else total)
        elif case == "all_reduce AVG against SUM, async":
            dist.all_reduce(t.double(), op=avg if rank == 0 else total, async_op=True).wait()
        elif case == "reduce_scatter_tensor AVG against SUM":
            dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world), op=avg if rank == 1 else total)
        elif case == "reduce to one's own rank":  # every rank a root: nobody sends
            dist.reduce(t, dst=rank)
        elif case == "gather to one's own rank":
            dist.gather(t, [torch.empty(4) for _ in range(world)], dst=rank)
        return f"returned {t.tolist()}"
    except dist.DistBackendError as err:
        return f"{type(err.__cause__).__name__}: {err.__cause__}"
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "case",
    [
        "all_reduce AVG against SUM",
        "all_reduce AVG against SUM, async",
        "reduce_scatter_tensor AVG against SUM",
        "reduce to one's own rank",
        "gather to one's own rank",
    ],
)
def test_ranks_that_disagree_on_a_call_fail_with_a_mismatch_on_every_rank(case):
    # a wait would end at HCCL_EXEC_TIMEOUT, far past the job's own bound: a hang fails the test
    results = run_ranks(_disagree, 2, case, env={**ENV, "HCCL_EXEC_TIMEOUT": "600"}, timeout=120)
    for rank, seen in enumerate(results):
        assert "call mismatch" in seen, f"rank {rank}: {seen}"
    if "AVG" in case:
        assert any("then average" in seen for seen in results), results


# -- point to point: a refused receive consumes nothing; a refused send fails the peer's receive --
def _p2p() -> dict:
    import warnings

    import torch.distributed as dist

    import hccl_py.torch  # noqa: F401  (registers "hccl")

    warnings.filterwarnings("ignore")
    dist.init_process_group("hccl")
    rank = dist.get_rank()
    seen = {}
    if rank == 0:
        dist.send(torch.arange(4.0), 1)
        dist.send(torch.arange(4.0) + 1, 1)  # the refused receive leaves it for the next one
    else:
        z = torch.zeros(8)
        dist.recv(z[::2], 0)  # strided: staged, received
        seen["strided"] = z.tolist()
        try:
            dist.group.WORLD.recv([torch.zeros(4), torch.zeros(4)], 0, 0).wait()  # two tensors: refused here
            seen["refused"] = "ok"
        except dist.DistBackendError as err:
            seen["refused"] = _outcome(err)
        w = torch.zeros(4)
        dist.recv(w, 0)
        seen["next"] = w.tolist()
    if rank == 1:  # a send rank 1 refuses (two tensors where send takes one) fails rank 0's receive
        try:
            dist.group.WORLD.send([torch.ones(2), torch.ones(2)], 0, 0).wait()
        except dist.DistBackendError as err:
            seen["send"] = _outcome(err)
    else:
        try:
            dist.recv(torch.empty(2), 1)
            seen["send"] = "ok"
        except dist.DistBackendError as err:
            seen["send"] = _outcome(err)
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)
    seen["after"] = t.tolist()
    dist.destroy_process_group()
    return seen


@pytest.mark.timeout(120)
def test_a_refused_receive_consumes_nothing_and_a_refused_send_fails_the_receive():
    sender, receiver = run_ranks(_p2p, 2, env=ENV, timeout=100)
    assert receiver["strided"] == [0.0, 0, 1, 0, 2, 0, 3, 0], receiver
    assert receiver["refused"][1] is None and receiver["next"] == [1.0, 2.0, 3.0, 4.0], receiver
    assert receiver["send"][1] is None and sender["send"][1] == 1, (sender, receiver)
    assert sender["after"] == receiver["after"] == [3.0, 3.0]
