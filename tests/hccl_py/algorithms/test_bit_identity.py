"""Every allreduce schedule leaves every rank bit-identical, NaN payloads and signed zeros
included: played in one process, so every world size and partition is cheap to cover.
(The conformance suite holds the same through real processes.)"""

from __future__ import annotations

import numpy as np
import pytest

from hccl_py.algorithms.hierarchical import schedule_for
from hccl_py.algorithms.playback import play
from hccl_py.algorithms.registry import algos_for
from tests.hccl_py.conformance import _special

FLOATS = [np.dtype(np.float32), np.dtype(np.float16)]
OPS = ["sum", "prod", "max", "min"]


def _identical(outs) -> bool:
    first = outs[0].view(np.uint8)
    return all(np.array_equal(o.view(np.uint8), first) for o in outs[1:])


@pytest.mark.parametrize("algo", algos_for("allreduce"))
@pytest.mark.parametrize("size", [2, 3, 4, 5, 6, 7, 8, 9])
def test_flat_allreduce_is_bit_identical(algo, size):
    for dtype in FLOATS:
        for op in OPS:
            for count in (1, size, 3 * size + 1, 64):
                outs = play("allreduce", algo, size, [_special(r, count, dtype) for r in range(size)], op=op)
                assert _identical(outs), (algo, size, dtype, op, count)


@pytest.mark.parametrize(
    "partition",
    [
        [[0, 1], [2, 3]],
        [[0, 1, 2], [3, 4, 5]],
        [[0, 3], [1, 2], [4, 5, 6, 7]],
        [[0, 1, 2, 3], [4, 5, 6, 7]],
        [[0], [1, 2]],
    ],
)
def test_hierarchical_allreduce_is_bit_identical(partition):
    size = sum(len(g) for g in partition)
    for inner in algos_for("reduce_scatter"):
        for outer in algos_for("allreduce"):
            fn = schedule_for("allreduce", partition, inner, outer)
            for op in ("sum", "max"):
                for count in (1, 7, 64):
                    outs = play(
                        "allreduce", fn, size, [_special(r, count, np.dtype(np.float32)) for r in range(size)], op=op
                    )
                    assert _identical(outs), (partition, inner, outer, op, count)
