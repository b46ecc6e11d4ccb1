"""Who met: the membership check of a job whose ranks meet at a store without a launcher's id.

Ranks started by hand (``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``, as torchrun,
``mp.spawn`` and ``env://`` also start them) know nothing about each other but the port. Two such
jobs started on one port at once may meet halfway: the first rank 0 hosts the store, the second
cannot bind the port, and each other rank goes to whichever process claims its slot first. The
ranks that met would compute with a stranger's data and exit 0. So before the first call the
ranks agree, through the store, that they are alone:

1. every rank's claim (``connect._claim``) carries its pid, host and process start time; a second
   claim of a rank fails and records the claimant under ``<generation>/rival/<machine>/<pid>``, as
   does a rank 0 that finds the port taken (:func:`report_rival`);
2. each rank looks on its own machine for processes started for the same store (this user's,
   with ``RANK`` or ``RANK_ID`` and the same ``MASTER_ADDR:MASTER_PORT`` in the environment they
   were started with) that are not members of the job nor their parents or children
   (:func:`lookalikes`), and waits until each has either exited (a job that ended, never a
   member) or recorded itself as a rival, at most until HCCL_CONNECT_TIMEOUT runs out (a rival
   must find this job's store still there, or it could meet the rest of its own job's strangers
   in a store of its own);
3. each rank publishes its view (the members it read, the rivals it found, a recorded conflict)
   and reads every rank's view: if any view holds a rival or a conflict, or two views disagree on
   the members, every rank raises the same HcclConnectError naming the ranks that met and the
   rivals (pid, host, start time, the rank they were started as), and no rank computes.

What stays out of reach: a rival on another machine that reaches the store only after the ranks
agreed (it fails on its own, but the ranks that met have started computing), and a rival whose
environment does not carry ``RANK`` (``mp.spawn`` sets it after the start). A launcher's job id
(hccl-launch, ``HCCL_PY_JOB_ID``, torchrun's ``--rdzv-id``, Slurm) makes all of this moot: the
store refuses a rank of another job at once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterable

from .. import env
from ..errors import HcclConnectError, HcclError, HcclTimeoutError

DECIDED_WAIT_S = 10.0  # how long a failing rank waits for the others to have read the views
_POLL_S = 0.05
_LOCAL_NAMES = {"", "localhost", "127.0.0.1", "::1", "0.0.0.0", "ip6-localhost"}


@functools.cache
def machine_identity() -> str:
    """This machine and pid namespace (pids of processes with equal identities are comparable);
    unlike ``choice.host_identity``, ``HCCL_PY_HOST_ID`` does not change it."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        pass
    try:
        parts.append(f"pid:{os.stat('/proc/self/ns/pid').st_ino}")
    except OSError:
        pass
    return hashlib.blake2b("|".join(parts).encode(), digest_size=8).hexdigest()


def process_started(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since the epoch (None where /proc cannot say)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    except (OSError, StopIteration, ValueError):
        return None
    ticks = int(stat[stat.rfind(b")") + 2 :].split()[19])  # field 22: starttime, in clock ticks since boot
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def identity() -> dict:
    """What a rank's claim says about its process: pid, host, machine and start time."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "machine": machine_identity(),
        "started": process_started(os.getpid()),
    }


def describe(info: dict) -> str:
    """``pid 4121 on node1 (started 12:03:07.25)``: a process as messages name it."""
    started = info.get("started")
    when = (
        time.strftime("%H:%M:%S", time.localtime(started)) + f".{int(started * 100) % 100:02d}"
        if isinstance(started, (int, float))
        else None
    )
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}" + (f" (started {when})" if when else "")


def rival_key(prefix: str, machine: str, pid: int) -> str:
    """The store key under which process ``pid`` on ``machine`` records itself as a rival."""
    return f"{prefix}/rival/{machine}/{pid}"


def report_rival(client, prefix: str, rank: int, why: str) -> None:
    """Record this process in the store as a rival of the job that holds it (a second claimant of
    ``rank``, or a rank 0 that found the port taken), so that job's ranks stop too. Best effort:
    a store that cannot be written leaves nothing to stop."""
    me = {**identity(), "rank": rank, "why": why}
    try:
        client.set(f"{prefix}/conflict", f"{describe(me)}, started as rank {rank}, {why}".encode())
        client.set(rival_key(prefix, me["machine"], me["pid"]), json.dumps(me).encode())
    except HcclError:
        pass


def _same_store_host(a: str | None, b: str | None) -> bool:
    a, b = (a or "").strip().strip("[]").lower(), (b or "").strip().strip("[]").lower()
    if a == b:
        return True
    local = _LOCAL_NAMES | {socket.gethostname().lower()}
    return (a in local or a.startswith("127.")) and (b in local or b.startswith("127."))


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process /proc shows."""
    found: dict[int, tuple[int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited while we looked
        fields = stat[stat.rfind(b")") + 2 :].split()
        found[int(entry)] = (int(fields[1]), fields[0].decode())
    return found


def _related(members: Iterable[int], procs: dict[int, tuple[int, str]]) -> set[int]:
    """The members, their ancestors and their descendants."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    related = set()
    for member in members:
        related.add(member)
        todo = [member]
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in related:
                    related.add(child)
                    todo.append(child)
        parent = procs.get(member, (0, ""))[0]
        while parent > 1 and parent not in related:
            related.add(parent)
            parent = procs.get(parent, (0, ""))[0]
    return related


_WANTED = (env.RANK, env.RANK_ID, env.MASTER_ADDR, env.MASTER_PORT, env.STORE_PORT)


def _start_environment(pid: int) -> dict[str, str] | None:
    """The variables of ``_WANTED`` in the environment process ``pid`` was started with (None
    when it cannot be read: another user's, or gone). Nothing else is kept."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    found = {}
    for item in raw.split(b"\0"):
        name, _, value = item.partition(b"=")
        text = name.decode(errors="replace")
        if text in _WANTED:
            found[text] = value.decode(errors="replace")
    return found


def lookalikes(addr: str, port: int, members: list[dict]) -> list[dict]:
    """Processes of this user on this machine that were started as ranks for the store at
    ``addr:port`` (``RANK`` or ``RANK_ID`` and that ``MASTER_ADDR``/``MASTER_PORT`` in their start
    environment, no store of a launcher's) but are none of ``members`` (claims: pid, machine)
    nor their ancestors or descendants. Empty where /proc is not there."""
    procs = _processes()
    if not procs:
        return []
    here = machine_identity()
    related = _related([m["pid"] for m in members if m.get("machine") == here and isinstance(m.get("pid"), int)], procs)
    uid = os.getuid()
    found = []
    for pid, (_, state) in procs.items():
        if pid in related or state in ("Z", "X"):
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        start_env = _start_environment(pid)
        if not start_env or env.STORE_PORT in start_env:
            continue
        rank = start_env.get(env.RANK, start_env.get(env.RANK_ID))
        if rank is None or start_env.get(env.MASTER_PORT, "").strip() != str(port):
            continue
        if not _same_store_host(start_env.get(env.MASTER_ADDR, "127.0.0.1"), addr):
            continue
        found.append(
            {
                "pid": pid,
                "host": socket.gethostname(),
                "machine": here,
                "started": process_started(pid),
                "rank": rank,
                "why": "was started for the same MASTER_ADDR:MASTER_PORT",
            }
        )
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def _settle(client, prefix: str, seen: list[dict], deadline: float) -> list[dict]:
    """Wait until each process in ``seen`` has exited or recorded itself as a rival (not past
    ``deadline``, less a moment to tell the others); the rivals: those that recorded themselves,
    and those still there, silent, when the wait ends."""
    pending = {p["pid"]: p for p in seen}
    rivals: list[dict] = []
    until = deadline - min(1.0, max(deadline - time.monotonic(), 0.0) / 10)
    while pending:
        pids = list(pending)
        keys = [rival_key(prefix, pending[pid]["machine"], pid) for pid in pids]
        for pid, key, present in zip(pids, keys, client.check(keys)):
            if present:
                try:
                    recorded = json.loads(client.get(key, 1.0))
                except (HcclError, ValueError):
                    recorded = {}
                said = {k: v for k, v in recorded.items() if k in ("rank", "why", "host")}
                rivals.append({**pending.pop(pid), **said})
            elif not _alive(pid):
                del pending[pid]  # gone without touching this job: it never was a member
        if pending and time.monotonic() >= until:
            rivals.extend(
                {**p, "why": f"{p['why']} and is still running without having joined"} for p in pending.values()
            )
            break
        if pending:
            time.sleep(_POLL_S)
    return rivals


def agree(  # params: the meeting's state as connect holds it (store client, job, this rank's claim)
    client, prefix: str, rank: int, size: int, infos: list[dict], where: str, addr: str, port: int, deadline: float
) -> None:
    """Step 2 and 3 of the module doc for the rank ``rank`` of ``size`` whose claims read back as
    ``infos``: returns when every rank agrees the job met alone; else HcclConnectError (the same
    decision on every rank), naming the ranks that met and the rivals."""
    rivals = _settle(client, prefix, lookalikes(addr, port, infos) if port else [], deadline)
    conflict_key = f"{prefix}/conflict"
    conflict = client.get(conflict_key, 1.0).decode(errors="replace") if client.check([conflict_key])[0] else None
    members = hashlib.blake2b(json.dumps(infos, sort_keys=True).encode(), digest_size=8).hexdigest()
    view = {"members": members, "rivals": rivals, "conflict": conflict}
    client.set(f"{prefix}/view/{rank}", json.dumps(view).encode())
    keys = [f"{prefix}/view/{r}" for r in range(size)]
    try:
        client.wait(keys, max(deadline - time.monotonic(), 0.1))
    except HcclTimeoutError:
        missing = [r for r, ok in enumerate(client.check(keys)) if not ok]
        raise HcclTimeoutError(
            f"init: rank {rank}: rank(s) {missing} of {size} joined but did not confirm the job's members within "
            "HCCL_CONNECT_TIMEOUT (they failed or stopped during init); see their output",
            rank=rank,
            ranks=missing,
        ) from None
    views = [json.loads(client.get(k, max(deadline - time.monotonic(), 0.1))) for k in keys]
    all_rivals: dict[tuple, dict] = {}
    for v in views:
        for r in v["rivals"]:
            all_rivals.setdefault((r.get("machine"), r.get("pid")), r)
    conflicts = sorted({v["conflict"] for v in views if v["conflict"]})
    disagree = len({v["members"] for v in views}) > 1
    if not all_rivals and not conflicts and not disagree:
        return
    # Every rank fails alike; the rank whose process hosts the store must not take it away before
    # the others have read the views (they would fail on a lost store instead of this reason).
    # The decision stands once the views are read: a store that went away meanwhile (its host read
    # the last "decided" and left before answering this rank) changes nothing of it.
    try:
        client.set(f"{prefix}/decided/{rank}", b"1")
        client.wait([f"{prefix}/decided/{r}" for r in range(size)], DECIDED_WAIT_S)
    except HcclError:
        pass  # a rank that is gone cannot read anything
    met = "; ".join(f"rank {r} {describe(info)}" for r, info in enumerate(infos))
    others = "; ".join(
        f"{describe(r)}, started as rank {r.get('rank', '?')}, {r.get('why', '')}" for r in all_rivals.values()
    )
    told = (
        (f" Other processes came for this store: {others}." if others else "")
        + (f" Recorded: {' / '.join(conflicts)}." if conflicts and not others else "")
        + (" The ranks read different members." if disagree else "")
    )
    raise HcclConnectError(
        f"init: rank {rank}: two jobs probably met at the store at {where} (MASTER_ADDR:MASTER_PORT), so no rank of "
        f"this job computes: the ranks that met are {met}.{told} Ranks started by hand cannot tell two jobs on one "
        f"port apart: give each job its own MASTER_PORT, set {env.JOB_ID} to a distinct value per job (the same on all "
        "its ranks), or start it with hccl-launch",
        rank=rank,
        address=where,
        state="merged",
        members=[
            {"rank": r, "pid": i.get("pid"), "host": i.get("host"), "started": i.get("started")}
            for r, i in enumerate(infos)
        ],
        rivals=[{k: r.get(k) for k in ("pid", "host", "started", "rank", "why")} for r in all_rivals.values()],
    )
