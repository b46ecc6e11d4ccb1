"""Which algorithm serves a call: the caller's ``algo=``, else ``HCCL_ALGO``, else the auto rule.

``algo="auto"`` (:func:`auto`) is HCCL's own rule where one is known (``hccl_rules.py``) and the
model's argmin elsewhere (``argmin.py``); ``names.py`` reads the names and
``HCCL_ALGO``'s grammar (:func:`~hccl_py.choice.names.resolve` turns a call's name into the
algorithm it runs, asking :func:`auto` only when the choice is left open).
"""

from __future__ import annotations

import weakref

from ..algorithms.alltoallv_continuous import fits as fits_ccl_buffer
from ..algorithms.hierarchical import HIER_COLLECTIVES
from ..collectives import CallSpec
from .hccl_rules import FLAT_RULES, Choice, call_shape, flat_choice, hccl_choice
from .names import A2A_CONTINUOUS, A2A_PIPELINE, STAGED


def alltoallv_auto(
    topology, world_ranks: tuple[int, ...], level1: str | None = None, *, exchange: bool = False
) -> Choice:
    """``auto`` of an all-to-all-v: HCCL's all-to-all rule, which does not look at the counts.
    ``exchange``: AlltoAllV (every rank passes its own send and receive counts), which across
    910B servers of two or more NPUs runs HCCL's continuous pipeline; else AlltoAllVC (the whole
    matrix), which runs the two-level pipeline as AlltoAll does."""
    choice = flat_choice(topology, "alltoallv", 0, 1, world_ranks, level1)
    s = call_shape(topology, "alltoallv", 0, 1, world_ranks)
    if (
        exchange
        and s.card == "ascend910b"
        and s.servers > 1
        and s.per_server is not None
        and s.per_server > 1
        and choice.algo in (A2A_PIPELINE, STAGED)
        and level1 != "nhr"
    ):
        # IsSatisfyAlltoallContinuousPipelineCondition (alltoall_operator.cc L725-751): 910B,
        # AlltoAllV, level 1 ring/H-D/pipeline, several NPUs per server, several servers of one
        # size, a CCL buffer of 80 MB or more (HCCL_BUFFSIZE's default 200 MB); no task limit
        rule = (
            f"910B, {s.servers} servers of {s.per_server}, AlltoAllV: RunAlltoAllVContinuousPipeline, the "
            "same-index NPUs' RDMA steps overlapped with the copy before and the in-server distribution after"
        )
        if not fits_ccl_buffer(s.ranks, s.servers):
            rule += (
                f"; at {s.ranks} ranks its 200 MB CCL buffer cannot be split, and HCCL fails the call (HCCL_E_MEMORY)"
            )
        return Choice(A2A_CONTINUOUS, rule)
    return choice


# auto's decisions per cost model, per call shape
_auto_choices: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def auto(
    cost_model, spec: CallSpec, world_ranks: tuple[int, ...], level1: str | None = None, *, deterministic: str = "false"
) -> str:
    """``algo="auto"``: the algorithm HCCL's own rules choose for the call ``spec`` on
    ``world_ranks`` (:func:`hccl_choice`, :data:`FLAT_RULES`); where no rule covers the call (a
    barrier, one rank), the argmin of the model (:func:`fastest`), labelled an estimate.
    ``level1``: the algorithm HCCL_ALGO names for level 1 alone (HCCL's selection then keeps its
    level 0 and skips its own level-1 choice); ``deterministic``: HCCL_DETERMINISTIC, which
    changes HCCL's allreduce and reduce_scatter choices::

        auto(CostModel(topo), CallSpec.of("allreduce", 1 << 20), tuple(range(8)))     # 'mesh'
    """
    key = (spec, world_ranks, level1, deterministic)
    cache = _auto_choices.get(cost_model)
    if cache is None:
        cache = _auto_choices[cost_model] = {}
    found = cache.get(key)
    if found is None:
        found = cache[key] = explain_auto(cost_model, spec, world_ranks, level1, deterministic=deterministic).algo
    return found


def explain_auto(
    cost_model, spec: CallSpec, world_ranks: tuple[int, ...], level1: str | None = None, *, deterministic: str = "false"
) -> Choice:
    """:func:`auto`'s choice with the rule behind it."""
    collective, count, itemsize, root = spec.collective, spec.count, spec.itemsize, spec.root
    if len(world_ranks) > 1 and collective in FLAT_RULES:
        return flat_choice(cost_model.topology, collective, count, itemsize, world_ranks, level1)
    if len(world_ranks) == 1 or collective not in HIER_COLLECTIVES:
        from .argmin import fastest  # lazy: it loads the simulator, which a rule's answer never needs

        best = fastest(cost_model, collective, count, itemsize, world_ranks, root)
        return Choice(best, "no HCCL rule: the least modeled time (estimate)", True)
    return hccl_choice(
        call_shape(
            cost_model.topology, collective, count, itemsize, world_ranks, spec.dtype_name, spec.op_name, deterministic
        ),
        level1,
    )
