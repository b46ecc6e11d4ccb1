"""DataParallel, PipelineParallel and hybrid on real ranks: outputs equal the single-card run,
sharding policies balance a straggler, the bubble follows (p-1)/(m+p-1), memory limits hold and
modeled times repeat exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hccl_py.parallel import ideal_bubble
from tests.mp import run_ranks

pytestmark = pytest.mark.usefixtures("no_leaks")

SMALL = dict(layers=6, d_model=32, heads=4, seq_len=12, vocab=50, classes=5)  # 8 blocks


def _reference(model, x):
    from hccl_py.modeled.card import Device
    from topology import CARD_MODELS

    return model.load(Device(CARD_MODELS["ascend910"])).forward(x)


def _dp_policies():
    import hccl_py
    from hccl_py.parallel import POLICIES, DataParallel, TransformerConfig, TransformerEncoder

    comm = hccl_py.init()
    small = TransformerEncoder(TransformerConfig(**SMALL), seed=1)
    x = small.sample_inputs(19)
    ref = _reference(small, x)
    exact = {p: float(np.abs(DataParallel(comm, small, policy=p, chunk=2).forward(x) - ref).max()) for p in POLICIES}
    # A straggler (rank 2, three times slower) on the default transformer, modeled only (dry).
    comm.device.dry = True
    if comm.rank == 2:
        comm.device.slow_factor = 3.0
    big = TransformerEncoder()
    x = big.sample_inputs(256)
    balance = {}
    for policy in POLICIES:
        dp = DataParallel(comm, big, policy=policy)  # work-stealing: chunk size chosen by its replay
        comm.barrier()
        start = comm.clock
        dp.forward(x)
        balance[policy] = (dp.plan.counts, comm.clock - start, dp.plan.chunk, dp.plan.predicted_s)
    return exact, balance


@pytest.mark.timeout(60)
def test_data_parallel_equals_one_card_and_balances_a_straggler():
    results = run_ranks(_dp_policies, 4, timeout=50)
    for exact, _ in results:
        assert all(err <= 1e-5 for err in exact.values()), exact
    balance = results[0][1]
    even, prop, steal = balance["even"], balance["proportional"], balance["work-stealing"]
    assert even[0] == (64, 64, 64, 64)
    assert prop[0][2] < min(prop[0][r] for r in (0, 1, 3)) and sum(prop[0]) == 256
    assert steal[0][2] < min(steal[0][r] for r in (0, 1, 3)) and sum(steal[0]) == 256
    # Modeled makespans: proportional matches the static 3x straggler; work-stealing pays for its
    # granularity (the straggler keeps the chunk it started) but still beats the even split, and
    # its replay predicts the compute exactly (the output gather comes on top).
    assert prop[1] < 0.55 * even[1] and steal[1] < 0.7 * even[1]
    assert steal[2] in (1, 2, 4, 8, 16, 32, 64) and max(steal[3]) == pytest.approx(steal[1], rel=0.01)


def _pipeline(figures_hbm_limited: bool):
    import hccl_py
    from hccl_py import HcclMemoryError
    from hccl_py.modeled.card import Device
    from hccl_py.parallel import PipelineParallel, TransformerConfig, TransformerEncoder

    comm = hccl_py.init()
    small = TransformerEncoder(TransformerConfig(**SMALL), seed=2)
    x = small.sample_inputs(10)
    ref = _reference(small, x)
    balanced = PipelineParallel(comm, small, microbatches=4)
    err_balanced = float(np.abs(balanced.forward(x) - ref).max())
    explicit = PipelineParallel(comm, small, microbatches=3, split="1,2,2,3")
    err_explicit = float(np.abs(explicit.forward(x) - ref).max())
    # The default transformer (25 MiB of weights) on cards of 16 MiB: one card cannot hold it,
    # four stages can.
    big = TransformerEncoder()
    try:
        big.load(Device(comm.device.model))
        whole_fits = True
    except HcclMemoryError:
        whole_fits = False
    x = big.sample_inputs(4)
    y = PipelineParallel(comm, big, microbatches=2).forward(x)
    err_big = float(np.abs(y - _reference(big, x)).max()) if comm.rank == 0 else 0.0
    return (
        err_balanced,
        err_explicit,
        err_big,
        whole_fits,
        comm.device.capacity_bytes,
        comm.device.peak_bytes,
        balanced.bounds,
        explicit.bounds,
    )


@pytest.mark.timeout(60)
def test_pipeline_equals_one_card_and_fits_where_one_card_cannot(tmp_path):
    figures = tmp_path / "figures.json"
    figures.write_text(json.dumps({"cards": {"ascend910": {"hbm_bytes": 16 << 20}}}))
    results = run_ranks(
        _pipeline, 4, True, env={"HCCL_PY_FIGURES": str(figures), "HCCL_PY_TOPOLOGY": "ascend910-8p"}, timeout=50
    )
    for err_balanced, err_explicit, err_big, whole_fits, capacity, peak, bounds, explicit in results:
        assert err_balanced <= 1e-5 and err_explicit <= 1e-5 and err_big <= 1e-4
        assert not whole_fits and capacity == 16 << 20 and peak <= capacity
        assert bounds[0] == 0 and bounds[-1] == 8 and len(bounds) == 5
        assert explicit == [0, 1, 3, 5, 8]


def _bubble():
    import hccl_py
    from hccl_py.parallel import MLPClassifier, MLPConfig, PipelineParallel

    comm = hccl_py.init()
    comm.device.dry = True  # modeled time only: 256 MiB weight matrices are never touched
    width = 8192
    model = MLPClassifier(MLPConfig(in_features=width, hidden=(width,) * 7, classes=width))  # 8 equal blocks
    x = np.empty((32, width), np.float32)
    four = PipelineParallel(comm, model, microbatches=8)
    four.forward(x)
    pair = comm.create_groups([[0, 1], [2, 3]])
    two = PipelineParallel(pair, model, microbatches=4, split=[4, 4])
    two.forward(x[:16])
    return (four.bounds, four.last.bubble_fraction), (two.bounds, two.last.bubble_fraction)


@pytest.mark.timeout(60)
def test_bubble_of_equal_stages_follows_the_fill_drain_formula():
    results = run_ranks(_bubble, 4, timeout=50)
    (bounds4, bubble4), (bounds2, bubble2) = results[0]
    assert bounds4 == [0, 2, 4, 6, 8] and bounds2 == [0, 4, 8]
    assert bubble4 == pytest.approx(ideal_bubble(4, 8), rel=0.05)  # 3/11
    assert bubble2 == pytest.approx(ideal_bubble(2, 4), rel=0.05)  # 1/5
    assert all(r[0][1] == bubble4 for r in results)  # every stage reports the same pipeline


def _hybrid(policy: str):
    import hccl_py
    from hccl_py.parallel import DataParallel, PipelineParallel, TransformerConfig, TransformerEncoder, hybrid_groups

    comm = hccl_py.init()
    model = TransformerEncoder(TransformerConfig(**SMALL), seed=3)
    x = model.sample_inputs(13)
    pp_comm, dp_comm = hybrid_groups(comm, stages=2)
    dp = DataParallel(dp_comm, PipelineParallel(pp_comm, model, microbatches=3), policy=policy, chunk=2)
    comm.barrier()
    y = dp.forward(x)
    err = float(np.abs(y - _reference(model, x)).max())
    t = comm.device.time
    return err, pp_comm.world_ranks, dp_comm.world_ranks, dp.plan.counts, comm.clock, (t.compute_s, t.comm_s, t.wait_s)


@pytest.mark.timeout(60)
def test_hybrid_equals_one_card_and_modeled_times_repeat_exactly():
    first = run_ranks(_hybrid, 4, "work-stealing", timeout=50)
    for rank, (err, pipeline, replicas, counts, _, _) in enumerate(first):
        assert err <= 1e-5
        assert pipeline == ((0, 1) if rank < 2 else (2, 3)) and replicas == ((0, 2) if rank % 2 == 0 else (1, 3))
        assert sum(counts) == 13
    again = run_ranks(_hybrid, 4, "work-stealing", timeout=50)
    assert [r[3:] for r in again] == [r[3:] for r in first]  # plans, clocks, compute/comm/wait: bit for bit
