"""Communication-group partitions: HCCL's automatic rule, and hand-written ones validated.

A partition is a list of rank lists; every rank of the job appears in exactly one group. The
runtime creates one communicator per group from it in one call.

>>> auto_partition(Topology.preset("ascend910-8p"))          # doctest: +SKIP
[[0, 1, 2, 3], [4, 5, 6, 7]]
>>> load_partition("0,2;1,3")
[[0, 2], [1, 3]]
"""

from __future__ import annotations

import json
import operator
import os
from pathlib import Path
from typing import Any, Iterable, Protocol

from .errors import TopologyError


class _TopologyLike(Protocol):
    num_ranks: int

    def server_of(self, rank: int) -> int: ...
    def island_of(self, rank: int) -> int | None: ...


def auto_partition(topo: _TopologyLike, ranks: Iterable[int] | None = None) -> list[list[int]]:
    """Group ``ranks`` (default: all) the way HCCL groups by topology.

    1. By server: ranks on one server form a group (traffic inside a server never touches RoCE).
    2. Within a server, by HCCS island when the server has islands and its group would otherwise
       span more than one island (an 8-card Atlas 800 (9000) job splits into 0-3 and 4-7: cross-
       island traffic would go over PCIe and the host).
    3. One server without islands (PCIe-only or bridged cards): HCCL has no topology to go by, so
       it takes consecutive ranks in pairs, {0,1}, {2,3}, ... (a trailing odd rank alone). Rank
       order follows the PCIe slot order, so neighbours in rank order are the likeliest to share a
       switch, and a pair is the smallest group that communicates (the two chips of an Atlas
       300I Duo card are such a pair). This is the rule that misses the fast pair {1,2} of
       ``mixed-4p``.

    Ranks keep their given order inside each group; groups come in order of their first rank::

        auto_partition(Topology.preset("ascend910-8p"))                   # [[0, 1, 2, 3], [4, 5, 6, 7]]
        auto_partition(Topology.preset("2x8p-roce"), ranks=range(6, 10))  # [[6, 7], [8, 9]]
    """
    chosen = _ranks(topo, ranks)
    by_server: dict[int, list[int]] = {}
    for r in chosen:
        by_server.setdefault(topo.server_of(r), []).append(r)
    if len(by_server) == 1 and all(topo.island_of(r) is None for r in chosen):
        return [chosen[i : i + 2] for i in range(0, len(chosen), 2)]
    groups: list[list[int]] = []
    for members in by_server.values():
        islands = {topo.island_of(r) for r in members}
        if len(islands) <= 1:
            groups.append(members)
            continue
        by_island: dict[int | None, list[int]] = {}
        for r in members:
            by_island.setdefault(topo.island_of(r), []).append(r)
        groups.extend(by_island.values())
    groups.sort(key=lambda g: g[0])
    return groups


def validate_partition(groups: Any, num_ranks: int | None = None) -> list[list[int]]:
    """Check that ``groups`` puts every rank 0..num_ranks-1 in exactly one non-empty group;
    return it as a list of lists of ``int`` (order kept). Without ``num_ranks`` the groups
    must partition 0..n-1 for the n ranks they list.

    >>> validate_partition([[0, 2], [1, 3]], 4)
    [[0, 2], [1, 3]]
    >>> validate_partition([[0, 3], [1, 3]], 4)                 # doctest: +SKIP
    TopologyError: rank 3 appears in groups 0 and 1. Fix: ...
    """
    if num_ranks is not None and (isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 1):
        raise TopologyError(
            f"num_ranks must be a positive integer, got {num_ranks!r}.",
            "num_ranks",
            value=num_ranks,
            rule="range",
            expected=">= 1",
        )
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Iterable):
        raise TopologyError(
            f"groups must be a list of rank lists such as [[0, 2], [1, 3]], got {type(groups).__name__}.",
            "groups",
            rule="type",
            expected="list",
        )
    out: list[list[int]] = []
    where: dict[int, int] = {}
    for g, group in enumerate(groups):
        if isinstance(group, (str, bytes)) or not isinstance(group, Iterable):
            raise TopologyError(
                f"group {g} must be a list of ranks, got {group!r}.",
                f"groups[{g}]",
                value=group,
                rule="type",
                expected="list",
            )
        members = []
        for item in group:
            rank = _as_rank(item, f"groups[{g}]")
            if rank < 0 or (num_ranks is not None and rank >= num_ranks):
                raise _out_of_range(rank, g, num_ranks)
            if rank in where:
                other = where[rank]
                detail = f"twice in group {g}" if other == g else f"in groups {other} and {g}"
                raise TopologyError(
                    f"rank {rank} appears {detail}. Fix: put every rank in exactly one group.",
                    f"groups[{g}]",
                    value=rank,
                    rule="unique",
                    holder=f"groups[{other}]",
                )
            where[rank] = g
            members.append(rank)
        if not members:
            raise TopologyError(
                f"group {g} is empty. Fix: remove it or give it ranks.", f"groups[{g}]", rule="nonempty"
            )
        out.append(members)
    if not out:
        raise TopologyError('no groups given. Fix: give at least one group, e.g. "0,1;2,3".', "groups", rule="nonempty")
    if num_ranks is None:  # n distinct ranks listed: a partition of 0..n-1 iff none is n or above
        beyond = [(rank, g) for g, members in enumerate(out) for rank in members if rank >= len(where)]
        if beyond:
            raise _out_of_range(*beyond[0], None, listed=len(where))
        return out
    missing = [r for r in range(num_ranks) if r not in where]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise TopologyError(
            f"rank{'s' if len(missing) > 1 else ''} {shown} {'are' if len(missing) > 1 else 'is'} in no group. "
            "Fix: every rank of the job must be in exactly one group.",
            "groups",
            rule="complete",
            missing_ranks=missing,
        )
    return out


def _out_of_range(rank: int, group: int, num_ranks: int | None, listed: int | None = None) -> TopologyError:
    if num_ranks is not None:
        why, fix = f"the job has ranks 0..{num_ranks - 1}", "remove it or launch more ranks"
    elif listed is not None:
        why, fix = (
            f"the groups list {listed} ranks, so they must be 0..{listed - 1}",
            "number the ranks from 0 without gaps",
        )
    else:
        why, fix = "ranks are numbered from 0", "remove it"
    expected = (
        f"0..{num_ranks - 1}" if num_ranks is not None else (f"0..{listed - 1}" if listed is not None else ">= 0")
    )
    return TopologyError(
        f"rank {rank} in group {group} is out of range: {why}. Fix: {fix}.",
        f"groups[{group}]",
        value=rank,
        rule="range",
        expected=expected,
    )


def load_partition(text_or_path: str | os.PathLike, num_ranks: int | None = None) -> list[list[int]]:
    """Read a partition: the ``--groups`` syntax ``"0,2;1,3"`` (groups split by ``;``, ranks by
    ``,``), or a file holding JSON ``[[0, 2], [1, 3]]`` or that same text syntax. With
    ``num_ranks`` the result is also checked by :func:`validate_partition`.

    >>> load_partition("0, 1; 2, 3")
    [[0, 1], [2, 3]]
    """
    if isinstance(text_or_path, os.PathLike) or (isinstance(text_or_path, str) and _looks_like_path(text_or_path)):
        path = Path(text_or_path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise TopologyError(
                f"groups file {os.fspath(path)} is not a valid real path or cannot be read "
                f'({err.__class__.__name__}). Fix: pass an existing file, or inline groups like "0,1;2,3".',
                "groups",
                value=os.fspath(path),
                path=os.fspath(path),
                rule="file",
            ) from None
    elif isinstance(text_or_path, str):
        text = text_or_path
    else:
        raise TopologyError(
            f'groups must be text like "0,2;1,3" or a path, got {type(text_or_path).__name__}.',
            "groups",
            rule="type",
            expected="text or path",
        )
    groups = _parse_groups(text)
    return validate_partition(groups, num_ranks) if num_ranks is not None else groups


def _parse_groups(text: str) -> list[list[int]]:
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            doc = json.loads(stripped)
        except (ValueError, RecursionError) as err:
            raise TopologyError(
                f"groups JSON is invalid: {err}. Fix: write [[0, 2], [1, 3]].", "groups", rule="json"
            ) from None
        if not isinstance(doc, list) or not all(isinstance(g, list) for g in doc):
            raise TopologyError(
                "groups JSON must be a list of rank lists, e.g. [[0, 2], [1, 3]].",
                "groups",
                rule="type",
                expected="list",
            )
        return [[_as_rank(r, f"groups[{g}]") for r in group] for g, group in enumerate(doc)]
    if not stripped:
        raise TopologyError('groups text is empty. Fix: write e.g. "0,2;1,3".', "groups", rule="nonempty")
    groups = []
    for g, part in enumerate(stripped.split(";")):
        items = [item.strip() for item in part.split(",")]
        if items == [""]:
            raise TopologyError(
                f"group {g} is empty in {text!r}. Fix: remove the extra ';'.", f"groups[{g}]", rule="nonempty"
            )
        ranks = []
        for item in items:
            if not item.isascii() or not item.isdigit() or len(item) > 9:
                raise TopologyError(
                    f"{item!r} in group {g} of {text!r} is not a rank number. "
                    "Fix: write ranks as numbers, groups split by ';', ranks by ',' (e.g. \"0,2;1,3\").",
                    f"groups[{g}]",
                    value=item,
                    rule="type",
                    expected="int",
                )
            ranks.append(int(item))
        groups.append(ranks)
    return groups


def _looks_like_path(text: str) -> bool:
    return os.path.exists(text) or text.endswith(".json") or os.sep in text


def _as_rank(item: Any, fieldname: str) -> int:
    if isinstance(item, bool):
        raise TopologyError(
            f"{item!r} in {fieldname} is not a rank number.", fieldname, value=item, rule="type", expected="int"
        )
    try:
        return operator.index(item)  # ints and numpy integers; not floats or strings
    except TypeError:
        raise TopologyError(
            f"{item!r} in {fieldname} is not a rank number. Fix: use integers.",
            fieldname,
            value=item,
            rule="type",
            expected="int",
        ) from None


def _ranks(topo: _TopologyLike, ranks: Iterable[int] | None) -> list[int]:
    if ranks is None:
        return list(range(topo.num_ranks))
    chosen = []
    seen = set()
    for item in ranks:
        rank = _as_rank(item, "ranks")
        if not 0 <= rank < topo.num_ranks or rank in seen:
            raise TopologyError(
                f"rank {rank} is out of 0..{topo.num_ranks - 1} or listed twice.",
                "ranks",
                value=rank,
                **({"rule": "unique"} if rank in seen else {"rule": "range", "expected": f"0..{topo.num_ranks - 1}"}),
            )
        seen.add(rank)
        chosen.append(rank)
    if not chosen:
        raise TopologyError("no ranks to partition.", "ranks", rule="nonempty")
    return chosen
