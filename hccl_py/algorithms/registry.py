"""One table from (collective, algorithm) to schedule function, shared by the runtime, the
tests, the benchmarks and the simulator.

Algorithm modules follow one naming rule, ``hccl_py/algorithms/<collective>_<algo>.py``, each
exposing ``schedule(rank, size, count, root=0) -> Schedule``::

    fn = get_schedule("allreduce", "ring")
    steps = fn(rank, size, count).steps
"""

from __future__ import annotations

import zlib
from importlib import import_module
from typing import Callable

from ..errors import HcclNotSupportedError
from .schedule import Schedule

ScheduleFn = Callable[..., Schedule]  # (rank, size, count, root=0) -> Schedule

# The algorithms each collective has, in the order ties are broken in.
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "allreduce": ("ring", "tree", "hd", "mesh", "rd", "oneshot", "nhr", "reducebcast", "localreducebcast"),
    "allgather": ("ring", "tree", "hd", "mesh", "nhr"),
    "broadcast": ("ring", "tree", "hd", "mesh"),
    "reduce": ("ring", "tree", "hd", "mesh"),
    "reduce_scatter": ("ring", "tree", "hd", "mesh", "nhr"),
    "alltoall": ("pairwise", "mesh"),
    "scatter": ("ring", "tree", "mesh"),
    "gather": ("ring", "tree", "mesh"),
    "barrier": ("dissemination", "monitored"),
}
# All-to-all with counts per pair (``alltoallv.VSchedule``) runs these algorithms' ``schedule_v``.
V_ALGORITHMS = ("pairwise", "mesh")
# Stable indices for wire headers (append new names at the end). "hier" (two-level, on a
# partition: ``hierarchical.py``) has no entry in SCHEDULES: its schedule function comes from
# ``hierarchical.schedule_for``.
ALL_ALGOS = (
    "ring",
    "tree",
    "hd",
    "mesh",
    "rd",
    "oneshot",
    "dissemination",
    "monitored",
    "hier",
    "pairwise",
    "nhr",
    "reducebcast",
    "localreducebcast",
)
# A two-level algorithm's header code: a checksum of its whole description (levels and partition)
# in TWO_LEVEL_CODES, so ranks that run different two-level algorithms are a call mismatch.
TWO_LEVEL_CODES = range(64, 256)


def algo_code(name: str, detail: str = "") -> int:
    """The wire header's algorithm field for ``name``: its index in ``ALL_ALGOS``, or for a
    two-level name (``hier:...``, described further by ``detail``, e.g. its partition) a code in
    ``TWO_LEVEL_CODES`` taken from a checksum of both::

        algo_code("ring")                              # 0
        algo_code("hier:mesh/ring@server", "0,1;2,3")  # 64 .. 255
    """
    head = name.partition(":")[0]
    if head != "hier":
        return ALL_ALGOS.index(head)
    return TWO_LEVEL_CODES[zlib.crc32(f"{name}|{detail}".encode()) % len(TWO_LEVEL_CODES)]


def algo_label(code: int) -> str:
    """What an error message calls the algorithm of header code ``code``."""
    if code in TWO_LEVEL_CODES:
        return f"hier (two-level #{code})"
    return ALL_ALGOS[code] if 0 <= code < len(ALL_ALGOS) else f"#{code}"


_MODULES = {
    (collective, algo): import_module(f"{__package__}.{collective}_{algo}")
    for collective, algos in ALGORITHMS.items()
    for algo in algos
}
SCHEDULES: dict[tuple[str, str], ScheduleFn] = {key: module.schedule for key, module in _MODULES.items()}
# Algorithms that can also list every rank's steps at once (``StepFlows``), for the simulator at
# cluster scale.
FLOWS = {key: module.flows for key, module in _MODULES.items() if hasattr(module, "flows")}
# ... and whose schedules number ranks from the root, so that their flows serve any root rotated
ROOTED_FLOWS = frozenset(key for key in FLOWS if getattr(_MODULES[key], "RELATIVE_TO_ROOT", False))


def algos_for(collective: str) -> tuple[str, ...]:
    """The algorithms ``collective`` has, in the order ties are broken in."""
    if collective == "alltoallv":
        return V_ALGORITHMS
    return ALGORITHMS.get(collective, ())


def get_schedule(collective: str, algo: "str | ScheduleFn") -> ScheduleFn:
    """The schedule function of ``algo`` for ``collective``; HcclNotSupportedError naming what
    exists when there is none. A schedule function (e.g. a hierarchical one from
    ``hierarchical.schedule_for``) is returned as it is."""
    if callable(algo):
        return algo
    try:
        return SCHEDULES[(collective, algo)]
    except (KeyError, TypeError):
        known = "; ".join(
            f"{c}: {', '.join(a for cc, a in SCHEDULES if cc == c)}" for c in dict.fromkeys(c for c, _ in SCHEDULES)
        )
        raise HcclNotSupportedError(
            f"no algorithm {algo!r} for collective {collective!r}; known: {known}",
            collective=collective,
            algo=algo if isinstance(algo, str) else repr(algo),
            choices=[a for c, a in SCHEDULES if c == collective],
        ) from None
