"""Which algorithm serves a call: the caller's ``algo=``, else ``HCCL_ALGO``, else the auto rule.

``HCCL_ALGO`` is read in HCCL's own syntax, globally (``level0:NA;level1:ring``) or per
operator (``allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R``), and in the short
per-operator form ``allreduce=ring/allgather=mesh``. HCCL's names map onto hccl-py's: ``ring``,
``H-D_R`` -> ``hd``, ``fullmesh`` -> ``mesh``, ``NA`` -> automatic. Setting *both* levels
(``level0:ring;level1:H-D_R``) asks for HCCL's two-level algorithm: ``hier:ring/hd``, level0
inside the communicator's groups, level1 across them (``algorithms/hierarchical.py``; the groups
are ``Communicator.partition``). ``algo="hier"`` is ``hier:ring/ring``. HCCL algorithms hccl-py does not
implement (NHR, NB, pipeline, ...) are accepted by the parser and refused, with
``HcclNotSupportedError``, by the call that would use them — never silently replaced.
"""

from __future__ import annotations

import weakref
from typing import Callable

from . import env
from .algorithms.hierarchical import HIER_COLLECTIVES, LEVELS
from .algorithms.registry import ALL_ALGOS, SCHEDULES, algos_for
from .collectives import collective
from .errors import HcclNotSupportedError, HcclParamError

AUTO = "auto"
HIER = "hier"
# HCCL operators that HCCL_ALGO may name and hccl-py does not have (yet): accepted, never used
_OTHER_HCCL_OPS = ("batchsendrecv",)
_HCCL_ALGOS = {"na": AUTO, "auto": AUTO, "h-d_r": "hd", "fullmesh": "mesh", **{a: a for a in ALL_ALGOS}}
HCCL_ONLY_ALGOS = {"nhr", "nhr_v1", "nb", "pipeline", "ahc", "star"}
# HCCL_ALGO names one operator for a family of calls: its AlltoAll setting serves AlltoAllV(C)
_ENV_KEY = {"alltoallv": "alltoall"}

def _parse_levels(text: str, where: str) -> str:
    """'level0:NA;level1:ring' or 'ring' -> the algorithm name (level1 decides the flat case)."""
    text = text.strip()
    if ":" not in text:
        return _algo_name(text, where)
    chosen = AUTO
    levels = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        level, sep, value = part.partition(":")
        if not sep or level.strip().lower() not in ("level0", "level1", "level2"):
            raise HcclParamError(f"HCCL_ALGO: cannot read {part!r} in {where!r}; expected e.g. 'level0:NA;level1:ring'",
                                 variable=env.HCCL_ALGO, value=part, rule="format", expected="level0:<algo>;level1:<algo>")
        name = _algo_name(value, where)
        levels[level.strip().lower()] = name
        if name != AUTO:
            chosen = name
    inner, outer = levels.get("level0", AUTO), levels.get("level1", AUTO)
    if AUTO not in (inner, outer) and inner.lower() not in HCCL_ONLY_ALGOS and outer.lower() not in HCCL_ONLY_ALGOS:
        return f"{HIER}:{inner}/{outer}"  # both levels set: the two-level algorithm
    return chosen


def _algo_name(value: str, where: str) -> str:
    key = value.strip().lower()
    if key in _HCCL_ALGOS:
        return _HCCL_ALGOS[key]
    if key in HCCL_ONLY_ALGOS:
        return value.strip()  # refused by the call that needs it, with the reason
    raise HcclParamError(f"HCCL_ALGO: unknown algorithm {value.strip()!r} in {where!r}; use ring, H-D_R (hd), tree, mesh or NA",
                         variable=env.HCCL_ALGO, value=value.strip(), rule="choices", choices=["ring", "H-D_R", "tree", "mesh", "NA"])


def _hccl_op(name: str) -> str | None:
    """hccl-py's collective name for an operator named in HCCL_ALGO, or None if unknown."""
    if name in _OTHER_HCCL_OPS:
        return name
    try:
        return collective(name).name
    except HcclParamError:
        return None


def parse_hccl_algo(text: str | None) -> dict[str, str]:
    """HCCL_ALGO -> {collective: algo}; key '*' holds the global setting.

    >>> parse_hccl_algo("level0:NA;level1:ring")
    {'*': 'ring'}
    >>> parse_hccl_algo("allreduce=ring/allgather=level0:NA;level1:H-D_R")
    {'allreduce': 'ring', 'allgather': 'hd'}
    """
    if not text or not text.strip():
        return {}
    if "=" not in text:
        return {"*": _parse_levels(text, text)}
    table = {}
    for entry in filter(None, (e.strip() for e in text.split("/"))):
        op, sep, levels = entry.partition("=")
        op_key = _hccl_op(op.strip().lower())
        if not sep or op_key is None:
            raise HcclParamError(
                f"HCCL_ALGO: cannot read {entry!r}; expected '<op>=<algo>' with <op> an HCCL operator (allreduce, allgather, broadcast, reduce, reducescatter, ...)",
                variable=env.HCCL_ALGO, value=entry, rule="format", expected="<op>=<algo>")
        table[op_key] = _parse_levels(levels, entry)
    return table


# algo="auto" decisions per cost model (one per rank and topology), per call shape
_choices: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fastest(cost_model, collective: str, count: int, itemsize: int, world_ranks: tuple[int, ...], root: int = 0) -> str:
    """``algo="auto"``: the algorithm with the least modeled time for this call on this topology
    (an argmin over the cost model, as NCCL's tuning picks); ties go to the earlier in ALL_ALGOS."""
    key = (collective, count, itemsize, world_ranks, root)
    cache = _choices.get(cost_model)
    if cache is None:
        cache = _choices[cost_model] = {}
    best = cache.get(key)
    if best is None:
        from .planning.simulator import simulate

        algos = algos_for(collective)
        times = {algo: simulate(collective, algo, cost_model.topology, count, itemsize=itemsize, root=root,
                                world_ranks=world_ranks, cost_model=cost_model).time_s for algo in algos}
        best = cache[key] = min(algos, key=lambda algo: times[algo])
    return best


def hier_levels(name: str) -> tuple[str, str] | None:
    """``"hier"`` -> ``("ring", "ring")``, ``"hier:ring/H-D_R"`` -> ``("ring", "hd")`` (inner =
    level0, outer = level1); ``None`` for any other name."""
    head, sep, rest = name.strip().lower().partition(":")
    if head != HIER:
        return None
    if not sep:
        return "ring", "ring"
    inner, slash, outer = rest.partition("/")
    if not slash:
        raise HcclParamError(f"algo {name!r}: write hier:<inner>/<outer>, e.g. hier:ring/hd", arg="algo", value=name, rule="format",
                             expected="hier:<inner>/<outer>")
    return _HCCL_ALGOS.get(inner.strip(), inner.strip()), _HCCL_ALGOS.get(outer.strip(), outer.strip())


def _resolve_hier(collective: str, levels: tuple[str, str], source: dict) -> str:
    if collective not in HIER_COLLECTIVES:
        raise HcclNotSupportedError(f"{collective}: no hierarchical algorithm; hier serves {', '.join(HIER_COLLECTIVES)}",
                                    collective=collective, algo=HIER, choices=list(HIER_COLLECTIVES), **source)
    for level, algo, flat in zip(("inner (level0)", "outer (level1)"), levels, LEVELS[collective]):
        for c in flat:
            if (c, algo) not in SCHEDULES:
                raise HcclNotSupportedError(f"{collective}: hier's {level} algorithm {algo!r} has no {c}; "
                                            f"use one of {', '.join(algos_for(c))}", collective=c, algo=algo,
                                            choices=list(algos_for(c)), **source)
    return f"{HIER}:{levels[0]}/{levels[1]}"


def resolve(collective: str, algo: str, choose_auto: Callable[[], str], env_table: dict[str, str]) -> str:
    """The concrete algorithm for one call; raises for names that cannot serve it.

    ``choose_auto`` is called only when the call and HCCL_ALGO both leave the choice open.
    """
    if not isinstance(algo, str):
        raise HcclParamError(f"{collective}: algo must be a string, got {algo!r}", collective=collective, arg="algo",
                             value=repr(algo), rule="type", expected="string")
    name = algo.strip().lower()
    if name == AUTO:
        name = env_table.get(collective, env_table.get(_ENV_KEY.get(collective, collective)))
        if name is None:
            # The global form (level0/level1 for every operator) serves the operators that have
            # that algorithm; the others (an all-to-all under "level1:ring") choose as HCCL would.
            name = env_table.get("*", AUTO)
            levels = hier_levels(name) if name != AUTO else None
            if (name in ALL_ALGOS and name not in algos_for(collective)) or (levels is not None and collective not in HIER_COLLECTIVES):
                name = AUTO
        source = env.HCCL_ALGO
        given = {"variable": "HCCL_ALGO"}  # where the name came from, as error fields
        if name == AUTO:
            return choose_auto()
    else:
        source = "algo="
        given = {"arg": "algo"}
        name = _HCCL_ALGOS.get(name, name)
    levels = hier_levels(name)
    if levels is not None:
        return _resolve_hier(collective, levels, given)
    if name in algos_for(collective):
        return name
    choices = [*algos_for(collective), AUTO]
    if name in ALL_ALGOS:
        raise HcclNotSupportedError(f"{collective}: algo {name!r} serves only {', '.join(c for c, a in SCHEDULES if a == name)}; "
                                    f"use one of {', '.join(algos_for(collective))} or auto", collective=collective, algo=name,
                                    choices=choices, **given)
    if name.lower() in HCCL_ONLY_ALGOS:
        raise HcclNotSupportedError(
            f"{collective}: {source} asks for HCCL's {name} algorithm, which hccl-py does not implement; "
            f"use one of {', '.join(algos_for(collective))} or auto", collective=collective, algo=name, choices=choices, **given
        )
    raise HcclParamError(f"{collective}: unknown algo {algo!r}; use one of {', '.join(algos_for(collective))} or auto",
                         collective=collective, value=algo, rule="choices", choices=choices, **given)
