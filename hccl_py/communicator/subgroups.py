"""Sub-communicators: the methods of :class:`~hccl_py.communicator.Communicator` that make
communicators from one (``split``, ``create_group``, ``create_groups``, ``create_sub_comm``) and
set the groups its hierarchical collectives run on (``partition``, ``set_partition``). A mixin
of the communicator: each calls its collectives (an all_gather to agree) and its checks.

Example::

    sub = comm.split(color=comm.rank % 2, key=comm.rank)
"""

from __future__ import annotations

import hashlib
from typing import Self, Sequence

import numpy as np

from topology import TopologyError, auto_partition, load_partition, validate_partition

from ..engine.issuing import entry
from ..errors import HcclParamError
from .alltoallv_args import whole


def comm_id(*parts: object) -> int:
    """The id of a communicator made from ``parts`` (the parent's id, the call, the members)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # 63 bits: fits the header, never 0 by accident


class SubGroups:
    """The sub-communicator half of the communicator (see the module doc)."""

    @entry("collective")
    def split(self, color: int | None, key: int = 0) -> "Self | None":
        """Partition by ``color`` (``MPI_Comm_split``); ranks ordered by ``key`` then rank.

        Every rank calls it; a rank with ``color=None`` takes part but gets ``None``::

            sub = comm.split(color=comm.rank % 2, key=comm.rank)
        """
        what = f"split on '{self.name}'"
        self.issuer.check_usable(what)
        for name, value in (("color", color), ("key", key)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                raise self._bad(
                    what,
                    f"{name} must be an int{' or None' if name == 'color' else ''}, got {value!r}",
                    arg=name,
                    value=value,
                    rule="type",
                    expected="int or None" if name == "color" else "int",
                )
        if color is not None and not 0 <= color < 2**63:
            raise self._bad(
                what,
                f"color must be in 0 .. 2**63-1 or None, got {color}",
                arg="color",
                value=int(color),
                rule="range",
                expected="0 .. 2**63-1",
            )
        if not -(2**63) <= key < 2**63:
            raise self._bad(
                what,
                f"key must fit in 64 bits (-2**63 .. 2**63-1), got {key}",
                arg="key",
                value=int(key),
                rule="range",
                expected="-2**63 .. 2**63-1",
            )
        mine = np.array([-1 if color is None else color, key], np.int64)
        table = self.all_gather(mine)
        seq = self.issuer.counter.seq
        if color is None:
            return None
        members = sorted((int(k), r) for r, (c, k) in enumerate(table) if c == color)
        ranks = [r for _, r in members]
        return self._child(ranks, comm_id(self._id, seq, "split", int(color)), f"{self.name}/split({color})")

    @entry("collective")
    def create_group(self, ranks: Sequence[int]) -> "Self | None":
        """A communicator of ``ranks`` (ranks of this communicator, in that order).

        Like ``HcclCreateSubCommConfig``: every rank of this communicator calls it with the
        same list; ranks outside the list get ``None``::

            grp = comm.create_group([0, 2])
        """
        what = f"create_group on '{self.name}'"
        self.issuer.check_usable(what)
        ranks = self._rank_list(ranks, what)
        seq = self._agree(what, ranks, "rank list", "ranks")
        if self._rank not in ranks:
            return None
        return self._child(ranks, comm_id(self._id, seq, "group", tuple(ranks)), f"{self.name}/group{ranks}")

    @entry("collective")
    def create_groups(self, groups: "str | Sequence[Sequence[int]]" = "auto") -> "Self":
        """Partition this communicator into groups in one call; returns this rank's group.

        ``groups`` is ``"auto"`` (HCCL's rule on the topology: by server, then by HCCS island,
        otherwise consecutive ranks), a list of rank lists, or the text form ``"0,2;1,3"``.
        Every rank must pass the same partition; each rank must appear exactly once::

            pair = comm.create_groups([[0, 2], [1, 3]])
        """
        what = f"create_groups on '{self.name}'"
        self.issuer.check_usable(what)
        partition = self._partition_of(groups, what)
        seq = self._agree(what, partition, "partition", "groups")
        index = next(i for i, group in enumerate(partition) if self._rank in group)
        mine = list(partition[index])
        return self._child(mine, comm_id(self._id, seq, "groups", index, tuple(mine)), f"{self.name}/groups[{index}]")

    def _partition_of(self, groups: "str | Sequence[Sequence[int]]", what: str) -> list[list[int]]:
        """``groups`` ("auto", rank lists or "0,2;1,3"; a file path too) as a checked partition."""
        try:
            if isinstance(groups, str) and groups.strip().lower() == "auto":
                by_world = auto_partition(self._rc.topology, list(self._world_ranks))
                return [[self._world_ranks.index(w) for w in group] for group in by_world]
            partition = load_partition(groups, self.size) if isinstance(groups, str) else groups
            return validate_partition(partition, self.size)
        except TopologyError as err:
            raise HcclParamError(
                f"{what}: {err}",
                **self.issuer.fields(what),
                arg="groups",
                **{k: v for k, v in err.fields.items() if v is not None},
            ) from None

    @property
    def partition(self) -> tuple[tuple[int, ...], ...]:
        """The groups ``algo="hier"`` runs on (ranks of this communicator): the last
        :meth:`set_partition`, by default HCCL's automatic grouping of this communicator."""
        if self._partition is None:
            self._partition = tuple(tuple(g) for g in self._partition_of("auto", f"partition of '{self.name}'"))
        return self._partition

    @entry("collective")
    def set_partition(self, groups: "str | Sequence[Sequence[int]]" = "auto") -> None:
        """Set the groups of this communicator's hierarchical collectives (``algo="hier"``):
        ``"auto"``, a list of rank lists, ``"0,2;1,3"`` or a file. Every rank calls it with the
        same partition (checked with one small all_gather)::

            comm.set_partition("1,2;0,3")
            comm.all_reduce(x, algo="hier")     # reduce-scatter in {1,2} and {0,3}, allreduce across, allgather
        """
        what = f"set_partition on '{self.name}'"
        self.issuer.check_usable(what)
        partition = self._partition_of(groups, what)
        self._agree(what, partition, "partition", "groups")
        self._partition = tuple(tuple(g) for g in partition)
        self._calls = {key: call for key, call in self._calls.items() if not call.algo.startswith("hier")}

    def _agree(self, what: str, value, name: str, arg: str) -> int:
        """Check that every rank passed the same ``value`` (argument ``arg``, one small allgather);
        returns the call's sequence number, which names the communicators made from it."""
        digest = np.frombuffer(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), np.int64)
        digests = self.all_gather(digest.copy()).reshape(-1)
        differ = [r for r in range(self.size) if digests[r] != digests[0]]
        if differ:
            raise self._bad(
                what,
                f"ranks {differ} passed a different {name} than rank 0; every rank must pass the same {name}",
                arg=arg,
                rule="agree",
                ranks=differ,
            )
        return self.issuer.counter.seq

    def create_sub_comm(
        self,
        ranks: Sequence[int],
        sub_comm_id: object,
        *,
        name: str | None = None,
        timeout_s: "float | None | str" = "job",
    ) -> "Self":
        """A communicator of ``ranks`` (ranks of this one, in that order) made by those ranks alone,
        with no call over this communicator (``HcclCreateSubCommConfig``: only the members call it,
        each with the same ``sub_comm_id``, any value with a stable ``repr``). For a caller that
        cannot gather every rank of this communicator (torch makes a new group on its members
        only). ``timeout_s``: its HCCL_EXEC_TIMEOUT (default this job's; None: no limit)::

            pair = comm.create_sub_comm([0, 2], "pair-a") if comm.rank in (0, 2) else None
        """
        what = f"create_sub_comm on '{self.name}'"
        self.issuer.check_usable(what)
        ranks = self._rank_list(ranks, what)
        if self._rank not in ranks:
            raise self._bad(
                what,
                f"ranks {ranks} must list this rank ({self._rank}): only the members make it",
                arg="ranks",
                value=ranks,
                rule="members",
            )
        made = comm_id(self._id, "sub", sub_comm_id)
        return self._child(ranks, made, name or f"{self.name}/sub{ranks}", timeout_s)

    def _rank_list(self, ranks, what: str) -> list[int]:
        """``ranks``, a group's members, checked: whole numbers, ranks of this communicator, at
        least one, each once."""
        try:
            ranks = [whole(r) for r in ranks]
        except (TypeError, ValueError):
            raise self._bad(
                what,
                f"ranks must be a sequence of ints, got {ranks!r}",
                arg="ranks",
                value=ranks,
                rule="type",
                expected="sequence of int",
            ) from None
        if not ranks:
            raise self._bad(
                what, "ranks is empty; a group needs at least one rank", arg="ranks", value=ranks, rule="nonempty"
            )
        for r in ranks:
            self._root(r, what, "rank")
        if len(set(ranks)) != len(ranks):
            raise self._bad(what, f"ranks {ranks} lists a rank twice", arg="ranks", value=ranks, rule="unique")
        return ranks

    def _child(self, ranks: list[int], comm_id: int, name: str, timeout_s: "float | None | str" = "job") -> "Self":
        return type(self)(
            self._rc, [self._world_ranks[r] for r in ranks], ranks.index(self._rank), comm_id, name, timeout_s=timeout_s
        )
