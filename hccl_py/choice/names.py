"""What an algorithm's name means: ``algo=`` and ``HCCL_ALGO``'s grammar, a name's levels, partition and schedule.

``HCCL_ALGO`` is read in HCCL's own syntax, globally (``level0:NA;level1:ring``) or per
operator (``allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:H-D_R``), and in the short
per-operator form ``allreduce=ring/allgather=mesh``. Level 1 alone (``level0:NA;level1:ring``) is
what HCCL does with it: its own level 0 for the topology, that algorithm across servers, nothing
inside one server (``auto(level1=...)``). HCCL's names map onto hccl-py's: ``ring``,
``H-D_R`` -> ``hd``, ``NHR`` -> ``nhr``, ``fullmesh`` -> ``mesh``, ``NA`` -> automatic; ``level1:pipeline``
is HCCL's pipeline, ``hier:mesh/pipeline`` (allgather, reduce_scatter, allreduce; in the global
form the other operators stay automatic, as HCCL resets it). Setting *both* levels
(``level0:ring;level1:H-D_R``) asks for HCCL's two-level algorithm: ``hier:ring/hd``, level0
inside the communicator's groups, level1 across them (``algorithms/hierarchical.py``; the groups
are ``Communicator.partition``). ``algo="hier"`` is ``hier:ring/ring``. HCCL algorithms hccl-py does not
implement (NHR_V1, NB, AHC, ...) are accepted by the parser and refused, with
``HcclNotSupportedError``, by the call that would use them — never silently replaced.
"""

from __future__ import annotations

from typing import Callable

from topology import auto_partition

from .. import env
from ..algorithms.alltoall_staged import CONTINUOUS
from ..algorithms.hierarchical import (
    FIRST,
    LEVELS,
    TWO_LEVEL,
    across_first,
    schedule_for,
    whole_buffer,
)
from ..algorithms.pipeline import PIPELINED
from ..algorithms.registry import ALL_ALGOS, SCHEDULES, algos_for, get_schedule
from ..collectives import collective
from ..errors import HcclNotSupportedError, HcclParamError

AUTO = "auto"
HIER = "hier"
# HCCL operators that HCCL_ALGO may name and hccl-py does not have (yet): accepted, never used
_OTHER_HCCL_OPS = ("batchsendrecv",)
_HCCL_ALGOS = {"na": AUTO, "auto": AUTO, "h-d_r": "hd", "fullmesh": "mesh", **{a: a for a in ALL_ALGOS}}
HCCL_ONLY_ALGOS = {"nhr_v1", "nb", "ahc", "star"}
LEVEL1 = "level1:"  # HCCL_ALGO naming level 1 alone: auto's level 0, this algorithm across servers
_LEVEL1_ALGOS = ("ring", "hd", "nhr")  # HCCL's level-1 algorithms hccl-py has (pipeline: PIPELINE)
PIPELINE = f"{HIER}:mesh/pipeline"  # HCCL's pipeline: a two-level algorithm whose level 0 is the mesh
_ALIASES = {"pipeline": PIPELINE}
_PIPELINES = (*PIPELINED, "alltoall", "alltoallv")  # the pipelined all-to-all: algorithms/alltoall_staged.py
# Operators HCCL runs an algorithm for and hccl-py does not: HCCL_ALGO's global form refuses
# them rather than choose another (NHR: broadcast_nhr.cc, reduce_nhr_oneshot.cc, scatter_nhr.cc)
_HCCL_HAS = {"nhr": ("broadcast", "reduce", "scatter")}
# HCCL_ALGO names one operator for a family of calls: its AlltoAll setting serves AlltoAllV(C)
_ENV_KEY = {"alltoallv": "alltoall"}

SERVER = "@server"  # suffix of a two-level choice on the partition by server
GROUPS = "@groups"  # ... on HCCL's mesh-aggregation groups: servers, a 910 server split by HCCS island
STAGED = f"{HIER}:mesh/pairwise{GROUPS}"  # HCCL's RunAlltoAllVStaged on its mesh-aggregation groups
A2A_PIPELINE = f"{PIPELINE}{GROUPS}"  # HCCL's RunAlltoAllVTwoLevelPipeline on them
A2A_CONTINUOUS = f"{HIER}:mesh/{CONTINUOUS}{GROUPS}"  # HCCL's RunAlltoAllVContinuousPipeline (AlltoAllV)


def _parse_levels(text: str, where: str) -> str:
    """'level0:NA;level1:ring' -> 'level1:ring' (level 1 alone: auto keeps HCCL's level 0 and runs
    ring across servers), 'level0:ring;level1:NA' -> 'auto' (HCCL ignores level 0), both levels
    'level0:ring;level1:H-D_R' -> 'hier:ring/hd' (hccl-py's request for that two-level algorithm),
    'ring' -> 'ring'."""
    text = text.strip()
    if ":" not in text:
        return _algo_name(text, where)
    chosen = AUTO
    levels = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        level, sep, value = part.partition(":")
        if not sep or level.strip().lower() not in ("level0", "level1", "level2"):
            raise HcclParamError(
                f"HCCL_ALGO: cannot read {part!r} in {where!r}; expected e.g. 'level0:NA;level1:ring'",
                variable=env.HCCL_ALGO,
                value=part,
                rule="format",
                expected="level0:<algo>;level1:<algo>",
            )
        name = _algo_name(value, where)
        levels[level.strip().lower()] = name
        if name != AUTO:
            chosen = name
    inner, outer = levels.get("level0", AUTO), levels.get("level1", AUTO)
    if outer == PIPELINE:  # HCCL's pipeline: level 0 is its full mesh
        return PIPELINE if inner in (AUTO, "mesh") else f"{HIER}:{inner}/pipeline"
    if inner == AUTO and outer in _LEVEL1_ALGOS:
        return f"{LEVEL1}{outer}"  # level 1 alone: HCCL's level 0 for the topology, this across servers
    if inner == AUTO and outer == "mesh":
        return AUTO  # HCCL ignores level1:fullmesh (alg_configurator.cc L259-265)
    if outer == AUTO and inner != AUTO:
        return AUTO  # HCCL ignores any level-0 setting (alg_configurator.cc SetAlgoLevel0Module L374-386)
    if AUTO not in (inner, outer) and inner.lower() not in HCCL_ONLY_ALGOS and outer.lower() not in HCCL_ONLY_ALGOS:
        return f"{HIER}:{inner}/{outer}"  # both levels set: the two-level algorithm
    return chosen


def _algo_name(value: str, where: str) -> str:
    key = value.strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    if key in _HCCL_ALGOS:
        return _HCCL_ALGOS[key]
    if key in HCCL_ONLY_ALGOS:
        return value.strip()  # refused by the call that needs it, with the reason
    raise HcclParamError(
        f"HCCL_ALGO: unknown algorithm {value.strip()!r} in {where!r}; use ring, H-D_R (hd), NHR, tree, mesh or NA",
        variable=env.HCCL_ALGO,
        value=value.strip(),
        rule="choices",
        choices=["ring", "H-D_R", "NHR", "tree", "mesh", "NA"],
    )


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
    {'*': 'level1:ring'}
    >>> parse_hccl_algo("allreduce=ring/allgather=level0:NA;level1:H-D_R")
    {'allreduce': 'ring', 'allgather': 'level1:hd'}
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
                variable=env.HCCL_ALGO,
                value=entry,
                rule="format",
                expected="<op>=<algo>",
            )
        table[op_key] = _parse_levels(levels, entry)
    return table


def hier_levels(name: str) -> tuple[str, str] | None:
    """``"hier"`` -> ``("ring", "ring")``, ``"hier:ring/H-D_R"`` -> ``("ring", "hd")`` (inner =
    level0, outer = level1; a trailing ``@server`` or ``@groups`` names the partition, see
    :func:`partition_of`);
    ``None`` for any other name."""
    head, sep, rest = name.strip().lower().removesuffix(SERVER).removesuffix(GROUPS).partition(":")
    if head != HIER:
        return None
    if not sep:
        return "ring", "ring"
    inner, slash, outer = rest.partition("/")
    if not slash:
        raise HcclParamError(
            f"algo {name!r}: write hier:<inner>/<outer>, e.g. hier:ring/hd",
            arg="algo",
            value=name,
            rule="format",
            expected="hier:<inner>/<outer>",
        )
    return _HCCL_ALGOS.get(inner.strip(), inner.strip()), _HCCL_ALGOS.get(outer.strip(), outer.strip())


def is_continuous(name: str) -> bool:
    """Whether ``name`` (with or without its ``@groups``) is HCCL's continuous pipeline."""
    return hier_levels(name) == ("mesh", CONTINUOUS)


def _resolve_hier(collective: str, levels: tuple[str, str], source: dict) -> str:
    if across_first(levels[1]):
        if collective != "reduce_scatter":
            raise HcclNotSupportedError(
                f"{collective}: across first (hier:<inner>/<outer>{FIRST}) is for reduce_scatter",
                collective=collective,
                algo=f"{HIER}:{levels[0]}/{levels[1]}",
                choices=["reduce_scatter"],
                **source,
            )
        name = _resolve_hier(collective, (levels[0], levels[1][: -len(FIRST)]), source)
        return name + FIRST
    if levels[1] == CONTINUOUS:
        if collective != "alltoallv" or levels[0] != "mesh":
            raise HcclNotSupportedError(
                f"{collective}: HCCL's continuous pipeline is hier:mesh/{CONTINUOUS}, for alltoallv",
                collective=collective,
                algo=f"{HIER}:{levels[0]}/{CONTINUOUS}",
                choices=["alltoallv"],
                **source,
            )
        return f"{HIER}:mesh/{CONTINUOUS}"
    if levels[1] == "pipeline":
        if collective not in _PIPELINES or levels[0] != "mesh":
            raise HcclNotSupportedError(
                f"{collective}: HCCL's pipeline is hier:mesh/pipeline, for {', '.join(_PIPELINES)}",
                collective=collective,
                algo=f"{HIER}:{levels[0]}/pipeline",
                choices=list(_PIPELINES),
                **source,
            )
        return PIPELINE
    if collective not in TWO_LEVEL:
        raise HcclNotSupportedError(
            f"{collective}: no hierarchical algorithm; hier serves {', '.join(TWO_LEVEL)}",
            collective=collective,
            algo=HIER,
            choices=list(TWO_LEVEL),
            **source,
        )
    needs = LEVELS[collective]
    if collective == "allreduce" and whole_buffer(levels[0]):  # whole buffers, an allreduce at each level
        needs = (("allreduce",), ("allreduce",))
    for level, algo, flat in zip(("inner (level0)", "outer (level1)"), levels, needs):
        for c in flat:
            if (c, algo) not in SCHEDULES:
                raise HcclNotSupportedError(
                    f"{collective}: hier's {level} algorithm {algo!r} has no {c}; use one of {', '.join(algos_for(c))}",
                    collective=c,
                    algo=algo,
                    choices=list(algos_for(c)),
                    **source,
                )
    return f"{HIER}:{levels[0]}/{levels[1]}"


def resolve(collective: str, algo: str, choose_auto: Callable[..., str], env_table: dict[str, str]) -> str:
    """The concrete algorithm for one call; raises for names that cannot serve it.

    ``choose_auto`` is called only when the call and HCCL_ALGO both leave the choice open (HCCL
    ignores a level-0 setting alone), or when HCCL_ALGO names level 1 alone
    (``choose_auto(level1=algo)``: HCCL's level 0 for the topology, that algorithm across servers;
    :func:`auto`).
    """
    if not isinstance(algo, str):
        raise HcclParamError(
            f"{collective}: algo must be a string, got {algo!r}",
            collective=collective,
            arg="algo",
            value=repr(algo),
            rule="type",
            expected="string",
        )
    name = algo.strip().lower()
    if name == AUTO:
        name = env_table.get(collective, env_table.get(_ENV_KEY.get(collective, collective)))
        if name is None:
            # The global form (level0/level1 for every operator) serves the operators that have
            # that algorithm; the others (an all-to-all under "level1:ring") choose as HCCL would.
            name = env_table.get("*", AUTO)
            levels = hier_levels(name) if name != AUTO else None
            if levels is not None and levels[1] == "pipeline" and collective in ("broadcast", "reduce"):
                name = f"{LEVEL1}hd"  # their operators reset a pipeline to H-D_R (reduce_operator.cc L20-25)
            elif (
                (name in ALL_ALGOS and name not in algos_for(collective) and collective not in _HCCL_HAS.get(name, ()))
                or (levels is not None and collective not in TWO_LEVEL)
                or (levels is not None and levels[1] == "pipeline" and collective not in _PIPELINES)
            ):
                name = AUTO
        source = env.HCCL_ALGO
        given = {"variable": env.HCCL_ALGO}  # where the name came from, as error fields
        if name == AUTO:
            return choose_auto()
        if name.startswith(LEVEL1):
            return choose_auto(level1=name[len(LEVEL1) :])
    else:
        source = "algo="
        given = {"arg": "algo"}
        name = _ALIASES.get(name, _HCCL_ALGOS.get(name, name))
    levels = hier_levels(name)
    if levels is not None:
        return _resolve_hier(collective, levels, given)
    if name in algos_for(collective):
        return name
    choices = [*algos_for(collective), AUTO]
    if name in ALL_ALGOS:
        raise HcclNotSupportedError(
            f"{collective}: algo {name!r} serves only {', '.join(c for c, a in SCHEDULES if a == name)}; "
            f"use one of {', '.join(algos_for(collective))} or auto",
            collective=collective,
            algo=name,
            choices=choices,
            **given,
        )
    if name.lower() in HCCL_ONLY_ALGOS:
        raise HcclNotSupportedError(
            f"{collective}: {source} asks for HCCL's {name} algorithm, which hccl-py does not implement; "
            f"use one of {', '.join(algos_for(collective))} or auto",
            collective=collective,
            algo=name,
            choices=choices,
            **given,
        )
    raise HcclParamError(
        f"{collective}: unknown algo {algo!r}; use one of {', '.join(algos_for(collective))} or auto",
        collective=collective,
        value=algo,
        rule="choices",
        choices=choices,
        **given,
    )


def schedule_fn(topology, collective: str, name: str, world_ranks: tuple[int, ...], partition=None):
    """The schedule function a resolved algorithm ``name`` runs on ``world_ranks``: a flat
    algorithm's, or a two-level one's on :func:`groups_for` (``partition``: the groups of a plain
    ``hier:`` name, or a function giving them; default by server). The one place a name becomes
    a schedule, for the communicator, ``simulate_call`` and the model's argmin alike::

        schedule_fn(topo, "allreduce", "hier:mesh/ring@server", tuple(range(16)))(0, 16, 1024, 0)
    """
    levels = hier_levels(name)
    if levels is None:
        return get_schedule(collective, name)
    return schedule_for(collective, groups_for(topology, name, world_ranks, partition), *levels)


def groups_for(topology, name: str, world_ranks, partition=None) -> tuple[tuple[int, ...], ...]:
    """The groups (ranks 0..n-1 of ``world_ranks``) a two-level ``name`` runs on: by server for
    ``...@server``, HCCL's mesh groups for ``...@groups``, else ``partition`` (a partition, or a
    function giving it: the communicator's own), by server when that is None."""
    groups = partition_of(topology, name, world_ranks)
    if groups is None:
        groups = partition() if callable(partition) else partition
    return groups if groups is not None else server_partition(topology, world_ranks)


def topology_partition(topology, world_ranks) -> tuple[tuple[int, ...], ...]:
    """The communicator's ranks (0..n-1) in HCCL's mesh-aggregation groups: by server, a 910
    server's by HCCS island (``topology.auto_partition``); the groups of the staged all-to-all."""
    index = {w: r for r, w in enumerate(world_ranks)}
    return tuple(tuple(index[w] for w in g) for g in auto_partition(topology, world_ranks))


def partition_of(topology, name: str, world_ranks) -> tuple[tuple[int, ...], ...] | None:
    """The partition a two-level name runs on: by server for ``...@server``, HCCL's mesh groups
    for ``...@groups``; ``None`` for the communicator's own (``Communicator.partition``)."""
    name = name.strip().lower()
    if name.endswith(SERVER):
        return server_partition(topology, world_ranks)
    if name.endswith(GROUPS):
        return topology_partition(topology, world_ranks)
    return None


def server_partition(topology, world_ranks) -> tuple[tuple[int, ...], ...]:
    """The communicator's ranks (0..n-1) grouped by the server of their world rank: the partition
    of HCCL's two-level algorithms (level0 inside a server, level1 across servers)."""
    groups: dict[int, list[int]] = {}
    for r, w in enumerate(world_ranks):
        groups.setdefault(topology.server_of(w), []).append(r)
    return tuple(tuple(g) for g in groups.values())
