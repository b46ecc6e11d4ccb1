"""Planning without processes: the simulator (modeled time of any collective at cluster scale,
from the same schedules the ranks run), the partition search (which communication groups), and
their commands (``hccl-sim``, ``hccl-bench partition``).

    from hccl_py.planning.simulator import simulate
    simulate("allreduce", "ring", Topology.preset("2x8p-roce"), count=64 << 20).time_s
"""
