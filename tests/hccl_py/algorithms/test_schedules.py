"""Every collective schedule played in one process against a numpy reference, and the player's
checker itself checked on deliberately broken schedules."""

from __future__ import annotations

import re
import zlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccl_py.algorithms.playback import ScheduleError, check, play, walk
from hccl_py.algorithms.registry import ALGORITHMS, SCHEDULES, get_schedule
from hccl_py.algorithms.schedule import IN, OUT, TMP, Copy, Recv, Region, Schedule, Send, Step
from hccl_py.dtypes import UFUNCS, ReduceOp
from hccl_py.errors import HcclNotSupportedError

SIZES = [*range(1, 10), 13, 16]
COLLECTIVES = (
    "allreduce",
    "allgather",
    "broadcast",
    "reduce",
    "reduce_scatter",
)  # tests/.../test_new_schedules.py: the rest
PAIRS = [(c, a) for c in COLLECTIVES for a in ALGORITHMS[c]]
ROOTED = {"broadcast", "reduce"}
REDUCING = {"allreduce", "reduce", "reduce_scatter"}
INT32, FLOAT32 = np.dtype(np.int32), np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)
# (dtype, op) per collective; the op does not matter to allgather and broadcast.
CASES = {
    c: [(INT32, "sum"), (INT32, "prod"), (INT32, "max"), (INT32, "min"), (FLOAT32, "sum"), (FLOAT32, "min")]
    if c in REDUCING
    else [(INT32, "sum"), (FLOAT32, "sum")]
    for c in COLLECTIVES
}


def counts(size: int) -> list[int]:
    return sorted({0, 1, size - 1, size, 37, 1000})


def roots(collective: str, size: int) -> list[int]:
    return sorted({0, size // 2, size - 1}) if collective in ROOTED else [0]


def rng_for(*key: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def make_inputs(collective: str, size: int, count: int, dtype: np.dtype, op: str, rng) -> list[np.ndarray]:
    n = size * count if collective == "reduce_scatter" else count
    if dtype.kind == "i":
        # prod: factors of magnitude <= 2 stay far from int32 overflow for 16 ranks
        values = [rng.choice([-2, -1, 1, 2], n) if op == "prod" else rng.integers(-1000, 1000, n) for _ in range(size)]
    else:
        values = [rng.uniform(-1, 1, n) for _ in range(size)]
    return [v.astype(dtype) for v in values]


def bits(a: np.ndarray) -> bytes:
    return a.dtype.str.encode() + a.tobytes()


def assert_reduced(got: np.ndarray, stack: np.ndarray, op: str) -> None:
    """Exact for integers and max/min; for float sums within the rounding error bound of any
    summation order, (size + 1) * eps * sum(|x|) elementwise."""
    if op == "sum" and stack.dtype.kind not in "iu":
        wide = stack.astype(np.float64)
        tol = (len(stack) + 1) * float(ml_dtypes.finfo(stack.dtype).eps) * np.abs(wide).sum(axis=0)
        err = np.abs(got.astype(np.float64) - wide.sum(axis=0))
        assert np.all(err <= tol), f"max error {err.max()} beyond tolerance"
    else:
        expected = UFUNCS[ReduceOp.parse(op)].reduce(stack, axis=0, dtype=stack.dtype)  # int32 wraps like the ranks do
        assert bits(got) == bits(expected)


def verify(collective: str, size: int, count: int, root: int, xs: list, outs: list, op: str) -> None:
    stack = np.stack(xs)
    if collective == "allreduce":
        assert_reduced(outs[0], stack, op)
        assert all(bits(o) == bits(outs[0]) for o in outs), "ranks disagree"
    elif collective == "reduce":
        assert_reduced(outs[root], stack, op)
        assert all(bits(outs[r]) == bits(xs[r]) for r in range(size) if r != root), "a non-root buffer changed"
    elif collective == "reduce_scatter":
        for r in range(size):
            assert_reduced(outs[r], stack[:, r * count : (r + 1) * count], op)
    elif collective == "broadcast":
        assert all(bits(o) == bits(xs[root]) for o in outs)
    else:
        assert all(bits(o) == bits(np.concatenate(xs)) for o in outs)


def run(collective: str, algo: str, size: int, count: int, root: int, dtype: np.dtype, op: str, rng) -> None:
    xs = make_inputs(collective, size, count, dtype, op, rng)
    kept = [x.copy() for x in xs]
    outs = play(collective, algo, size, xs, root=root, op=op)
    assert all(bits(x) == bits(k) for x, k in zip(xs, kept)), "play modified its inputs"
    verify(collective, size, count, root, xs, outs, op)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective,algo", PAIRS)
def test_matches_numpy(collective: str, algo: str, size: int) -> None:
    rng = rng_for(collective, algo, size)
    for count in counts(size):
        for root in roots(collective, size):
            # empty chunks are left out on both sides: no zero-count message is ever scheduled
            steps = [s for rank in walk(collective, algo, size, count, root) for s in rank]
            assert all(t.src.count for s in steps for t in s.sends)
            assert all(t.dst.count for s in steps for t in s.recvs)
            for dtype, op in CASES[collective]:
                run(collective, algo, size, count, root, dtype, op, rng)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=str)
@pytest.mark.parametrize("collective,algo", PAIRS)
def test_low_precision(collective: str, algo: str, dtype: np.dtype) -> None:
    rng = rng_for(collective, algo, str(dtype))
    for size in (2, 3, 5, 8, 13):
        for root in roots(collective, size):
            run(collective, algo, size, 37, root, dtype, "sum", rng)


@pytest.mark.parametrize("collective,algo", PAIRS)
def test_count_zero_moves_nothing(collective: str, algo: str) -> None:
    for size in SIZES:
        for root in roots(collective, size):
            assert all(not rank for rank in walk(collective, algo, size, 0, root))


@pytest.mark.parametrize("collective,algo", PAIRS)
def test_size_one_is_local(collective: str, algo: str) -> None:
    steps = walk(collective, algo, 1, 10)[0]
    assert all(not s.sends and not s.recvs for s in steps)
    assert len(steps) == (1 if collective in ("allgather", "reduce_scatter") else 0)


@settings(max_examples=200, deadline=None, database=None)
@given(
    pair=st.sampled_from(PAIRS),
    size=st.integers(1, 12),
    count=st.integers(0, 200),
    root_seed=st.integers(0, 1 << 16),
    op=st.sampled_from(["sum", "prod", "max", "min"]),
)
def test_hypothesis(pair: tuple[str, str], size: int, count: int, root_seed: int, op: str) -> None:
    collective, algo = pair
    root = root_seed % size if collective in ROOTED else 0
    run(collective, algo, size, count, root, INT32, op, np.random.default_rng(root_seed))


@pytest.mark.parametrize("size", [*range(1, 18), 24, 32, 33])
def test_barrier_dissemination(size: int) -> None:
    steps = walk("barrier", "dissemination", size, 0)
    rounds = (size - 1).bit_length()
    assert all(len(rank) == rounds for rank in steps)
    assert all(len(s.sends) == len(s.recvs) == 1 and s.sends[0].src.count == 1 for rank in steps for s in rank)
    # nobody leaves before everyone arrived: each rank has heard, directly or not, from all
    heard = [{r} for r in range(size)]
    for k in range(rounds):
        heard = [heard[r].union(*(heard[rv.peer] for rv in steps[r][k].recvs)) for r in range(size)]
    assert all(h == set(range(size)) for h in heard)
    assert play("barrier", "dissemination", size, [np.zeros(0, np.uint8)] * size)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13])
def test_barrier_monitored(size: int) -> None:
    steps = walk("barrier", "monitored", size, 0)
    if size == 1:
        assert steps == [[]]
        return
    # rank 0 hears from every rank in one step (so a timeout there names all missing ranks) ...
    assert sorted(rv.peer for rv in steps[0][0].recvs) == list(range(1, size))
    assert len({rv.dst.offset for rv in steps[0][0].recvs}) == size - 1  # no receive waits behind another
    # ... and releases them only afterwards
    assert sorted(s.peer for s in steps[0][1].sends) == list(range(1, size))
    assert all([len(st.sends) for st in steps[r]] == [1, 0] for r in range(1, size))
    assert play("barrier", "monitored", size, [np.zeros(0, np.uint8)] * size)


def test_registry() -> None:
    assert set(SCHEDULES) == {(c, a) for c, algos in ALGORITHMS.items() for a in algos}
    assert set(PAIRS) <= set(SCHEDULES)
    assert ("allreduce", "rd") in SCHEDULES
    fn = get_schedule("allreduce", "ring")
    assert fn(1, 4, 10) is fn(1, 4, 10)  # cached: the runtime asks once per call
    with pytest.raises(HcclNotSupportedError) as err:
        get_schedule("allreduce", "butterfly")
    assert err.value.code == 5
    assert (err.value.collective, err.value.algo) == ("allreduce", "butterfly")
    assert err.value.choices == [a for c, a in SCHEDULES if c == "allreduce"]  # names what exists instead
    assert {"ring", "tree", "hd", "mesh", "rd"} <= set(err.value.choices)
    with pytest.raises(HcclNotSupportedError) as err:
        get_schedule("alltoall", "ring")
    assert (err.value.collective, err.value.algo, err.value.choices) == ("alltoall", "ring", ["pairwise", "mesh"])


def test_walk_lists_steps_in_order() -> None:
    steps = walk("allreduce", "ring", 4, 8)
    assert [s.index for s in steps[2]] == list(range(6))
    assert all((s.sends[0].peer, s.recvs[0].peer) == (3, 1) for s in steps[2])


# --- the checker itself: tiny broken schedules -------------------------------------------------


def per_rank(*schedules: Schedule):
    """A schedule function that returns the given schedules, one per rank."""

    def fn(rank: int, size: int, count: int, root: int = 0) -> Schedule:
        return schedules[rank]

    return fn


def sched(*steps: Step, tmp: int = 0) -> Schedule:
    return Schedule(steps=steps, tmp_count=tmp)


def send(peer: int, buf=OUT, off: int = 0, n: int = 2) -> Send:
    return Send(peer, Region(buf, off, n))


def recv(peer: int, buf=OUT, off: int = 0, n: int = 2, reduce_with: Region | None = None) -> Recv:
    return Recv(peer, Region(buf, off, n), reduce_with)


BROKEN = {
    "unmatched send": ("allreduce", per_rank(sched(Step(sends=(send(1),))), sched())),
    "unmatched receive": ("allreduce", per_rank(sched(), sched(Step(recvs=(recv(0),))))),
    "count mismatch": ("allreduce", per_rank(sched(Step(sends=(send(1, n=2),))), sched(Step(recvs=(recv(0, n=3),))))),
    # both send first: fine with buffered sends, a deadlock under synchronous semantics
    "deadlock": (
        "allreduce",
        per_rank(
            sched(Step(sends=(send(1),)), Step(recvs=(recv(1, off=2),))),
            sched(Step(sends=(send(0),)), Step(recvs=(recv(0, off=2),))),
        ),
    ),
    "stuck in step 0": (  # a cycle of three ranks each waiting to receive first
        "allreduce",
        per_rank(*(sched(Step(recvs=(recv((r - 1) % 3),)), Step(sends=(send((r + 1) % 3),))) for r in range(3))),
    ),
    "overwrites": (
        "allreduce",
        per_rank(*(sched(Step(sends=(send(1 - r, off=1),), recvs=(recv(1 - r),))) for r in range(2))),
    ),
    # IN and OUT are one array in place: receiving into OUT what is sent from IN is a hazard too
    "overwrites IN[0:2]": (
        "allreduce",
        per_rank(*(sched(Step(sends=(send(1 - r, IN),), recvs=(recv(1 - r),))) for r in range(2))),
    ),
    "overlap but differ": (
        "allreduce",
        per_rank(
            sched(Step(recvs=(recv(1, off=0), recv(2, off=1)))),
            sched(Step(sends=(send(0),))),
            sched(Step(sends=(send(0),))),
        ),
    ),
    "arrival order": (
        "allreduce",
        per_rank(
            sched(Step(recvs=(recv(1, off=0), recv(2, off=2, reduce_with=Region(OUT, 0, 2))))),
            sched(Step(sends=(send(0),))),
            sched(Step(sends=(send(0),))),
        ),
    ),
    "out of bounds": (
        "allreduce",
        per_rank(sched(Step(sends=(send(1, off=3),))), sched(Step(recvs=(recv(0, off=3),)))),
    ),
    "TMP has 1 elements": (
        "allreduce",
        per_rank(sched(Step(sends=(send(1, TMP),)), tmp=1), sched(Step(recvs=(recv(0),)))),
    ),
    "writes IN": ("allgather", per_rank(sched(Step(copies=(Copy(Region(OUT, 0, 2), Region(IN, 0, 2)),))), sched())),
    "non-root rank of reduce": (
        "reduce",
        per_rank(sched(Step(recvs=(recv(1),))), sched(Step(sends=(send(0),), recvs=(recv(0, off=2),)))),
    ),
    "root's buffer": ("broadcast", per_rank(sched(Step(recvs=(recv(1),))), sched(Step(sends=(send(0),))))),
    "peer 0": ("allreduce", per_rank(sched(Step(sends=(send(0),))), sched())),
    # local reductions (one-shot's fold): the operand and the destination must not half-overlap
    "overlaps destination OUT[1:3] but differs": (
        "allreduce",
        per_rank(
            sched(Step(copies=(Copy(Region(TMP, 0, 2), Region(OUT, 1, 2), reduce_with=Region(OUT, 0, 2)),)), tmp=2),
            sched(),
        ),
    ),
    "differ in count": (
        "allreduce",
        per_rank(
            sched(Step(copies=(Copy(Region(TMP, 0, 2), Region(OUT, 0, 2), reduce_with=Region(OUT, 0, 1)),)), tmp=2),
            sched(),
        ),
    ),
    "not a Schedule": ("allreduce", per_rank(sched(), [])),
}


@pytest.mark.parametrize("message", list(BROKEN))
def test_checker_rejects(message: str) -> None:
    collective, fn = BROKEN[message]
    size = 3 if message in ("stuck in step 0", "overlap but differ", "arrival order") else 2
    with pytest.raises(ScheduleError, match=re.escape(message)):
        check(collective, fn, size, 4)
    with pytest.raises(ScheduleError):  # play checks before it moves data
        n = 2 * size * 4 if collective == "reduce_scatter" else 4
        play(collective, fn, size, [np.zeros(n, np.int32)] * size)


def test_checker_accepts_accumulating_chain() -> None:
    """Receives into one identical destination, the first reading IN, apply in list order."""
    fn = per_rank(
        sched(Step(recvs=(recv(1, reduce_with=Region(IN, 0, 2)), recv(2, reduce_with=Region(OUT, 0, 2))))),
        sched(Step(sends=(send(0, IN),))),
        sched(Step(sends=(send(0, IN),))),
    )
    xs = [np.array([1, 2, 0, 0], np.int32), np.array([10, 20, 0, 0], np.int32), np.array([100, 200, 0, 0], np.int32)]
    assert play("allreduce", fn, 3, xs)[0].tolist() == [111, 222, 0, 0]


def test_oneshot_folds_in_rank_order_on_every_rank() -> None:
    """float32 sums are not associative: every rank must evaluate ((x0 + x1) + x2) + x3 itself."""
    rng = rng_for("oneshot-order")
    inputs = [rng.uniform(-1, 1, 1000).astype(np.float32) * 10.0 ** (3 * r) for r in range(4)]
    expected = ((inputs[0] + inputs[1]) + inputs[2]) + inputs[3]
    for out in play("allreduce", "oneshot", 4, inputs):
        assert bits(out) == bits(expected)
    sched0 = get_schedule("allreduce", "oneshot")(0, 4, 1000)
    assert len(sched0.steps) == 2 and not sched0.steps[1].sends and len(sched0.steps[0].sends) == 3


def test_without_empty_leaves_out_zero_element_messages_of_one_lane_steps():
    import numpy as np

    from hccl_py.algorithms._common import without_empty
    from hccl_py.algorithms.schedule import StepFlows

    step = StepFlows(np.array([1, 2, 3, 0]), np.array([5, 0, 2, 0]), np.array([3, 0, 1, 2]), False, copies=(4,))
    kept = without_empty(step)
    assert kept.send_to.tolist() == [1, -1, 3, -1]  # ranks 1 and 3 send nothing
    assert kept.recv_from.tolist() == [-1, 0, -1, 2]  # nor does anyone receive from them
    assert kept.copies == (4,) and kept.send_count is step.send_count
    whole = StepFlows(np.array([1, 0]), np.array([3, 3]), np.array([1, 0]), True)
    assert without_empty(whole) is whole
    with pytest.raises(ValueError):
        without_empty(StepFlows(np.array([[1, 0]]), np.array([[0, 1]]), np.array([[1, 0]]), False))


def test_ring_allreduce_with_fewer_elements_than_ranks_builds_only_the_steps_that_move_data():
    """The sparse build (``allreduce_ring._moving``) gives the schedule the whole trip gives once
    ``finish`` has dropped its empty steps."""
    from hccl_py.algorithms import allreduce_ring
    from hccl_py.algorithms._common import finish, ring_indices
    from hccl_py.algorithms.schedule import OUT, Recv, Region, Send, Step, chunk_bounds

    def whole_trip(rank, size, count):
        chunks = chunk_bounds(count, size)
        right, left = (rank + 1) % size, (rank - 1) % size
        steps = []
        for shift in (0, 1):
            for sent, got in ring_indices(rank, size, shift):
                acc = Region(OUT, *chunks[got])
                recv = Recv(left, acc, reduce_with=acc) if shift == 0 else Recv(left, acc)
                steps.append(Step(sends=(Send(right, Region(OUT, *chunks[sent])),), recvs=(recv,)))
        return finish(steps)

    for size in (2, 3, 5, 8, 17):
        for count in range(1, size + 2):
            for rank in range(size):
                assert allreduce_ring.schedule.__wrapped__(rank, size, count) == whole_trip(rank, size, count), (
                    size,
                    count,
                    rank,
                )
