"""Planning without processes, above the runtime's schedule simulator (``hccl_py/modeled/simulator.py``):
a call as a program would run it (``calls.py``: ``auto``'s choice, all-to-all-v), the partition
search (which communication groups), calibration, and their commands (``hccl-sim``,
``hccl-bench partition``).

    from hccl_py.modeled.simulator import simulate
    simulate("allreduce", "ring", Topology.preset("2x8p-roce"), count=64 << 20).time_s
"""
