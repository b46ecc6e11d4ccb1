"""hccl-launch and its Python API: start, supervise and stop the ranks of an hccl-py job.

hccl-launch -n 4 infer.py          # command line (launch/cli.py)
launch.spawn(fn, 4, args=(...))    # from Python: fn(*args) on 4 ranks, results in rank order
"""

from .spawn import SpawnContext, SpawnError, spawn

__all__ = ["spawn", "SpawnContext", "SpawnError"]
