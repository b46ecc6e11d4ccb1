"""hccl-py: HCCL's collectives over ordinary processes, one process per simulated NPU card.

import numpy as np, hccl_py as hccl
comm = hccl.init()
x = np.full(1000, comm.rank, np.float32)
comm.all_reduce(x)
"""

from .communicator import Communicator
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
from .runtime import init

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


def __getattr__(name: str):
    if name == "bfloat16":  # ml_dtypes' bfloat16, loaded on first use (importing it takes most of a second)
        from . import dtypes  # lazy: ml_dtypes, loaded on first use of bfloat16

        return dtypes.bfloat16
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
