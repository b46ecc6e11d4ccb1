"""HCCL rank tables: read, validate and write the ``RANK_TABLE_FILE`` JSON, versions "1.0" and "1.2".

A version "1.0" table (as written by Ascend Operator / hccl_tools.py; every value a string)::

    {"version": "1.0", "server_count": "1", "status": "completed",
     "server_list": [{"server_id": "10.0.0.1", "host_ip": "10.0.0.1",
                      "device": [{"device_id": "0", "device_ip": "192.168.100.1", "rank_id": "0"},
                                 {"device_id": "1", "device_ip": "192.168.101.1", "rank_id": "1"}]}]}

Version "1.2" (Atlas A3 SuperPoD) adds ``super_device_id`` to every device and a
``super_pod_list`` that assigns each server to a super pod.

Validation follows HCCL's own checks (``CheckRankListInfo``, ``CheckDeviceId``, the concise parser)
and reports in its EI0004 / EI0014 style, naming the field and the fix::

    >>> RankTable.loads(text)                                     # doctest: +SKIP
    TopologyError: EI0014: Value ["3"] for ranktable variable [server_list[1].device[0].rank_id]
    is invalid. Expected value: a rank id used once; ... Fix: ...

Keys this module does not model (``container_ip``, ``hardware_type``, ``host_nic_ip``, ...) are
kept and written back unchanged.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from .errors import TopologyError

VERSIONS = ("1.0", "1.2")
# HCCL accepts device ids 0..15: 8 NPUs per Atlas 800/800T A2 server, 16 on A3 SuperPoD servers.
MAX_DEVICE_ID = 15
_DIGITS = re.compile(r"[0-9]{1,9}")  # <= 9 digits: well inside int32 like HCCL's stoi, and no int() blow-up

_TOP_KEYS = {"version", "status", "server_count", "server_list", "super_pod_list"}
_SERVER_KEYS = {"server_id", "host_ip", "device"}
_DEVICE_KEYS = {"device_id", "device_ip", "rank_id", "super_device_id"}


class RankInfo(NamedTuple):
    """One rank of a table: ``(rank_id, server_index, device_id, device_ip, host_ip)``."""

    rank_id: int
    server_index: int
    device_id: int
    device_ip: str | None
    host_ip: str | None


@dataclass(frozen=True)
class DeviceInfo:
    """One ``server_list[].device[]`` entry."""

    device_id: int
    rank_id: int
    device_ip: str | None = None
    super_device_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class ServerInfo:
    """One ``server_list[]`` entry; ``devices`` in file order."""

    server_id: str
    devices: tuple[DeviceInfo, ...]
    host_ip: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class SuperPodInfo:
    """One ``super_pod_list[]`` entry (version 1.2)."""

    super_pod_id: str
    server_ids: tuple[str, ...]


class _TopologyLike(Protocol):  # what generate() needs; keeps this module free of topology.py
    name: str
    num_ranks: int
    num_servers: int

    def server_ranks(self, server: int) -> list[int]: ...
    def device_of(self, rank: int) -> int: ...


@dataclass(frozen=True)
class RankTable:
    """A validated HCCL rank table.

    Build one with :meth:`load`, :meth:`loads`, :meth:`from_dict` or :meth:`generate` (they
    validate); the constructor takes the parts as they are.

    >>> table = RankTable.generate(Topology.preset("2x8p-roce"))   # doctest: +SKIP
    >>> table.num_ranks, table.server_count, table.ranks[9]         # doctest: +SKIP
    (16, 2, RankInfo(rank_id=9, server_index=1, device_id=1, device_ip='172.17.0.2', host_ip='10.0.0.2'))
    """

    servers: tuple[ServerInfo, ...]
    version: str = "1.0"
    status: str = "completed"
    super_pods: tuple[SuperPodInfo, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, hash=False)

    # ---------------------------------------------------------------- reading
    @classmethod
    def load(cls, path: str | os.PathLike) -> "RankTable":
        """Read and validate a rank-table file.

        An unreadable or missing file raises the EI0004 message HCCL prints:
        ``path ... is not a valid real path``.
        """
        p = Path(path)
        try:
            if not p.is_file():
                raise OSError("not a regular file")
            data = p.read_bytes()
        except OSError as err:
            raise TopologyError(
                f"EI0004: The ranktable is invalid, Reason:[path {os.fspath(path)} is not a valid real path ({err})]. "
                "Please check the configured ranktable. Fix: point RANK_TABLE_FILE / --rank-table at an existing, "
                "readable JSON file.",
                "path",
                value=os.fspath(path),
                path=os.fspath(path),
                rule="file",
                error_id="EI0004",
            ) from None
        return cls.loads(data)

    @classmethod
    def loads(cls, text: str | bytes) -> "RankTable":
        """Parse and validate rank-table JSON text."""
        if isinstance(text, (bytes, bytearray)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as err:
                raise _ei0004(
                    f"the file is not UTF-8 text ({err.reason} at byte {err.start})",
                    "save the rank table as UTF-8 JSON",
                    None,
                    rule="json",
                ) from None
        if not isinstance(text, str):
            raise _ei0004(f"expected JSON text, got {type(text).__name__}", "pass the file's text", None, rule="json")
        try:
            doc = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        except TopologyError:
            raise
        except RecursionError:
            raise _ei0004(
                "the JSON is nested too deeply", "write the rank table format shown in the HCCL docs", None, rule="json"
            ) from None
        except ValueError as err:
            raise _ei0004(
                f"the file is not valid JSON: {err}", "fix the JSON syntax at that position", None, rule="json"
            ) from None
        return cls.from_dict(doc)

    @classmethod
    def from_dict(cls, doc: Any) -> "RankTable":
        """Validate a parsed rank-table document (``json.load`` output)."""
        return _parse(doc)

    # ---------------------------------------------------------------- writing
    def to_dict(self) -> dict[str, Any]:
        """The table as a JSON-ready dict, every value a string, unknown keys kept."""
        server_list = []
        for server in self.servers:
            devices = []
            for dev in server.devices:
                d: dict[str, Any] = {"device_id": str(dev.device_id)}
                if dev.device_ip is not None:
                    d["device_ip"] = dev.device_ip
                d["rank_id"] = str(dev.rank_id)
                if dev.super_device_id is not None:
                    d["super_device_id"] = str(dev.super_device_id)
                d.update(dev.extra)
                devices.append(d)
            s: dict[str, Any] = {"server_id": server.server_id}
            if server.host_ip is not None:
                s["host_ip"] = server.host_ip
            s["device"] = devices
            s.update(server.extra)
            server_list.append(s)
        doc: dict[str, Any] = {
            "version": self.version,
            "server_count": str(len(self.servers)),
            "server_list": server_list,
        }
        if self.super_pods:
            doc["super_pod_list"] = [
                {"super_pod_id": pod.super_pod_id, "server_list": [{"server_id": sid} for sid in pod.server_ids]}
                for pod in self.super_pods
            ]
        doc["status"] = self.status
        doc.update(self.extra)
        return doc

    def dumps(self, indent: int | None = 4) -> str:
        """The table as JSON text."""
        return json.dumps(self.to_dict(), indent=indent) + "\n"

    def dump(self, path: str | os.PathLike) -> None:
        """Write the table to ``path`` (raises ``OSError`` if it cannot be written)."""
        Path(path).write_text(self.dumps(), encoding="utf-8")

    # ---------------------------------------------------------------- views
    @property
    def ranks(self) -> list[RankInfo]:
        """Every rank, sorted by rank id."""
        out = [
            RankInfo(dev.rank_id, i, dev.device_id, dev.device_ip, server.host_ip)
            for i, server in enumerate(self.servers)
            for dev in server.devices
        ]
        out.sort()
        return out

    @property
    def num_ranks(self) -> int:
        """Number of ranks (devices) in the table."""
        return sum(len(server.devices) for server in self.servers)

    @property
    def server_count(self) -> int:
        """Number of servers."""
        return len(self.servers)

    # ---------------------------------------------------------------- generating
    @classmethod
    def generate(cls, topology: _TopologyLike, version: str = "1.0") -> "RankTable":
        """A rank table for ``topology`` (what ``hccl-topo generate`` writes).

        Addresses are made up but valid and unique: server ``s`` is host ``10.x.y.z`` with
        ``x.y.z`` = s + 1; device ``d`` of it has device_ip ``172.(16+d).y.z``. Version "1.2" puts
        every server in super pod "0" with ``super_device_id`` = s * 16 + d.
        """
        if version not in VERSIONS:
            raise TopologyError(
                f"Value [{version}] for ranktable variable [version] is invalid. "
                f"Expected value: one of {', '.join(VERSIONS)}. Fix: pass --version 1.0 or 1.2.",
                "version",
                value=version,
                rule="choices",
                choices=list(VERSIONS),
                error_id="EI0014",
            )
        server_list = []
        for s in range(topology.num_servers):
            v = s + 1
            host = f"10.{(v >> 16) & 255}.{(v >> 8) & 255}.{v & 255}"
            devices = []
            for r in topology.server_ranks(s):
                d = topology.device_of(r)
                dev = {"device_id": str(d), "device_ip": f"172.{16 + d}.{(v >> 8) & 255}.{v & 255}", "rank_id": str(r)}
                if version == "1.2":
                    dev["super_device_id"] = str(s * (MAX_DEVICE_ID + 1) + d)
                devices.append(dev)
            server_list.append({"server_id": host, "host_ip": host, "device": devices})
        doc: dict[str, Any] = {
            "version": version,
            "server_count": str(len(server_list)),
            "server_list": server_list,
            "status": "completed",
        }
        if version == "1.2":
            doc["super_pod_list"] = [
                {"super_pod_id": "0", "server_list": [{"server_id": s["server_id"]} for s in server_list]}
            ]
        return cls.from_dict(doc)


# -------------------------------------------------------------------- validation


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _ei0014(fieldname: str, value: Any, expectation: str, fix: str, **fields: Any) -> TopologyError:
    """HCCL's EI0014 (a bad value); ``fields`` say which check failed (``rule`` and its details)."""
    return TopologyError(
        f"EI0014: Value [{_show(value)}] for ranktable variable [{fieldname}] is invalid. "
        f"Expected value: {expectation}. Fix: {fix}.",
        fieldname,
        value=value,
        error_id="EI0014",
        **fields,
    )


def _ei0004(reason: str, fix: str, fieldname: str | None, **fields: Any) -> TopologyError:
    """HCCL's EI0004 (the table as a whole is invalid); ``fields`` say which check failed."""
    return TopologyError(
        f"EI0004: The ranktable is invalid, Reason:[{reason}]. Please check the configured ranktable. Fix: {fix}.",
        fieldname,
        error_id="EI0004",
        **fields,
    )


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _ei0004(f'key "{key}" appears twice in one object', f'keep one "{key}"', key, rule="unique")
        out[key] = value
    return out


def _require(obj: dict, key: str, where: str) -> Any:
    if key not in obj:
        fieldname = f"{where}.{key}" if where else key
        raise _ei0004(
            f'"{fieldname}" is missing', f'add "{key}" to {where or "the top level"}', fieldname, rule="required"
        )
    return obj[key]


def _string(value: Any, fieldname: str, example: str) -> str:
    if not isinstance(value, str):
        raise _ei0014(
            fieldname,
            value,
            f'a string, e.g. "{example}" (every rank-table value is a string)',
            f'write {fieldname} as "{example}" in quotes',
            rule="type",
            expected="string",
        )
    return value


def _number(value: Any, fieldname: str, example: str) -> int:
    text = _string(value, fieldname, example)
    if not _DIGITS.fullmatch(text):
        raise _ei0014(
            fieldname,
            value,
            f'a non-negative decimal number in a string, e.g. "{example}"',
            f"write {fieldname} as digits only",
            rule="format",
            expected="decimal",
        )
    return int(text)


def _ip(value: Any, fieldname: str, example: str) -> str:
    text = _string(value, fieldname, example)
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise _ei0014(
            fieldname,
            value,
            f'an IPv4 or IPv6 address, e.g. "{example}"',
            f"set {fieldname} to the address from /etc/hccn.conf or the host's interface",
            rule="format",
            expected="ip",
        ) from None
    return text


def _object(value: Any, fieldname: str) -> dict:
    if not isinstance(value, dict):
        raise _ei0014(
            fieldname, value, "a JSON object", f"make {fieldname} an object {{...}}", rule="type", expected="object"
        )
    return value


def _nonempty_list(value: Any, fieldname: str, what: str) -> list:
    if not isinstance(value, list) or not value:
        raise _ei0014(
            fieldname,
            value,
            f"a non-empty list of {what}",
            f"give {fieldname} at least one {what[:-1]} entry",
            **({"rule": "nonempty"} if isinstance(value, list) else {"rule": "type", "expected": "list"}),
        )
    return value


def _parse(doc: Any) -> RankTable:
    if not isinstance(doc, dict):
        raise _ei0004(
            f"the top level is a JSON {type(doc).__name__}, not an object",
            'write {"version": ..., "server_count": ..., "server_list": [...], "status": ...}',
            None,
            rule="type",
            expected="object",
        )

    version = _string(_require(doc, "version", ""), "version", "1.0")
    if version not in VERSIONS:
        raise _ei0014(
            "version",
            version,
            '"1.0" or "1.2" ("1.2" adds super_pod_list and super_device_id)',
            'set "version": "1.0" (or "1.2" for Atlas A3 super pods)',
            rule="choices",
            choices=list(VERSIONS),
        )
    status = _string(_require(doc, "status", ""), "status", "completed")
    if status != "completed":
        raise _ei0014(
            "status",
            status,
            '"completed"',
            'the table is not finished; wait until the scheduler writes "status": "completed", '
            "or set it if you wrote the file by hand",
            rule="const",
            expected="completed",
        )
    server_count = _number(_require(doc, "server_count", ""), "server_count", "1")
    raw_servers = _nonempty_list(_require(doc, "server_list", ""), "server_list", "servers")
    if server_count != len(raw_servers):
        raise _ei0014(
            "server_count",
            doc["server_count"],
            f'"{len(raw_servers)}", the number of entries in server_list',
            f'set "server_count": "{len(raw_servers)}" or add/remove servers',
            rule="const",
            expected=str(len(raw_servers)),
        )
    if version == "1.0" and "super_pod_list" in doc:
        raise _ei0014(
            "version",
            version,
            '"1.2" when super_pod_list is present',
            'set "version": "1.2" or remove super_pod_list',
            rule="const",
            expected="1.2",
        )

    multi_server = len(raw_servers) > 1
    servers: list[ServerInfo] = []
    server_index: dict[str, int] = {}
    owner: dict[int, str] = {}  # rank id -> where it was seen
    for i, raw_server in enumerate(raw_servers):
        where = f"server_list[{i}]"
        raw_server = _object(raw_server, where)
        server_id = _string(_require(raw_server, "server_id", where), f"{where}.server_id", "10.0.0.1")
        if not server_id:
            raise _ei0014(
                f"{where}.server_id",
                server_id,
                "a non-empty, cluster-unique server id",
                "set server_id to the server's IP or name",
                rule="nonempty",
            )
        if server_id in server_index:
            raise _ei0014(
                f"{where}.server_id",
                server_id,
                f"a server id used once; server_list[{server_index[server_id]}] already has it",
                "give every server its own server_id",
                rule="unique",
                holder=f"server_list[{server_index[server_id]}]",
            )
        server_index[server_id] = i
        host_ip = _ip(raw_server["host_ip"], f"{where}.host_ip", "10.0.0.1") if "host_ip" in raw_server else None
        raw_devices = _nonempty_list(_require(raw_server, "device", where), f"{where}.device", "devices")
        devices: list[DeviceInfo] = []
        seen_device: dict[int, int] = {}
        for j, raw_dev in enumerate(raw_devices):
            dwhere = f"{where}.device[{j}]"
            raw_dev = _object(raw_dev, dwhere)
            device_id = _number(_require(raw_dev, "device_id", dwhere), f"{dwhere}.device_id", "0")
            if device_id > MAX_DEVICE_ID:
                raise _ei0014(
                    f"{dwhere}.device_id",
                    raw_dev["device_id"],
                    f"0..{MAX_DEVICE_ID}, the NPU's physical id",
                    "use the NPU id shown by npu-smi info",
                    rule="range",
                    expected=f"0..{MAX_DEVICE_ID}",
                )
            if device_id in seen_device:
                raise _ei0014(
                    f"{dwhere}.device_id",
                    raw_dev["device_id"],
                    f"a device id used once per server; {where}.device[{seen_device[device_id]}] already has it",
                    "give every NPU of a server its own device_id",
                    rule="unique",
                    holder=f"{where}.device[{seen_device[device_id]}]",
                )
            seen_device[device_id] = j
            if "device_ip" in raw_dev:
                device_ip: str | None = _ip(raw_dev["device_ip"], f"{dwhere}.device_ip", "192.168.100.1")
            elif multi_server:
                raise _ei0004(
                    f"'{dwhere}.device_ip' is not set correctly, must be set when multi Server",
                    "add each NPU's RoCE address (address_N in /etc/hccn.conf) as device_ip",
                    f"{dwhere}.device_ip",
                    rule="required",
                )
            else:
                device_ip = None
            rank_id = _number(_require(raw_dev, "rank_id", dwhere), f"{dwhere}.rank_id", "0")
            if rank_id in owner:
                raise _ei0014(
                    f"{dwhere}.rank_id",
                    raw_dev["rank_id"],
                    f"a rank id used once; {owner[rank_id]} already has it",
                    "give every device its own rank_id, 0..N-1",
                    rule="unique",
                    holder=owner[rank_id],
                )
            owner[rank_id] = dwhere
            super_device_id = None
            if "super_device_id" in raw_dev:
                if version == "1.0":
                    raise _ei0014(
                        "version",
                        version,
                        f'"1.2" when devices carry super_device_id ({dwhere})',
                        'set "version": "1.2" or remove super_device_id',
                        rule="const",
                        expected="1.2",
                    )
                super_device_id = _number(raw_dev["super_device_id"], f"{dwhere}.super_device_id", "37748736")
            elif version == "1.2":
                raise _ei0004(
                    f'"{dwhere}.super_device_id" is missing (required in version 1.2)',
                    'add super_device_id to every device, or use version "1.0"',
                    f"{dwhere}.super_device_id",
                    rule="required",
                )
            devices.append(
                DeviceInfo(
                    device_id,
                    rank_id,
                    device_ip,
                    super_device_id,
                    {k: v for k, v in raw_dev.items() if k not in _DEVICE_KEYS},
                )
            )
        servers.append(
            ServerInfo(
                server_id, tuple(devices), host_ip, {k: v for k, v in raw_server.items() if k not in _SERVER_KEYS}
            )
        )

    _check_rank_ids(servers, owner)
    super_pods = _parse_super_pods(doc, servers, server_index) if version == "1.2" else ()
    return RankTable(tuple(servers), version, status, super_pods, {k: v for k, v in doc.items() if k not in _TOP_KEYS})


def _check_rank_ids(servers: list[ServerInfo], owner: dict[int, str]) -> None:
    n = len(owner)
    for rank_id in sorted(owner):
        if rank_id >= n:
            missing = sorted(set(range(n)) - set(owner))
            raise _ei0014(
                f"{owner[rank_id]}.rank_id",
                str(rank_id),
                f"less than the communication size {n}: rank ids must be exactly 0..{n - 1}",
                f"renumber the ranks 0..{n - 1} (rank {missing[0]} is missing)",
                rule="range",
                expected=f"0..{n - 1}",
                missing_ranks=missing,
            )
    for i, server in enumerate(servers):
        ids = sorted(dev.rank_id for dev in server.devices)
        if ids[-1] - ids[0] + 1 != len(ids):
            gap = next(r for r in range(ids[0], ids[-1]) if r not in ids)
            raise _ei0014(
                f"server_list[{i}].device",
                [str(r) for r in ids],
                f"consecutive rank ids on one server; rank {gap} sits on another server ({owner[gap]}), "
                "so ranks are interleaved across servers",
                "number the ranks server by server: all ranks of server 0, then all of server 1, ...",
                rule="consecutive",
                holder=owner[gap],
            )


def _parse_super_pods(doc: dict, servers: list[ServerInfo], server_index: dict[str, int]) -> tuple[SuperPodInfo, ...]:
    raw_pods = (
        _nonempty_list(doc.get("super_pod_list"), "super_pod_list", "super pods") if "super_pod_list" in doc else None
    )
    if raw_pods is None:
        raise _ei0004(
            '"super_pod_list" is missing (required in version 1.2)',
            'add super_pod_list assigning every server to a super pod, or use version "1.0"',
            "super_pod_list",
            rule="required",
        )
    pods: list[SuperPodInfo] = []
    pod_of: dict[str, str] = {}
    listed_at: dict[str, str] = {}  # server id -> where a super pod lists it
    pod_ids: dict[str, str] = {}  # super pod id -> where it was seen
    for p, raw_pod in enumerate(raw_pods):
        where = f"super_pod_list[{p}]"
        raw_pod = _object(raw_pod, where)
        pod_id = _string(_require(raw_pod, "super_pod_id", where), f"{where}.super_pod_id", "0")
        if not pod_id or pod_id in pod_ids:
            raise _ei0014(
                f"{where}.super_pod_id",
                pod_id,
                "a non-empty super pod id used once",
                "give every super pod its own id",
                **({"rule": "unique", "holder": pod_ids[pod_id]} if pod_id else {"rule": "nonempty"}),
            )
        pod_ids[pod_id] = where
        raw_members = _nonempty_list(_require(raw_pod, "server_list", where), f"{where}.server_list", "servers")
        members = []
        for k, raw_member in enumerate(raw_members):
            mwhere = f"{where}.server_list[{k}]"
            raw_member = _object(raw_member, mwhere)
            sid = _string(_require(raw_member, "server_id", mwhere), f"{mwhere}.server_id", "10.0.0.1")
            if sid not in server_index:
                raise _ei0014(
                    f"{mwhere}.server_id",
                    sid,
                    "the server_id of a server in server_list",
                    "list only servers that appear in server_list",
                    rule="reference",
                )
            if sid in pod_of:
                raise _ei0014(
                    f"{mwhere}.server_id",
                    sid,
                    f"a server in one super pod only; it is already in super pod {pod_of[sid]}",
                    "list every server in exactly one super pod",
                    rule="unique",
                    holder=listed_at[sid],
                )
            pod_of[sid] = pod_id
            listed_at[sid] = f"{mwhere}.server_id"
            members.append(sid)
        pods.append(SuperPodInfo(pod_id, tuple(members)))
    for i, server in enumerate(servers):
        if server.server_id not in pod_of:
            raise _ei0004(
                f"server_list[{i}] (server_id {server.server_id}) is in no super pod",
                "add it to one super_pod_list[].server_list",
                f"server_list[{i}].server_id",
                value=server.server_id,
                rule="reference",
            )
    seen: dict[tuple[str, int], str] = {}
    for i, server in enumerate(servers):
        for j, dev in enumerate(server.devices):
            key = (pod_of[server.server_id], dev.super_device_id)  # type: ignore[arg-type]
            fieldname = f"server_list[{i}].device[{j}].super_device_id"
            if key in seen:
                raise _ei0014(
                    fieldname,
                    str(dev.super_device_id),
                    f"a super_device_id used once per super pod; {seen[key]} already has it",
                    "use each NPU's own super_device_id (npu-smi info -t spod-info)",
                    rule="unique",
                    holder=seen[key],
                )
            seen[key] = fieldname
    return tuple(pods)
