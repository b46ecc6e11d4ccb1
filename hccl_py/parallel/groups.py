"""Communication groups for hybrid parallelism: pipelines over consecutive ranks (their stages
talk most, so they sit on the fastest links of ``auto`` partitions: one server or HCCS island),
data-parallel groups across pipelines (stage ``s`` of every pipeline).

    pp_comm, dp_comm = hybrid_groups(comm, stages=2)   # 4 ranks: pipelines [0,1] [2,3]; dp [0,2] [1,3]
    tp_comm, dp_comm = tp_dp_groups(comm, tp=2)        # 4 ranks: tensor-parallel [0,1] [2,3]; dp [0,2] [1,3]

Tensor-parallel groups take consecutive ranks for the same reason: they all_reduce twice per layer.
"""

from __future__ import annotations

from ..communicator import Communicator
from ..errors import HcclParamError


def hybrid_partitions(size: int, stages: int) -> tuple[list[list[int]], list[list[int]]]:
    """(pipeline groups, data-parallel groups) of ``size`` ranks with ``stages`` stages each.

    >>> hybrid_partitions(4, 2)
    ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    """
    if stages < 1 or size % stages:
        raise HcclParamError(f"hybrid: {size} ranks do not divide into pipelines of {stages} stages")
    pipelines = [list(range(start, start + stages)) for start in range(0, size, stages)]
    replicas = [list(range(s, size, stages)) for s in range(stages)]
    return pipelines, replicas


def hybrid_groups(comm: Communicator, stages: int) -> tuple[Communicator, Communicator]:
    """This rank's (pipeline communicator, data-parallel communicator); every rank calls it."""
    pipelines, replicas = hybrid_partitions(comm.size, stages)
    return comm.create_groups(pipelines), comm.create_groups(replicas)


def tp_dp_groups(comm: Communicator, tp: int) -> tuple[Communicator, Communicator]:
    """This rank's (tensor-parallel communicator of ``tp`` consecutive ranks, data-parallel
    communicator across the tensor-parallel groups); every rank calls it."""
    if tp < 1 or comm.size % tp:
        raise HcclParamError(
            f"tp x dp: {comm.size} ranks do not divide into tensor-parallel groups of {tp}",
            arg="tp",
            value=tp,
            rule="divisible",
            expected=comm.size,
        )
    groups, replicas = hybrid_partitions(comm.size, tp)
    return comm.create_groups(groups), comm.create_groups(replicas)
