"""HCCL's C API over hccl-py's runtime: the Python half of hccl-py's ``libhccl.so``.

C programs (hccl_test, HCCL's examples) and ctypes clients (vLLM's pyhccl) call ``hccl/hccl.h``
and ``acl/acl.h``; the library (``hccl_py/native/capi``) forwards each call here, its arguments
as integers, and returns what :func:`dispatch` returns. The entry points are the communicator's
and the card's own operations (``hccl.py``, ``acl.py``): one implementation, the same bytes,
errors and modeled times as the Python API (docs/capi.md). In a C program the library starts an
interpreter of its own (the Python ``HCCL_PY_PYTHON`` names, which ``hccl-npu`` sets); in a Python
process it joins the running one.
"""

from __future__ import annotations

import threading
import traceback

from ..errors import HcclError, HcclResult
from . import abi, acl, hccl  # acl and hccl: their entry points register themselves
from .abi import ACL, ENTRIES, HCCL

_recent: dict[int, str] = {}  # thread ident -> the last failure's message (aclGetRecentErrMsg)


def dispatch(name: str, args: tuple) -> int:
    """Run the C function ``name`` with ``args``; its C result (``HcclResult`` or ``aclError``).
    A failure is returned as its code and written to stderr; nothing raises into C."""
    entry = ENTRIES.get(name)
    if entry is None:
        return int(HcclResult.E_NOT_SUPPORT) if name.startswith("Hccl") else abi.ACL_ERROR_FEATURE_UNSUPPORTED
    fn, family = entry
    try:
        result = fn(*args)
    except Exception as err:  # noqa: BLE001 - every failure becomes the C call's code
        return _failed(name, family, err)
    return 0 if result is None else int(result)


def _failed(name: str, family: str, err: Exception) -> int:
    known = isinstance(err, (abi.AclError, HcclError))
    message = str(err) if known else f"{type(err).__name__}: {err} (an hccl-py bug: please report it)"
    _recent[threading.get_ident()] = message
    if family == HCCL or not known:  # an AscendCL refusal is the caller's to read (aclGetRecentErrMsg)
        hccl.log_failure(name, err if known else message)
    if not known:
        traceback.print_exc()
    return abi.hccl_code(err) if family == HCCL else abi.acl_code(err)


def text(name: str, args: tuple) -> str:
    """The string a C function returns: ``aclGetRecentErrMsg()``, ``aclrtGetSocName()``
    (HcclGetErrorString's strings are the C library's own, static as HCCL's)."""
    if name == "aclGetRecentErrMsg":
        return _recent.pop(threading.get_ident(), "")
    if name == "aclrtGetSocName":
        return acl.soc_name()
    raise KeyError(name)


def shutdown() -> None:
    """At the C program's exit: destroy what is open, so no shared memory outlives the job."""
    hccl.shutdown()


__all__ = ["ACL", "HCCL", "dispatch", "shutdown", "text"]
