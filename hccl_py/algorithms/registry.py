"""One table from (collective, algorithm) to schedule function, shared by the runtime, the
tests, the benchmarks and the simulator.

Algorithm modules follow one naming rule, ``hccl_py/algorithms/<collective>_<algo>.py``, each
exposing ``schedule(rank, size, count, root=0) -> Schedule``::

    fn = get_schedule("allreduce", "ring")
    steps = fn(rank, size, count).steps
"""

from __future__ import annotations

from importlib import import_module
from typing import Callable

from ..collectives import DATA_COLLECTIVES
from ..errors import HcclNotSupportedError
from .schedule import Schedule

ScheduleFn = Callable[..., Schedule]  # (rank, size, count, root=0) -> Schedule

ALGOS = ("ring", "tree", "hd", "mesh")  # every collective has these
EXTRA = (("allreduce", "rd"), ("allreduce", "oneshot"), ("barrier", "dissemination"), ("barrier", "monitored"))  # algorithms only some collectives have
# Stable indices for wire headers. "hier" (two-level, on a partition: ``hierarchical.py``) has no
# entry in SCHEDULES: its schedule function comes from ``hierarchical.schedule_for``.
ALL_ALGOS = ALGOS + tuple(dict.fromkeys(algo for _, algo in EXTRA)) + ("hier",)

_MODULES = {
    (collective, algo): import_module(f"{__package__}.{collective}_{algo}")
    for collective, algo in [(c, a) for c in DATA_COLLECTIVES for a in ALGOS] + list(EXTRA)
}
SCHEDULES: dict[tuple[str, str], ScheduleFn] = {key: module.schedule for key, module in _MODULES.items()}
# Algorithms that can also list every rank's steps at once (``StepFlows``), for the simulator at
# cluster scale.
FLOWS = {key: module.flows for key, module in _MODULES.items() if hasattr(module, "flows")}


def algos_for(collective: str) -> tuple[str, ...]:
    """The algorithms ``collective`` has, in ALL_ALGOS order (the order ties are broken in)."""
    return tuple(a for a in ALL_ALGOS if (collective, a) in SCHEDULES)


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
        raise HcclNotSupportedError(f"no algorithm {algo!r} for collective {collective!r}; known: {known}",
                                    collective=collective, algo=algo if isinstance(algo, str) else repr(algo),
                                    choices=[a for c, a in SCHEDULES if c == collective]) from None
