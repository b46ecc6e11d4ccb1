"""TensorParallel and ExpertParallel on real ranks: outputs equal the single-card model at 2 and 4
ranks (also tp groups under data parallelism), routing skew loads the popular experts' card and
makes the others wait, a capacity factor drops and pads what it should, and overlapping the
collectives with compute lowers the modeled time of the same work. Modeled times are
deterministic and asserted; wall time never is."""

from __future__ import annotations

import numpy as np
import pytest

from hccl_py.parallel.moe import kept_table
from tests.mp import run_ranks

pytestmark = pytest.mark.usefixtures("no_leaks")

TINY_TF = dict(layers=2, d_model=32, heads=4, seq_len=8, vocab=50, classes=5)
TINY_MOE = dict(
    layers=2,
    d_model=32,
    heads=2,
    seq_len=8,
    vocab=50,
    classes=5,
    experts=4,
    top_k=2,
    expert_hidden=32,
    shared_hidden=32,
)


def _reference(model, x):
    from hccl_py.modeled.card import Device
    from topology import CARD_MODELS

    card = Device(CARD_MODELS["ascend910"])
    return model.load(card).forward(x), card.clock


def _exact():
    """Every variant's max error against one card (and EP's routing against one card's)."""
    import hccl_py
    from hccl_py.parallel import (
        DataParallel,
        ExpertParallel,
        MoEConfig,
        MoETransformer,
        TensorParallel,
        TransformerConfig,
        TransformerEncoder,
        tp_dp_groups,
    )

    comm = hccl_py.init()
    errors = {}
    tf = TransformerEncoder(TransformerConfig(**TINY_TF), seed=4)
    x = tf.sample_inputs(7)
    ref, _ = _reference(tf, x)
    for overlap in (False, True):
        errors[f"tp overlap={overlap}"] = float(
            np.abs(TensorParallel(comm, tf, overlap=overlap).forward(x) - ref).max()
        )
    if comm.size == 4:
        tp_comm, dp_comm = tp_dp_groups(comm, 2)
        y = DataParallel(dp_comm, TensorParallel(tp_comm, tf, overlap=True)).forward(x)
        errors["tp2 x dp2"] = float(np.abs(y - ref).max())
    for skew, cf in ((0.0, None), (1.2, None), (1.2, 1.0)):
        moe = MoETransformer(MoEConfig(**TINY_MOE, router_skew=skew, capacity_factor=cf), seed=5)
        x = moe.sample_inputs(5)  # 5 sequences: uneven over the cards
        ref, _ = _reference(moe, x)
        routing = [r.kept for r in moe.routing()]
        for overlap in (False, True):
            ep = ExpertParallel(comm, moe, overlap=overlap)
            key = f"ep skew={skew} cf={cf} overlap={overlap}"
            errors[key] = float(np.abs(ep.forward(x) - ref).max())
            errors[key + " routing"] = 0.0 if [r.kept for r in ep.last.layers] == routing else 1.0
    return errors


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ranks", [2, 4])
def test_tp_and_ep_equal_one_card(ranks):
    results = run_ranks(_exact, ranks, timeout=80)
    for errors in results:
        assert len(errors) == (2 if ranks == 2 else 3) + 12
        assert all(err <= 1e-5 for err in errors.values()), errors
    assert all(r == results[0] for r in results)  # every card returns the whole output


# -- routing skew and capacity ------------------------------------------------------------------------
LOADED = dict(
    layers=2,
    d_model=32,
    heads=2,
    seq_len=32,
    vocab=50,
    classes=5,
    experts=8,
    top_k=2,
    expert_hidden=4096,
    shared_hidden=0,
)  # big experts: their compute (not kernel launches) sets the pace


def _skew(skew: float, cf):
    import hccl_py
    from hccl_py.parallel import ExpertParallel, MoEConfig, MoETransformer

    comm = hccl_py.init()
    moe = MoETransformer(MoEConfig(**LOADED, router_skew=skew, capacity_factor=cf), seed=0)
    x = moe.sample_inputs(16)
    ep = ExpertParallel(comm, moe)
    runs = []
    for _ in range(2):  # the same forward twice: the same modeled times
        comm.barrier()
        t = comm.device.time
        before = (comm.device.clock, t.compute_s, t.wait_s)
        ep.forward(x)
        runs.append((comm.device.clock - before[0], t.compute_s - before[1], t.wait_s - before[2]))
    run = ep.last
    return runs, run, list(moe.popularity), moe.prior().tolist()


@pytest.mark.timeout(90)
def test_router_skew_loads_the_popular_experts_card_and_the_others_wait():
    even = run_ranks(_skew, 4, 0.0, None, timeout=80)
    skewed = run_ranks(_skew, 4, 1.2, None, timeout=80)
    for results in (even, skewed):
        for runs, *_ in results:
            assert runs[0] == pytest.approx(
                runs[1], rel=1e-9, abs=1e-15
            )  # the same modeled time (deltas of later clocks)
    run, prior = skewed[0][1], skewed[0][3]
    owner = run.owner
    cards = run.per_card(run.processed)
    mass = [sum(p for e, p in enumerate(prior) if owner[e] == c) for c in range(4)]
    hot = max(range(4), key=lambda c: cards[c])
    assert hot == max(range(4), key=lambda c: mass[c])  # the card holding the most popular experts
    assert max(cards) / (sum(cards) / 4) > 1.5  # Zipf 1.2: a few hot experts
    even_cards = even[0][1].per_card(even[0][1].processed)
    assert max(even_cards) / (sum(even_cards) / 4) < 1.25
    assert sum(cards) == sum(even_cards) == 2 * 16 * 32 * 2  # top-2 of every token of 2 layers, nothing dropped
    # Modeled time: the hot card computes longest, the others wait for it at the combine.
    waits = [r[0][0][2] for r in skewed]
    computes = [r[0][0][1] for r in skewed]
    assert computes[hot] == max(computes)
    assert waits[hot] < min(w for c, w in enumerate(waits) if c != hot)
    assert sum(waits) > 2 * sum(r[0][0][2] for r in even)
    assert max(r[0][0][0] for r in skewed) > max(r[0][0][0] for r in even)  # skew costs modeled time


@pytest.mark.timeout(90)
def test_capacity_factor_drops_and_pads_what_it_should():
    results = run_ranks(_skew, 4, 1.2, 1.0, timeout=80)
    run = results[0][1]
    tokens = 16 * 32
    capacity = int(np.ceil(1.0 * tokens * 2 / 8))
    assert run.capacity == (capacity, capacity)
    for layer in run.layers:  # each expert keeps min(routed, capacity) and pads up to it
        assert layer.kept == tuple(min(r, capacity) for r in layer.routed)
        assert layer.padded == tuple(capacity - k for k in layer.kept)
    dropped = sum(max(0, r - capacity) for layer in run.layers for r in layer.routed)
    assert sum(run.dropped) == dropped > 0 and sum(run.padded) > 0
    assert all(r[1].layers == run.layers for r in results)  # every card knows the whole table


def test_kept_table_keeps_the_first_tokens_in_global_order():
    # 2 cards x 2 micro-batches x 2 experts; capacity 4
    table = np.array([[[3, 1], [2, 0]], [[1, 5], [2, 2]]])
    kept = kept_table(table, 4)
    assert kept.tolist() == [[[3, 1], [1, 0]], [[0, 3], [0, 0]]]
    assert kept_table(table, None).tolist() == table.tolist()


# -- overlap -----------------------------------------------------------------------------------------------
def _overlap():
    import hccl_py
    from hccl_py.parallel import (
        ExpertParallel,
        MoEConfig,
        MoETransformer,
        TensorParallel,
        TransformerConfig,
        TransformerEncoder,
    )

    comm = hccl_py.init()
    times = {}

    def timed(name, driver, x):
        comm.barrier()
        start, exposed = comm.device.clock, comm.device.time.exposed_s
        y = driver.forward(x)
        comm.barrier()  # the makespan: every card done
        times[name] = (comm.device.clock - start, comm.device.time.exposed_s - exposed)
        return y

    # Tensor parallel: the default encoder, modeled only (dry cards: the arithmetic is skipped).
    comm.device.dry = True
    tf = TransformerEncoder(TransformerConfig(layers=4))
    x = tf.sample_inputs(32)
    for name, overlap, chunks in (("tp", False, 1), ("tp chunked", False, 2), ("tp overlap", True, 2)):
        timed(name, TensorParallel(comm, tf, overlap=overlap, chunks=chunks), x)
    # Expert parallel, modeled only too (dry routing follows the skew's prior, token by token, so
    # the three runs route alike), at a width where kernels are bandwidth-bound, not launch-bound.
    moe = MoETransformer(
        MoEConfig(
            layers=2,
            d_model=1024,
            heads=8,
            seq_len=64,
            vocab=50,
            classes=5,
            experts=8,
            top_k=2,
            expert_hidden=1024,
            shared_hidden=1024,
            router_skew=0.5,
        ),
        seed=0,
    )
    x = moe.sample_inputs(64)
    routed = {}
    for name, overlap, chunks in (("ep", False, 1), ("ep chunked", False, 2), ("ep overlap", True, 2)):
        ep = ExpertParallel(comm, moe, overlap=overlap, chunks=chunks)
        timed(name, ep, x)
        routed[name] = ep.last.layers
    return times, len({tuple(r) for r in routed.values()}) == 1


@pytest.mark.timeout(90)
def test_overlap_lowers_the_modeled_time_of_the_same_work():
    # Two servers of two cards joined by 100 GbE RoCE: communication worth hiding. The same work
    # three ways: blocking, blocking in the same micro-batches, and overlapped.
    results = run_ranks(_overlap, 4, env={"HCCL_PY_TOPOLOGY": "2x2p-roce-910"}, timeout=80)
    times, same_routing = results[0]
    assert same_routing
    for kind in ("tp", "ep"):
        plain, chunked, overlapped = times[kind][0], times[f"{kind} chunked"][0], times[f"{kind} overlap"][0]
        assert overlapped < 0.95 * plain and overlapped < chunked, times  # ~11% (tp), ~20% (ep) today
        assert times[kind][1] == 0.0 and times[f"{kind} overlap"][1] > 0.0  # only asynchronous calls expose anything
    for other, _ in results[1:]:  # the makespan is the same on every card (exposed time is each card's own)
        assert {k: v[0] for k, v in other.items()} == pytest.approx({k: v[0] for k, v in times.items()}, rel=1e-9)


def _timeline_of_a_blocking_call(pause_s: float) -> list | None:
    """Rank 0: an asynchronous allreduce that waits for rank 1 (late in modeled time), a pause
    (wall time only), then a blocking allgather recorded on a timeline: it queues behind the
    allreduce or runs at once depending on the pause."""
    import time

    import hccl_py
    from hccl_py.parallel.timeline import Timeline

    comm = hccl_py.init()
    x, y = np.ones(1 << 16, np.float32), np.ones(1 << 10, np.float32)
    if comm.rank == 1:
        comm.device.run(flops=1e12, nbytes=0)
        time.sleep(0.5)
        comm.all_reduce(x)
        comm.all_gather(y)
        return None
    timeline = Timeline(comm.device)
    work = comm.all_reduce(x, async_op=True)
    time.sleep(pause_s)
    with timeline.comm("allgather"):
        comm.all_gather(y)
    work.wait()
    return [(s.kind, s.start, s.end) for s in timeline.segments], work.end_clock


@pytest.mark.timeout(90)
def test_a_blocking_calls_wait_and_comm_segments_do_not_depend_on_wall_time():
    """The allgather's segments are the same whether it queued behind the allreduce (whose own
    waiting for rank 1 then fell inside the allgather's window and was drawn as the allgather's)
    or ran at once: the compute stream stands still until the allreduce ends (exposed, a wait
    segment), then the allgather runs, waiting for nobody."""
    env = {"HCCL_PY_TOPOLOGY": "ascend910b-8p"}
    queued = run_ranks(_timeline_of_a_blocking_call, 2, 0.0, env=env, timeout=40)[0]
    at_once = run_ranks(_timeline_of_a_blocking_call, 2, 1.5, env=env, timeout=40)[0]
    assert queued == at_once
    segments, allreduce_end = queued
    assert [(kind, start) for kind, start, _ in segments] == [("wait", 0.0), ("comm", allreduce_end)]
