"""Error classes mirroring HCCL's ``HcclResult`` codes.

Every error carries ``.code`` (the ``HcclResult`` number) so callers can branch on
the class or the code, as they would on the C return value::

    try:
        comm.all_reduce(x, op="sum")
    except hccl_py.HcclTimeoutError as err:
        print(err.code)   # 9, HCCL_E_TIMEOUT
"""

from __future__ import annotations

import json
from enum import IntEnum

from topology.errors import ErrorFields


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
    E_OPRETRY_FAIL = 23
    E_OOM = 24
    E_IN_STATUS = 1041


class HcclError(ErrorFields, RuntimeError):
    """Base of every hccl-py error; ``code`` is the ``HcclResult`` value.

    Context travels as fields, so callers and tests branch on facts rather than message text
    (the message is for people: it says what went wrong and what to do). A field that does not
    apply is ``None``. The same fact has the same name wherever it is raised:

    - a call: ``rank`` (this rank in the communicator), ``peer`` (the rank it concerns),
      ``ranks`` (several: the waiting peers, the ranks that disagree), ``reporter`` (the rank
      that told this one), ``op`` (the operation: ``allreduce``, ``send``, ``split``, ...),
      ``seq``, ``step``, ``comm`` (the communicator's name), ``collective`` and ``algo`` (the
      collective and algorithm the error is about), ``dtype`` (a data type's name);
    - rejected input: ``arg`` (the argument's name, e.g. ``"root"``), ``variable`` (an
      environment variable: the one with a bad value, or the one to set), ``field`` (a key in a
      document: rank table, figures, partition, a fault ``spec``), ``value`` (the rejected value as
      given), ``rule`` (which check failed when there are several: ``type``, ``range``,
      ``choices``, ``required``, ``unique``, ``format``, ...), ``expected`` (what passes: a type
      or format name, a range such as ``"0..3"``, or the one value), ``choices`` (the accepted
      values), ``holder`` (where a value that must be unique is already used), ``missing_ranks``
      (ranks a partition or rank table leaves out), ``error_id`` (HCCL's report id, ``EI0014``);
    - state: ``state`` (why a communicator or client cannot be used: ``aborted``, ``destroyed``,
      ``forked``, ``closed``), ``timeout_s`` (the bound that expired);
    - resources: ``path``, ``errno``, ``module`` (one that cannot be imported), ``address``,
      ``key``, ``keys`` and ``missing_keys`` (the rendezvous store; a weights file also has
      ``unexpected_keys``); device memory ``allocation`` (what was being allocated) and
      ``requested``, ``free``, ``capacity``, ``peak`` (bytes); ``exit_code`` (a peer's, when it
      is gone: the code it exited with, or minus the signal that killed it);
    - a refusal on another rank (failures.md): ``refused_by`` (the rank that refused the call
      first), ``reason`` (its message); a second thread's call: ``holder_op``, ``holder_thread``
      (the call that held the communicators), ``thread``.

    Any other name given at construction reads back the same way::

        except hccl_py.HcclRemoteError as err:
            print(err.peer, err.op, err.seq)
        except hccl_py.HcclParamError as err:
            print(err.arg, err.value)        # e.g. "root" 5
    """

    code: HcclResult = HcclResult.E_INTERNAL
    FIELDS = (
        "rank",
        "peer",
        "ranks",
        "reporter",
        "op",
        "seq",
        "step",
        "comm",
        "collective",
        "algo",
        "dtype",
        "arg",
        "variable",
        "field",
        "value",
        "rule",
        "expected",
        "choices",
        "holder",
        "missing_ranks",
        "error_id",
        "state",
        "timeout_s",
        "path",
        "errno",
        "module",
        "address",
        "key",
        "keys",
        "missing_keys",
        "unexpected_keys",
        "allocation",
        "requested",
        "free",
        "capacity",
        "peak",
        "exit_code",
        "refused_by",
        "reason",
        "holder_op",
        "holder_thread",
        "thread",
    )

    def __init__(self, message: str, **fields):
        super().__init__(message)
        self.message = message
        self.fields = fields

    def __str__(self) -> str:
        return f"{self.message} [{self.code.name}={int(self.code)}]"

    def __reduce__(self):  # keep the subclass, message and fields across pickling between processes
        return (_rebuild, (type(self), self.message, self.fields))


def _rebuild(cls: type, message: str, fields: dict) -> HcclError:
    return cls(message, **fields)


class HcclParamError(HcclError):
    """Bad argument, or a call that does not match its peers' call (HCCL_E_PARA)."""

    code = HcclResult.E_PARA


class HcclPointerError(HcclParamError):
    """A null pointer where the C API needs memory (HCCL_E_PTR); a bad argument like the others."""

    code = HcclResult.E_PTR


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


# CANN's error ids (Ascend's "HCCL Errors" reference, e.g. CANN 8.1.RC1 maintenance guide,
# atlaserrorcode_15_0240: EI0002 Communication Operation Timeout, EI0005 Inconsistent Collective
# Communication Arguments Between Ranks, EI0006 Get Socket Timeout; a rank table's EI0004 is
# topology/rank_table.py's), in ``error_id`` and in the message, where Ascend's log tooling looks.
CANN_TIMEOUT = "EI0002"
CANN_INCONSISTENT = "EI0005"
CANN_CONNECT_TIMEOUT = "EI0006"


_BY_CODE = {
    cls.code: cls
    for cls in (
        HcclParamError,
        HcclPointerError,
        HcclMemoryError,
        HcclInternalError,
        HcclNotSupportedError,
        HcclSyscallError,
        HcclTimeoutError,
        HcclConnectError,
        HcclRemoteError,
    )
}
WIRE_MESSAGE_CHARS = 4000  # an error crosses processes in one small datagram


def error_class(code: int) -> type[HcclError]:
    """The class of ``HcclResult`` ``code`` (HcclRemoteError for a code hccl-py never raises)."""
    return _BY_CODE.get(code, HcclRemoteError)


def to_wire(error: HcclError) -> bytes:
    """``error`` as bytes for another process: its code, message and fields (the one wire form
    of an error; :func:`from_wire` reads it back)::

        from_wire(to_wire(HcclTimeoutError("late", peer=3))).peer   # 3
    """
    fields = {k: v for k, v in error.fields.items() if isinstance(v, (int, float, str, bool, list, tuple, type(None)))}
    return json.dumps(
        {"code": int(error.code), "message": error.message[:WIRE_MESSAGE_CHARS], "fields": fields}, default=_plain
    ).encode()


def _plain(value):
    """What JSON cannot hold inside a field: a numpy scalar as its Python number, else its text."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return str(value)


def from_wire(data: bytes) -> HcclError:
    """The error :func:`to_wire` wrote; an HcclRemoteError saying so when ``data`` is not one."""
    try:
        decoded = json.loads(bytes(data).decode())
        return error_class(int(decoded["code"]))(str(decoded["message"]), **dict(decoded.get("fields") or {}))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return HcclRemoteError(f"a peer sent an error report that cannot be read ({len(data)} bytes)")
