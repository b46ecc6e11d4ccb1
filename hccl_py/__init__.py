"""hccl-py: HCCL's collectives over ordinary processes, one process per simulated NPU card.

import numpy as np, hccl_py as hccl
comm = hccl.init()
x = np.full(1000, comm.rank, np.float32)
comm.all_reduce(x)
"""

from .dtypes import ReduceOp
from .errors import (
    HcclConnectError,
    HcclError,
    HcclInternalError,
    HcclMemoryError,
    HcclNotSupportedError,
    HcclParamError,
    HcclRemoteError,
    HcclResult,
    HcclSyscallError,
    HcclTimeoutError,
)
from .faults import Fault, parse_fault
from .records import dump_flight_recorder

__all__ = [
    "Communicator",
    "HcclConnectError",
    "HcclError",
    "HcclInternalError",
    "HcclMemoryError",
    "HcclNotSupportedError",
    "HcclParamError",
    "HcclRemoteError",
    "HcclResult",
    "HcclSyscallError",
    "HcclTimeoutError",
    "ReduceOp",
    "Fault",
    "bfloat16",
    "dump_flight_recorder",
    "init",
    "parse_fault",
]
__version__ = "0.1.0"


# Loaded on first use: the runtime (communicator, executor, algorithms, topology) is most of
# what importing hccl_py cost, and a process that only catches hccl-py's errors or reads a flight
# record needs none of it. (hccl-launch imports it once before it forks the ranks: launch/fork.py.)
_LAZY = {"Communicator": "communicator", "init": "runtime"}


def __getattr__(name: str):
    if name == "bfloat16":  # ml_dtypes' bfloat16, loaded on first use (importing it takes most of a second)
        from . import dtypes  # lazy: ml_dtypes, loaded on first use of bfloat16

        return dtypes.bfloat16
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # once: later lookups find it without this hook
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
