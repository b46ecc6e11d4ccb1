"""How many threads numpy's BLAS may use in this rank.

Ranks of one job share the host's cores. OpenBLAS starts one busy-waiting thread per core in
every process, so four ranks on two cores run a matmul many times slower than one thread each
would. :func:`limit_blas_threads` sets the count at run time (environment variables such as
``OPENBLAS_NUM_THREADS`` only work before numpy loads, which a forkserver-started rank is past).
``Model.load`` calls :func:`auto_limit` once per process: cores // ranks on this host, unless the
user set one of the usual environment variables.

    limit_blas_threads(1)      # True if a BLAS library took the setting
"""

from __future__ import annotations

import ctypes
import os

from .. import env

_SETTERS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "MKL_Set_Num_Threads",
)
_USER_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_done = False


def limit_blas_threads(n: int) -> bool:
    """Set the BLAS thread count of the libraries loaded in this process; True if one took it."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "blas" in line.lower() or "mkl_rt" in line.lower()})
    except OSError:
        return False
    done = False
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(ctypes.c_int(max(1, int(n))))
                done = True
    return done


def auto_limit() -> None:
    """Once per process: cores // ranks-on-this-host BLAS threads, unless the user chose."""
    global _done
    if _done:
        return
    _done = True
    if any(os.environ.get(v) for v in _USER_VARS):
        return
    local = int(os.environ.get(env.LOCAL_WORLD_SIZE) or 1)
    if local <= 1:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit_blas_threads(max(1, cores // local))
