"""Error classes mirroring HCCL's ``HcclResult`` codes.

Every error carries ``.code`` (the ``HcclResult`` number) so callers can branch on
the class or the code, as they would on the C return value::

    try:
        comm.all_reduce(x, op="sum")
    except hccl_py.HcclTimeoutError as err:
        print(err.code)   # 9, HCCL_E_TIMEOUT
"""

from __future__ import annotations

from enum import IntEnum


class HcclResult(IntEnum):
    """``HcclResult`` from CANN's ``hccl_types.h``."""

    SUCCESS = 0
    E_PARA = 1
    E_PTR = 2
    E_MEMORY = 3
    E_INTERNAL = 4
    E_NOT_SUPPORT = 5
    E_NOT_FOUND = 6
    E_UNAVAIL = 7
    E_SYSCALL = 8
    E_TIMEOUT = 9
    E_OPEN_FILE_FAILURE = 10
    E_TCP_CONNECT = 11
    E_ROCE_CONNECT = 12
    E_TCP_TRANSFER = 13
    E_ROCE_TRANSFER = 14
    E_RUNTIME = 15
    E_DRV = 16
    E_PROFILING = 17
    E_CCE = 18
    E_NETWORK = 19
    E_AGAIN = 20
    E_REMOTE = 21
    E_SUSPENDING = 22


class HcclError(RuntimeError):
    """Base of every hccl-py error; ``code`` is the ``HcclResult`` value."""

    code: HcclResult = HcclResult.E_INTERNAL

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.code.name}={int(self.code)}]"

    def __reduce__(self):  # keep the subclass (and message) across pickling between processes
        return (type(self), (self.message,))


class HcclParamError(HcclError):
    """Bad argument, or a call that does not match its peers' call (HCCL_E_PARA)."""

    code = HcclResult.E_PARA


class HcclMemoryError(HcclError):
    """Memory error (HCCL_E_MEMORY)."""

    code = HcclResult.E_MEMORY


class HcclInternalError(HcclError):
    """Internal failure, including use of an aborted or destroyed communicator (HCCL_E_INTERNAL)."""

    code = HcclResult.E_INTERNAL


class HcclNotSupportedError(HcclError):
    """The requested algorithm or feature cannot serve this call (HCCL_E_NOT_SUPPORT)."""

    code = HcclResult.E_NOT_SUPPORT


class HcclSyscallError(HcclError):
    """An operating-system call failed (HCCL_E_SYSCALL)."""

    code = HcclResult.E_SYSCALL


class HcclTimeoutError(HcclError):
    """A wait exceeded HCCL_CONNECT_TIMEOUT or HCCL_EXEC_TIMEOUT (HCCL_E_TIMEOUT)."""

    code = HcclResult.E_TIMEOUT


class HcclConnectError(HcclError):
    """The rendezvous store or a peer could not be reached (HCCL_E_TCP_CONNECT)."""

    code = HcclResult.E_TCP_CONNECT


class HcclRemoteError(HcclError):
    """A peer failed or exited while this rank depended on it (HCCL_E_REMOTE)."""

    code = HcclResult.E_REMOTE
