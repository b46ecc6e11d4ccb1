"""algo="hier" through the runtime: 4 real ranks on mixed-4p with a manual partition; results
equal numpy, the modeled clocks equal the simulator's to the last bit, HCCL_ALGO's two levels
reach the hierarchical algorithm, and the partition is agreed and documented on the communicator."""

from __future__ import annotations

import numpy as np
import pytest

from hccl_py.algorithms.hierarchical import schedule_for
from hccl_py.modeled.cost_model import CostModel
from hccl_py.modeled.simulator import simulate
from tests.mp import run_ranks
from topology import Topology

PARTITION = ((1, 2), (0, 3))
CALLS = [  # (collective, algo, count, root)
    ("allreduce", "hier", 1000, 0),
    ("allgather", "hier:ring/hd", 37, 0),
    ("broadcast", "hier", 999, 2),
    ("reduce", "hier:mesh/tree", 64, 3),
    ("reduce_scatter", "hier", 5, 0),
    ("allreduce", "auto", 4096, 0),
]


def _hier_calls():
    import hccl_py

    comm = hccl_py.init()
    out = {"auto_partition": comm.partition}
    comm.set_partition("1,2;0,3")
    out["partition"] = comm.partition
    results, clocks, algos = [], [], []
    for collective, algo, count, root in CALLS:
        rng = np.random.default_rng(comm.rank)
        x = rng.integers(-1000, 1000, count * (comm.size if collective == "reduce_scatter" else 1)).astype(np.int64)
        comm.barrier()
        start = comm.clock
        if collective == "allreduce":
            y = comm.all_reduce(x, algo=algo)
        elif collective == "allgather":
            y = comm.all_gather(x, algo=algo)
        elif collective == "broadcast":
            y = comm.broadcast(x, root=root, algo=algo)
        elif collective == "reduce":
            y = comm.reduce(x, root=root, op="max", algo=algo)
        else:
            y = comm.reduce_scatter(x, algo=algo)
        clocks.append((start, comm.clock))
        results.append(y.reshape(-1).tolist())
        algos.append(comm._rc.recorder.records[-1].algo)
    out.update(results=results, clocks=clocks, algos=algos)
    try:  # a rank that passes another partition is refused on every rank
        comm.set_partition("0,1;2,3" if comm.rank != 2 else "0,2;1,3")
    except hccl_py.HcclParamError as err:
        out["disagree"] = {k: getattr(err, k) for k in ("arg", "rule", "ranks")}
    return out


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_hier_on_a_manual_partition_matches_numpy_and_the_simulator():
    env = {"HCCL_PY_TOPOLOGY": "mixed-4p", "HCCL_ALGO": "allreduce=level0:ring;level1:H-D_R"}
    per_rank = run_ranks(_hier_calls, 4, env=env, timeout=50)
    assert [r["auto_partition"] for r in per_rank] == [((0, 1), (2, 3))] * 4  # HCCL's rule by default
    assert [r["partition"] for r in per_rank] == [PARTITION] * 4
    inputs = {}
    topo = Topology.preset("mixed-4p")
    model = CostModel(topo)
    for i, (collective, algo, count, root) in enumerate(CALLS):
        xs = [
            np.random.default_rng(r)
            .integers(-1000, 1000, count * (4 if collective == "reduce_scatter" else 1))
            .astype(np.int64)
            for r in range(4)
        ]
        inputs[i] = xs
        got = [np.array(per_rank[r]["results"][i]) for r in range(4)]
        if collective == "allreduce":
            want = [sum(xs)] * 4
        elif collective == "allgather":
            want = [np.concatenate(xs)] * 4
        elif collective == "broadcast":
            want = [xs[root]] * 4
        elif collective == "reduce":
            want = [np.maximum.reduce(xs) if r == root else xs[r] for r in range(4)]
        else:
            want = [sum(xs)[r * count : (r + 1) * count] for r in range(4)]
        for r in range(4):
            assert np.array_equal(got[r], want[r]), (collective, algo, r)
        # algo="auto" with HCCL_ALGO's two levels set for allreduce: the two-level algorithm
        resolved = "hier:ring/hd" if algo == "auto" else ("hier:ring/ring" if algo == "hier" else algo)
        assert [per_rank[r]["algos"][i] for r in range(4)] == [resolved] * 4
        inner, outer = resolved.split(":")[1].split("/")
        starts = [per_rank[r]["clocks"][i][0] for r in range(4)]
        ends = [per_rank[r]["clocks"][i][1] for r in range(4)]
        result = simulate(
            collective,
            schedule_for(collective, PARTITION, inner, outer),
            topo,
            count,
            itemsize=8,
            root=root,
            start_clocks=starts,
            cost_model=model,
        )
        assert list(result.end_clocks) == ends, (collective, algo)  # emulator == simulator, to the last bit
    assert all(r["disagree"] == {"arg": "groups", "rule": "agree", "ranks": [2]} for r in per_rank)  # rank 2 differs
