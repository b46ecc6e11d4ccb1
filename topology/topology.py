"""The cluster as a graph of cards, CPU/PCIe roots, NICs and switches, with routes between ranks.

Node ids: ``card{rank}``, ``s{server}.pcie{k}`` (CPU socket / PCIe root k; with ACS the PCIe
switch under it, whose uplink goes to ``s{server}.rc{k}``, the CPU root complex), ``s{server}.nic{d}``
(RoCE port of device d, or ``nic0``: the host NIC), ``s{server}.fabric`` (the server's uplink,
where its NPUs' ports share the ports' worth of bandwidth its network gives, ``figures.SERVER_UPLINK``), ``leaf{j}``, ``spine``. Every edge carries
``spec``: a :class:`~topology.figures.LinkSpec` (bandwidth per direction, so a route's hops are
directed ``(u, v)`` pairs and A->B never competes with B->A).

Routes follow the wiring, the way HCCL picks links, not a search: a direct card-to-card link
(HCCS island or bridge) if there is one; else through the PCIe root(s) of the server; across
servers card -> NIC -> leaf [-> spine -> leaf] -> NIC -> card. Under a PCIe switch with ACS
(``mixed-4p``) a card-to-card PCIe route is card -> switch -> root complex -> switch -> card: ACS
redirects peer requests upstream, so such routes are not shortest paths. Traffic between two cards of one
server never leaves the server: HCCL uses PCIe there unless HCCL_INTRA_ROCE_ENABLE=1, even where
the RoCE loop would be faster (two 910 islands of a multi-server job). With the default figures
the routes are exactly the latency-shortest paths under that rule (tested); they are computed in
O(hops) and cached, so the cluster-scale simulator can ask for the routes of 4096 ranks.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from .errors import TopologyError
from .figures import SERVER_UPLINK, CardModel, FiguresArg, LinkSpec, resolve_figures
from .presets import SERVERS_PER_LEAF, TEMPLATES, ServerTemplate, card_count_check, parse_preset
from .rank_table import RankTable

Hop = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Route:
    """A path between two cards: directed ``hops`` in order, total ``latency_s`` (sum of the
    hops' latencies: the fixed cost of one point-to-point transfer), ``bandwidth_Bps`` (the
    smallest hop bandwidth) and ``step_latency_s``, the fixed cost of one transfer inside a
    collective step (each hop's latency plus its ``LinkSpec.step_sync_s``, summed hop by hop;
    equal to ``latency_s`` where no link adds a step's synchronisation). The route from a card to
    itself has no hops, latencies 0 and infinite bandwidth.

    >>> Topology.preset("ascend910-8p").route(0, 1)                 # doctest: +SKIP
    Route(hops=(('card0', 'card1'),), latency_s=2.6e-06, bandwidth_Bps=10737418240.0, step_latency_s=2.6e-06)
    """

    hops: tuple[Hop, ...]
    latency_s: float
    bandwidth_Bps: float
    step_latency_s: float


class Topology:
    """A modeled Ascend cluster: which card each rank is, and how the cards are linked.

    >>> topo = Topology.preset("ascend910-8p")
    >>> topo.island_of(5), [topo.link(*h).kind for h in topo.route(0, 5).hops]
    (1, ['PCIE', 'HOST', 'PCIE'])
    """

    def __init__(
        self,
        name: str,
        template: ServerTemplate,
        servers: list[list[tuple[int, int]]],
        figures: FiguresArg = None,
        rank_table: RankTable | None = None,
    ):
        """Build the graph. ``servers[s]`` lists ``(rank, device_id)`` of server ``s``; ranks must
        be 0..N-1 overall and device ids below ``template.num_cards``. Use :meth:`preset` or
        :meth:`from_rank_table` rather than calling this directly."""
        links, cards = resolve_figures(figures)
        self.name = name
        self.template = template
        self.link_kinds = links
        self.card_models = cards
        self._card = cards[template.card]
        self._rank_table = rank_table
        num_ranks = sum(len(members) for members in servers)
        self.num_ranks = num_ranks
        self.num_servers = len(servers)
        self._server = [0] * num_ranks
        self._device = [0] * num_ranks
        self._island: list[int | None] = [None] * num_ranks
        self._root: list[str] = [""] * num_ranks
        self._server_ranks: list[list[int]] = []
        self._up: list[tuple[Hop, ...]] = [()] * num_ranks  # card -> its leaf, when multi-server
        self._routes: dict[tuple[int, int], Route] = {}
        self._arrays: _RouteArrays | None = None  # routes as numpy arrays, built on first use
        self._spec: dict[str, dict[str, LinkSpec]] = {}
        self._graph = None  # networkx's view, built on first use (importing networkx costs ~0.2 s)
        self._graph_parts: tuple[list, list] = ([], [])
        self.num_islands = 0
        self._build(template, servers, links)

    # ------------------------------------------------------------------ construction
    @classmethod
    def preset(cls, name: str, n: int | None = None, figures: FiguresArg = None) -> "Topology":
        """A named preset (see ``PRESETS``; any ``NxMp-roce[-910|-910b]``), optionally only its first
        ``n`` cards (ranks 0..n-1, filling servers in order).

        >>> Topology.preset("ascend910-8p", n=4).num_islands
        1
        """
        spec = parse_preset(name)
        total = spec.num_ranks
        if n is None:
            n = total
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise TopologyError(
                f"number of cards must be a positive integer, got {n!r}.", "n", value=n, **card_count_check(n)
            )
        if n > total:
            raise TopologyError(
                f"preset {spec.name} has {total} cards; {n} were asked for. "
                f"Fix: choose a larger preset (e.g. {math.ceil(n / 8)}x8p-roce) or fewer cards.",
                "n",
                value=n,
                rule="range",
                expected=f"1..{total}",
            )
        m = spec.cards_per_server
        servers = [[(r, r - s * m) for r in range(s * m, min(n, (s + 1) * m))] for s in range(math.ceil(n / m))]
        return cls(spec.name, spec.template, servers, figures)

    @classmethod
    def from_rank_table(cls, table: RankTable, preset: str | None = None, figures: FiguresArg = None) -> "Topology":
        """The cluster a rank table describes. The table gives servers, devices and rank ids; the
        preset gives each server's internal wiring and card model (its server and card counts are
        ignored). Default: ``ascend910-8p`` wiring for a one-server table (as ``default_preset``
        for up to 8 cards), ``ascend910b-8p`` for more servers.

        >>> Topology.from_rank_table(RankTable.load("hccl_8p.json"), preset="ascend910b-8p")  # doctest: +SKIP
        """
        if not isinstance(table, RankTable):
            raise TopologyError(
                f"expected a RankTable, got {type(table).__name__}. Fix: RankTable.load(path).",
                "rank_table",
                rule="type",
                expected="RankTable",
            )
        if preset is None:
            template = TEMPLATES["ascend910-8p" if table.server_count == 1 else "ascend910b-8p"]
        else:
            template = parse_preset(preset).template
        servers = []
        for i, server in enumerate(table.servers):
            for j, dev in enumerate(server.devices):
                if dev.device_id >= template.num_cards:
                    raise TopologyError(
                        f"server_list[{i}].device[{j}].device_id is {dev.device_id} but a {template.name} server has "
                        f"device ids 0..{template.num_cards - 1}. Fix: pick a preset whose server wiring has that device, "
                        "or correct the device_id.",
                        f"server_list[{i}].device[{j}].device_id",
                        value=dev.device_id,
                        rule="range",
                        expected=f"0..{template.num_cards - 1}",
                    )
            servers.append(sorted((dev.rank_id, dev.device_id) for dev in server.devices))
        count = f"{table.server_count} x " if table.server_count > 1 else ""
        return cls(f"rank table ({count}{template.name})", template, servers, figures, rank_table=table)

    def _add_edge(self, u: str, v: str, spec: LinkSpec, edges: list) -> None:
        edges.append((u, v, {"spec": spec}))
        self._spec.setdefault(u, {})[v] = spec
        self._spec.setdefault(v, {})[u] = spec

    def _build(self, t: ServerTemplate, servers: list[list[tuple[int, int]]], links: dict[str, LinkSpec]) -> None:
        nodes: list[tuple[str, dict]] = []
        edges: list[tuple[str, str, dict]] = []
        multi = len(servers) > 1
        nic_spec = links[t.nic_kind]
        leaf_ports: Counter = Counter()
        seen_ranks: set[int] = set()
        attrs: dict[int, dict] = {}
        for s, members in enumerate(servers):
            by_device = {}
            for rank, device in members:
                if not 0 <= rank < self.num_ranks or rank in seen_ranks:
                    raise TopologyError(
                        f"rank {rank} is out of 0..{self.num_ranks - 1} or listed twice.",
                        "rank",
                        value=rank,
                        **(
                            {"rule": "unique"}
                            if rank in seen_ranks
                            else {"rule": "range", "expected": f"0..{self.num_ranks - 1}"}
                        ),
                    )
                if not 0 <= device < t.num_cards or device in by_device:
                    raise TopologyError(
                        f"server {s}: device {device} is out of 0..{t.num_cards - 1} or listed twice.",
                        "device",
                        value=device,
                        **(
                            {"rule": "unique"}
                            if device in by_device
                            else {"rule": "range", "expected": f"0..{t.num_cards - 1}"}
                        ),
                    )
                seen_ranks.add(rank)
                by_device[device] = rank
                self._server[rank], self._device[rank] = s, device
                attrs[rank] = {
                    "type": "card",
                    "rank": rank,
                    "server": s,
                    "device": device,
                    "card": t.card,
                    "island": None,
                }
                nodes.append((f"card{rank}", attrs[rank]))
            self._server_ranks.append(sorted(by_device.values()))
            roots = []
            for k, group in enumerate(t.roots):
                present = [d for d in group if d in by_device]
                if not present:
                    continue
                root = f"s{s}.pcie{k}"
                roots.append(root)
                nodes.append((root, {"type": "pcie", "server": s}))
                for d in present:
                    self._root[by_device[d]] = root
                    self._add_edge(f"card{by_device[d]}", root, links["PCIE"], edges)
                if t.acs:  # the switch's x16 uplink to the CPU root complex
                    nodes.append((f"s{s}.rc{k}", {"type": "rc", "server": s}))
                    self._add_edge(root, f"s{s}.rc{k}", links["PCIE"], edges)
            for a in range(len(roots)):
                for b in range(a + 1, len(roots)):
                    self._add_edge(roots[a], roots[b], links["HOST"], edges)
            for group in t.islands:
                present = [by_device[d] for d in group if d in by_device]
                if not present:
                    continue
                island = self.num_islands
                self.num_islands += 1
                for x, ra in enumerate(present):
                    self._island[ra] = attrs[ra]["island"] = island
                    for rb in present[x + 1 :]:
                        self._add_edge(f"card{ra}", f"card{rb}", links[t.island_kind], edges)
            for da, db, kind in t.bridges:
                if da in by_device and db in by_device:
                    self._add_edge(f"card{by_device[da]}", f"card{by_device[db]}", links[kind], edges)
            if multi:
                leaf = f"leaf{s // SERVERS_PER_LEAF}"
                if t.nic == "card":
                    # the server's uplink (topology/figures.py SERVER_UPLINK): its ports reach the
                    # leaf through one edge of the ports' worth of bandwidth its network gives
                    uplink = SERVER_UPLINK.get(t.nic_kind)
                    fabric = None
                    if uplink in links:
                        fabric = f"s{s}.fabric"
                        nodes.append((fabric, {"type": "fabric", "server": s}))
                        self._add_edge(fabric, leaf, links[uplink], edges)
                    for d, rank in by_device.items():
                        nic = f"s{s}.nic{d}"
                        nodes.append((nic, {"type": "nic", "server": s}))
                        self._add_edge(f"card{rank}", nic, nic_spec, edges)
                        leaf_ports[leaf] += 1
                        if fabric is None:
                            self._add_edge(nic, leaf, nic_spec, edges)
                            self._up[rank] = ((f"card{rank}", nic), (nic, leaf))
                        else:
                            self._add_edge(nic, fabric, nic_spec, edges)
                            self._up[rank] = ((f"card{rank}", nic), (nic, fabric), (fabric, leaf))
                else:
                    nic = f"s{s}.nic0"
                    nodes.append((nic, {"type": "nic", "server": s}))
                    self._add_edge(roots[0], nic, links["HOST"], edges)
                    self._add_edge(nic, leaf, nic_spec, edges)
                    leaf_ports[leaf] += 1
                    for rank in by_device.values():
                        path = [(f"card{rank}", self._root[rank])]
                        if self._root[rank] != roots[0]:
                            path.append((self._root[rank], roots[0]))
                        self._up[rank] = (*path, (roots[0], nic), (nic, leaf))
        if multi:
            for leaf in leaf_ports:
                nodes.append((leaf, {"type": "leaf"}))
            if len(leaf_ports) > 1:
                nodes.append(("spine", {"type": "spine"}))
                for leaf, ports in leaf_ports.items():
                    trunk = dataclasses.replace(nic_spec, bandwidth_Bps=nic_spec.bandwidth_Bps * ports)
                    self._add_edge(leaf, "spine", trunk, edges)
        if len(seen_ranks) != self.num_ranks:
            raise TopologyError(
                f"ranks must be 0..{self.num_ranks - 1}, each once.",
                "rank",
                rule="complete",
                missing_ranks=sorted(set(range(self.num_ranks)) - seen_ranks),
            )
        self._graph_parts = (nodes, edges)

    @property
    def graph(self):
        """The cluster as a ``networkx.Graph``: nodes (cards, PCIe/CPU roots, NICs, switches, with
        a ``type``) and links (``spec``: the LinkSpec). Routes never need it; drawing and the
        partition heuristics do."""
        if self._graph is None:
            import networkx as nx

            graph = nx.Graph(name=self.name)
            graph.add_nodes_from(self._graph_parts[0])
            graph.add_edges_from(self._graph_parts[1])
            self._graph = graph
        return self._graph

    # ------------------------------------------------------------------ per-rank facts
    def _check(self, rank: int) -> int:
        """``rank`` as an ``int`` (numpy integers accepted), or TopologyError if it is not a rank here."""
        try:
            value = operator.index(rank)
        except TypeError:
            value = -1
        if isinstance(rank, bool) or not 0 <= value < self.num_ranks:
            raise TopologyError(
                f"rank {rank!r} is not in 0..{self.num_ranks - 1} of topology {self.name}.",
                "rank",
                value=rank,
                rule="range",
                expected=f"0..{self.num_ranks - 1}",
            )
        return value

    def card(self, rank: int) -> CardModel:
        """The card model of ``rank``."""
        self._check(rank)
        return self._card

    def server_of(self, rank: int) -> int:
        """Index of the server holding ``rank``."""
        return self._server[self._check(rank)]

    def device_of(self, rank: int) -> int:
        """Device id (NPU physical id) of ``rank`` within its server."""
        return self._device[self._check(rank)]

    def island_of(self, rank: int) -> int | None:
        """HCCS island id of ``rank`` (unique across the cluster), or ``None`` outside any island."""
        return self._island[self._check(rank)]

    def card_node(self, rank: int) -> str:
        """The graph node id of ``rank``'s card."""
        return f"card{self._check(rank)}"

    def server_ranks(self, server: int) -> list[int]:
        """The ranks on ``server``, ascending."""
        if isinstance(server, bool) or not isinstance(server, int) or not 0 <= server < self.num_servers:
            raise TopologyError(
                f"server {server!r} is not in 0..{self.num_servers - 1}.",
                "server",
                value=server,
                rule="range",
                expected=f"0..{self.num_servers - 1}",
            )
        return list(self._server_ranks[server])

    # ------------------------------------------------------------------ links and routes
    def link(self, u: str, v: str) -> LinkSpec:
        """The spec of the link between nodes ``u`` and ``v`` (either direction)."""
        try:
            return self._spec[u][v]
        except KeyError:
            raise TopologyError(
                f"no link between {u!r} and {v!r} in topology {self.name}.", "link", value=[u, v], rule="reference"
            ) from None

    def route(self, src_rank: int, dst_rank: int) -> Route:
        """The route from ``src_rank``'s card to ``dst_rank``'s (cached).

        >>> [h for h in Topology.preset("2x8p-roce").route(0, 8).hops]          # doctest: +SKIP
        [('card0', 's0.nic0'), ('s0.nic0', 'leaf0'), ('leaf0', 's1.nic0'), ('s1.nic0', 'card8')]
        """
        key = (src_rank, dst_rank)
        found = self._routes.get(key)
        if found is None:
            a, b = self._check(src_rank), self._check(dst_rank)
            found = self._routes[(a, b)] = self._make_route(a, b)
        return found

    def host_route(self, rank: int) -> Route:
        """The route from ``rank``'s card to its host's memory, which a copy between host memory
        and the card's HBM crosses (aclrtMemcpy host-to-device or device-to-host; the same links
        the other way): the card's PCIe link to its root and, under a PCIe switch with ACS, the
        switch's uplink to the CPU root complex.

        >>> [h for h in Topology.preset("ascend910b-8p").host_route(3).hops]    # doctest: +SKIP
        [('card3', 's0.pcie0')]
        """
        card, root = self.card_node(rank), self._root[self._check(rank)]
        hops = [(card, root)]
        if self.template.acs:
            hops.append((root, root.replace(".pcie", ".rc")))
        specs = [self.link(u, v) for u, v in hops]
        return Route(
            tuple(hops),
            sum(s.latency_s for s in specs),
            min(s.bandwidth_Bps for s in specs),
            sum(s.step_latency_s for s in specs),
        )

    def _make_route(self, a: int, b: int) -> Route:
        if a == b:
            return Route((), 0.0, math.inf, 0.0)
        ca, cb = f"card{a}", f"card{b}"
        if self._server[a] == self._server[b]:
            if cb in self._spec[ca]:
                hops: tuple[Hop, ...] = ((ca, cb),)
            elif self._root[a] == self._root[b] and self.template.acs:  # ACS: up to the root complex and back
                switch = self._root[a]
                rc = switch.replace(".pcie", ".rc")
                hops = ((ca, switch), (switch, rc), (rc, switch), (switch, cb))
            elif self._root[a] == self._root[b]:
                hops = ((ca, self._root[a]), (self._root[a], cb))
            else:
                hops = ((ca, self._root[a]), (self._root[a], self._root[b]), (self._root[b], cb))
        else:
            up, down = self._up[a], self._up[b]
            leaf_a, leaf_b = up[-1][1], down[-1][1]
            middle = () if leaf_a == leaf_b else ((leaf_a, "spine"), ("spine", leaf_b))
            hops = up + middle + tuple((v, u) for u, v in reversed(down))
        latency = step_latency = 0.0
        bandwidth = math.inf
        for u, v in hops:
            spec = self._spec[u][v]
            latency += spec.latency_s
            step_latency += spec.step_latency_s
            if spec.bandwidth_Bps < bandwidth:
                bandwidth = spec.bandwidth_Bps
        return Route(hops, latency, bandwidth, step_latency)

    def route_ids(self, src, dst) -> tuple:
        """The routes ``src[f] -> dst[f]`` (integer arrays) as arrays: ``(hops, latency)``, where
        ``hops[k, f]`` is the id of route f's k-th directed link (0 pads routes of fewer links) and
        ``latency[f]`` its ``step_latency_s`` (the simulator's flows are collective steps). Ids
        index :meth:`hop_bandwidths`. The same hops in the same order as :meth:`route`, and the
        same latency to the last bit (summed hop by hop);
        routes between servers are built with numpy, so the cluster-scale simulator can route
        65,536 flows a step.

        >>> hops, latency = Topology.preset("2x8p-roce").route_ids([0, 1], [8, 2])   # doctest: +SKIP
        """
        import numpy as np

        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        for ranks in (src, dst):  # -1 marks "no flow" in the simulator's arrays: never a rank here
            if ranks.size and (ranks.min() < 0 or ranks.max() >= self.num_ranks):
                bad = int(ranks.min()) if ranks.min() < 0 else int(ranks.max())
                raise TopologyError(
                    f"rank {bad} is not in 0..{self.num_ranks - 1}.",
                    "rank",
                    value=bad,
                    rule="range",
                    expected=f"0..{self.num_ranks - 1}",
                )
        return self._route_arrays().route_ids(src, dst)

    def hop_bandwidths(self):
        """Bandwidth (bytes/s, per direction) of every link :meth:`route_ids` has numbered, by id;
        id 0, the padding, is infinite."""
        return self._route_arrays().bandwidths()

    def _route_arrays(self) -> "_RouteArrays":
        if self._arrays is None:
            self._arrays = _RouteArrays(self)
        return self._arrays

    # ------------------------------------------------------------------ rank tables and text
    def to_rank_table(self, version: str = "1.0") -> RankTable:
        """A rank table for this topology: the table it was built from (if any, same version),
        else one generated with made-up addresses (:meth:`RankTable.generate`)."""
        if self._rank_table is not None and self._rank_table.version == version:
            return self._rank_table
        return RankTable.generate(self, version)

    def summary(self) -> str:
        """One line: name, ranks, servers, card model, islands.

        >>> Topology.preset("ascend910-8p").summary()
        'ascend910-8p: 8 ranks on 1 server, ascend910 cards, 2 HCCS islands'
        """
        servers = "server" if self.num_servers == 1 else "servers"
        islands = "island" if self.num_islands == 1 else "islands"
        return (
            f"{self.name}: {self.num_ranks} ranks on {self.num_servers} {servers}, {self._card.name} cards, "
            f"{self.num_islands} HCCS {islands}"
        )

    def describe(self, max_links: int = 200) -> str:
        """The table ``hccl-topo show`` prints: every rank (server, device, card, island), the link
        kinds with their figures, and each link when there are at most ``max_links``."""
        lines = [self.summary(), ""]
        rows = [("rank", "server", "device", "card", "island")]
        rows += [
            (
                str(r),
                str(self._server[r]),
                str(self._device[r]),
                self._card.name,
                "-" if self._island[r] is None else str(self._island[r]),
            )
            for r in range(self.num_ranks)
        ]
        lines += _table(rows, right=(0, 1, 2, 4))
        kinds: dict[tuple[str, float, float, float], int] = Counter(
            (spec.kind, spec.bandwidth_Bps, spec.latency_s, spec.step_sync_s)
            for _, _, spec in self.graph.edges(data="spec")
        )
        lines += ["", "link kinds (bandwidth per direction; a collective step adds its step sync per hop):"]
        rows = [("kind", "links", "GB/s", "latency us", "step sync us")]
        rows += [
            (kind, str(count), f"{bw / 1e9:.1f}", f"{lat * 1e6:.2f}", f"{sync * 1e6:.2f}")
            for (kind, bw, lat, sync), count in sorted(kinds.items())
        ]
        lines += _table(rows, right=(1, 2, 3, 4))
        count = self.graph.number_of_edges()
        if count <= max_links:
            lines += ["", "links:"]
            rows = [("from", "to", "kind", "GB/s", "latency us")]
            rows += [
                (u, v, spec.kind, f"{spec.bandwidth_Bps / 1e9:.1f}", f"{spec.latency_s * 1e6:.2f}")
                for u, v, spec in self.graph.edges(data="spec")
            ]
            lines += _table(rows, right=(3, 4))
        else:
            lines += ["", f"({count} links; only the summary above is shown)"]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Topology {self.summary()}>"


def _table(rows: Iterable[tuple[str, ...]], right: tuple[int, ...] = ()) -> list[str]:
    rows = list(rows)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
    return out


class _RouteArrays:
    """Routes as arrays (``Topology.route_ids``), built once per topology.

    Directed links get ids: between servers, per rank the ids of its way up to its leaf
    (``up[k]``: hop k of every rank's, 0-padded) and down from it (``down``: the reverse links in
    route order), per leaf its trunk to and from the spine; inside servers wired alike (every
    server the same devices, NICs on the cards, so no way up crosses a server's own links), one
    table of server 0's routes by device pair whose links stand for server s's at an offset of
    s links-per-server; elsewhere the links are numbered as ``route`` first takes them."""

    def __init__(self, topology: Topology):
        import numpy as np

        self._spec, self._route = topology._spec, topology.route
        self._ids: dict[Hop, int] = {}
        self._bandwidth: list[float] = [math.inf]  # id 0: padding
        self._latency: list[float] = [0.0]  # per link id: its ``LinkSpec.step_latency_s``
        self._cache: tuple = (0, None, None)
        self.table = None  # server 0's routes by device pair, where servers are wired alike
        self.server = np.array(topology._server, dtype=np.int64)
        self.device = np.array(topology._device, dtype=np.int64)
        ups = topology._up
        up_width = max((len(u) for u in ups), default=0)
        self.up = np.zeros((up_width, len(ups)), dtype=np.int64)
        self.down = np.zeros((up_width, len(ups)), dtype=np.int64)
        up_latency = [0.0] * len(ups)
        leaves: dict[str, int] = {}
        leaf = [0] * len(ups)
        for rank, hops in enumerate(ups):
            if not hops:
                continue
            self.up[: len(hops), rank] = [self.hop_id(h) for h in hops]
            self.down[: len(hops), rank] = [self.hop_id((v, u)) for u, v in reversed(hops)]
            for u, v in hops:  # summed hop by hop from 0.0, as ``Topology._make_route`` sums
                up_latency[rank] += self._spec[u][v].step_latency_s
            leaf[rank] = leaves.setdefault(hops[-1][1], len(leaves))
        self.up_latency = np.array(up_latency)
        self.down_latency = np.array(self._latency)[self.down]  # per hop down, every rank's
        self.leaf = np.array(leaf, dtype=np.int64)
        self.spine = len(leaves) > 1
        if self.spine:
            self.to_spine = np.array([self.hop_id((name, "spine")) for name in leaves], dtype=np.int64)
            self.from_spine = np.array([self.hop_id(("spine", name)) for name in leaves], dtype=np.int64)
        self.width = 2 * up_width + 2 * self.spine
        devices = [sorted(topology._device[r] for r in ranks) for ranks in topology._server_ranks]
        if topology.template.nic == "card" and all(d == devices[0] for d in devices):
            self._tabulate(topology._server_ranks[0], topology.num_servers)

    def _tabulate(self, ranks: list[int], servers: int) -> None:
        """Server 0's routes by device pair (local link ids, 1-based), and every server's links
        numbered after the others: server s's local link k is id base + s * links + k - 1."""
        import numpy as np

        size = int(self.device.max()) + 1
        local: dict[Hop, int] = {}
        routes = {(int(self.device[a]), int(self.device[b])): self._route(a, b) for a in ranks for b in ranks}
        width = max(len(r.hops) for r in routes.values())
        self.table = np.zeros((size, size, width), dtype=np.int64)
        self.table_latency = np.zeros((size, size))
        for (da, db), route in routes.items():
            self.table[da, db, : len(route.hops)] = [local.setdefault(h, len(local) + 1) for h in route.hops]
            self.table_latency[da, db] = route.step_latency_s
        self.links = len(local)
        self.base = len(self._bandwidth)
        specs = [self._spec[u][v] for u, v in local]
        self._tiled = (
            np.tile([s.bandwidth_Bps for s in specs], servers),
            np.tile([s.step_latency_s for s in specs], servers),
        )

    def route_ids(self, src, dst) -> tuple:
        """``Topology.route_ids`` of int64 arrays already checked."""
        import numpy as np

        between = self.server[src] != self.server[dst]
        if between.all():
            return self.across(src, dst)
        if not between.any():
            return self.inside(src, dst)
        parts = [(np.flatnonzero(~between), self.inside), (np.flatnonzero(between), self.across)]
        routed = [(where, *part(src[where], dst[where])) for where, part in parts]
        hops = np.zeros((max(h.shape[0] for _, h, _ in routed), len(src)), dtype=np.int64)
        latency = np.zeros(len(src))
        for where, part_hops, part_latency in routed:
            hops[: part_hops.shape[0], where] = part_hops
            latency[where] = part_latency
        return hops, latency

    def inside(self, a, b) -> tuple:
        """``route_ids`` of flows a[f] -> b[f], every one inside a server."""
        import numpy as np

        if self.table is not None:
            da, db = self.device[a], self.device[b]
            local = self.table[da, db].T
            hops = np.where(local > 0, local + (self.base - 1 + self.server[a] * self.links), 0)
            return hops, self.table_latency[da, db]
        routes = [self._route(x, y) for x, y in zip(a.tolist(), b.tolist())]
        hops = np.zeros((max((len(r.hops) for r in routes), default=0), len(routes)), dtype=np.int64)
        for f, route in enumerate(routes):
            hops[: len(route.hops), f] = [self.hop_id(h) for h in route.hops]
        return hops, np.array([r.step_latency_s for r in routes])

    def across(self, a, b) -> tuple:
        """``route_ids`` of flows a[f] -> b[f], every one between two servers."""
        import numpy as np

        up_width = self.up.shape[0]
        hops = np.empty((self.width, len(a)), dtype=np.int64)
        for k in range(up_width):
            np.take(self.up[k], a, out=hops[k])
        latency = self.up_latency[a]
        down = range(up_width, 2 * up_width)
        if self.spine:
            leaf_a, leaf_b = self.leaf[a], self.leaf[b]
            same = leaf_a == leaf_b
            hops[up_width] = np.where(same, 0, self.to_spine[leaf_a])
            hops[up_width + 1] = np.where(same, 0, self.from_spine[leaf_b])
            down = range(up_width + 2, self.width)
            link_latency = self.latencies()
            for k in (up_width, up_width + 1):  # hop by hop, as ``route`` sums (padding adds 0.0)
                latency += link_latency[hops[k]]
        for j, k in enumerate(down):
            np.take(self.down[j], b, out=hops[k])
            latency += self.down_latency[j][b]
        return hops, latency

    def hop_id(self, hop: Hop) -> int:
        """The id of a link numbered as a route first takes it (never a tabulated server's own)."""
        found = self._ids.get(hop)
        if found is None:
            if self.table is not None:
                raise AssertionError(f"{hop} is a tabulated server's link: its id comes from the table")
            spec = self._spec[hop[0]][hop[1]]
            found = self._ids[hop] = len(self._bandwidth)
            self._bandwidth.append(spec.bandwidth_Bps)
            self._latency.append(spec.step_latency_s)
        return found

    def _numbered(self):
        import numpy as np

        if self._cache[0] != len(self._bandwidth):
            bandwidth, latency = np.array(self._bandwidth), np.array(self._latency)
            if self.table is not None:
                bandwidth, latency = (
                    np.concatenate([bandwidth, self._tiled[0]]),
                    np.concatenate([latency, self._tiled[1]]),
                )
            self._cache = (len(self._bandwidth), bandwidth, latency)
        return self._cache

    def bandwidths(self):
        return self._numbered()[1]

    def latencies(self):
        return self._numbered()[2]
