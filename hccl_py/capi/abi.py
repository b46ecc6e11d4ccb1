"""What the C side of HCCL's API looks like from Python: result codes, the registry of entry
points, and reads and writes of the caller's memory (out-parameters, arrays of counts).

Every C function of hccl-py's libhccl.so passes its arguments here as integers (a pointer as its
address, an enum as its number); an entry point registered with :func:`c_function` under the C
name returns the C result (None for success) or raises: :class:`AclError` with an ``aclError``
code, an :class:`~hccl_py.errors.HcclError` (its ``code`` is the ``HcclResult``). The numbers are
the interface's, written here from the facts of HCCL's and AscendCL's public documentation (no
header text), and ``include/`` of the prefix repeats them for C.
"""

from __future__ import annotations

import ctypes
from typing import Callable

import numpy as np

from ..errors import HcclError, HcclMemoryError, HcclParamError, HcclPointerError, HcclResult

# -- AscendCL's aclError numbers (acl_base.h's and the runtime's error codes) --------------------------
ACL_SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_UNINITIALIZE = 100001
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_REPEAT_FINALIZE = 100037
ACL_ERROR_PROF_ALREADY_RUN = 100042
ACL_ERROR_PROF_NOT_RUN = 100043
ACL_ERROR_INVALID_DEVICE = 200002
ACL_ERROR_INVALID_RESOURCE_HANDLE = 200005
ACL_ERROR_FEATURE_UNSUPPORTED = 200006
ACL_ERROR_INTERNAL_ERROR = 500000
ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_ERROR_RT_INVALID_DEVICEID = 107001
ACL_ERROR_RT_CONTEXT_NULL = 107002
ACL_ERROR_RT_STREAM_CONTEXT = 107003
ACL_ERROR_RT_INVALID_HANDLE = 107017
ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_MEMORY_FREE = 207002

# The families of entry points: which code a failure that is no AclError/HcclError becomes.
HCCL, ACL = "hccl", "acl"


class AclError(Exception):
    """An AscendCL call refused with ``code`` (an ``aclError`` number); ``message`` is what
    ``aclGetRecentErrMsg`` returns afterwards."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def acl_code(err: BaseException) -> int:
    """The ``aclError`` an AscendCL call returns for ``err``."""
    if isinstance(err, AclError):
        return err.code
    if isinstance(err, HcclMemoryError):
        return ACL_ERROR_RT_MEMORY_ALLOCATION
    if isinstance(err, HcclParamError):
        return ACL_ERROR_INVALID_PARAM
    return ACL_ERROR_INTERNAL_ERROR


def hccl_code(err: BaseException) -> int:
    """The ``HcclResult`` an HCCL call returns for ``err``."""
    if isinstance(err, HcclError):
        return int(err.code)
    if isinstance(err, AclError):
        return int(HcclResult.E_RUNTIME)
    return int(HcclResult.E_INTERNAL)


# -- the registry ---------------------------------------------------------------------------------------
ENTRIES: dict[str, tuple[Callable, str]] = {}  # C name -> (entry point, family)


def c_function(name: str, family: str) -> Callable:
    """Register the decorated function as the C function ``name`` of ``family`` (:data:`HCCL` or
    :data:`ACL`)::

        @c_function("aclrtGetDevice", ACL)
        def get_device(device_out): ...
    """

    def register(fn: Callable) -> Callable:
        if name in ENTRIES:
            raise ValueError(f"{name} is registered twice")
        ENTRIES[name] = (fn, family)
        return fn

    return register


# -- the caller's memory -------------------------------------------------------------------------------
_WRITERS = {
    "u32": ctypes.c_uint32,
    "i32": ctypes.c_int32,
    "u64": ctypes.c_uint64,
    "i64": ctypes.c_int64,
    "ptr": ctypes.c_void_p,
    "f32": ctypes.c_float,
}


def require(address: int, what: str, family: str = HCCL) -> int:
    """``address`` when it is not NULL, else the family's null-pointer error naming ``what``."""
    if not address:
        message = f"{what} is a null pointer"
        if family == ACL:
            raise AclError(ACL_ERROR_INVALID_PARAM, message)
        raise HcclPointerError(message, arg=what, rule="pointer")
    return address


def write(address: int, kind: str, value, what: str, family: str = HCCL) -> None:
    """Store ``value`` as a C ``kind`` (``u32``, ``i32``, ``u64``, ``i64``, ``ptr``, ``f32``) at the
    out-parameter ``what`` (a NULL one is the family's parameter error)."""
    ctype = _WRITERS[kind]
    ctype.from_address(require(address, what, family)).value = value


def read(address: int, kind: str, what: str, family: str = HCCL):
    """The C ``kind`` at ``address`` (see :func:`write`)."""
    return _WRITERS[kind].from_address(require(address, what, family)).value


def read_u64s(address: int, count: int, what: str) -> list[int]:
    """``count`` uint64 values of a caller's array (counts, displacements, a counts matrix)."""
    if count == 0:
        return []
    return np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(require(address, what))).tolist()


def read_bytes(address: int, nbytes: int, what: str, family: str = HCCL) -> bytes:
    """``nbytes`` bytes of the caller's memory at ``address``."""
    return ctypes.string_at(require(address, what, family), nbytes)


def write_bytes(address: int, data: bytes, what: str, family: str = HCCL) -> None:
    """Copy ``data`` to the caller's memory at ``address``."""
    ctypes.memmove(require(address, what, family), data, len(data))


def read_text(address: int, limit: int, what: str, family: str = HCCL) -> str:
    """The NUL-terminated string at ``address`` (read up to its NUL, never past it), as UTF-8;
    one longer than ``limit`` bytes is a parameter error."""
    raw = ctypes.c_char_p(require(address, what, family)).value or b""
    if len(raw) > limit:
        raise HcclParamError(f"{what} is longer than {limit} bytes", arg=what, rule="length")
    return raw.decode("utf-8", "replace")
