"""Cross-memory attach (Linux ``process_vm_readv``): one rank reads a peer's buffer straight into
its own, one copy instead of two through a shared segment (what MPICH does for large messages
on one host). Needs permission to read the peer (same user; with Yama ptrace_scope 1 the peer
must allow it, which :func:`allow_readers` does)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno

import numpy as np

PR_SET_PTRACER = 0x59616D61  # "Yama"
PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _load():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        readv = libc.process_vm_readv
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None, None
    readv.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    readv.restype = ctypes.c_ssize_t
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return readv, prctl


_READV, _PRCTL = _load()


def allow_readers() -> None:
    """Let any process of this user read this one (a no-op without Yama)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0)


def read_into(pid: int, address: int, out: np.ndarray) -> None:
    """Copy ``out.nbytes`` bytes at ``address`` in process ``pid`` into ``out`` (C-contiguous).

    Raises ProcessLookupError when the process is gone, PermissionError when it may not be read.
    """
    if _READV is None:
        raise PermissionError("process_vm_readv is not available")
    base, total = out.ctypes.data, out.nbytes
    done = 0
    while done < total:
        local = _IoVec(base + done, total - done)
        remote = _IoVec(address + done, total - done)
        n = _READV(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n <= 0:
            err = ctypes.get_errno()
            if err == errno.ESRCH:
                raise ProcessLookupError(f"process {pid} is gone")
            if err == errno.EINTR:
                continue
            raise PermissionError(f"cannot read process {pid}: {errno.errorcode.get(err, err)}")
        done += n


def can_read(pid: int, address: int, expected: int) -> bool:
    """Whether this process may read ``pid`` (probing an 8-byte value there)."""
    probe = np.zeros(1, np.uint64)
    try:
        read_into(pid, address, probe)
    except (PermissionError, ProcessLookupError):
        return False
    return int(probe[0]) == expected
