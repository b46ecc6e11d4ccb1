"""Merge the ranks' flight-recorder dumps into one root-cause report.

Each rank dumps its latest collective calls (``flight_rank<r>.json``) when a call fails, when it
is stopped with SIGTERM, or when it dies of an uncaught exception. This module answers the
questions people ask of HCCL and NCCL jobs: which rank failed first, in which operation, which
ranks never entered the call the others were waiting in, and who waited for whom::

    world: rank 2 never entered allreduce #3 (its last call: allgather #2, completed);
           ranks 0, 1, 3 waited 5.0 s in allreduce #3 (HcclTimeoutError)
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

P2P = ("send", "recv")


def load_dumps(flight_dir: Path) -> dict[int, dict]:
    """rank -> its dump; unreadable files (a rank killed mid-write) are left out."""
    dumps = {}
    for path in sorted(Path(flight_dir).glob("flight_rank*.json")):
        try:
            doc = json.loads(path.read_text())
            dumps[int(doc["rank"])] = doc
        except (OSError, ValueError, KeyError):
            continue
    return dumps


def failure_order(dumps: dict[int, dict], ranks: list[int]) -> list[int]:
    """``ranks``, failed since the launcher last looked, in the order they failed by their flight
    records' dump times (seconds since the job started, one clock for the job). A busy machine can
    keep the launcher off the CPU while a rank dies and the peers that learn of it exit too; the
    order it finds them in is then only rank order. A rank with no record (killed before it could
    write one) comes first: the others' errors are what report a peer's death."""

    def dumped_at(rank: int) -> float:
        doc = dumps.get(rank)
        return -math.inf if doc is None else float(doc.get("dumped_at_s", math.inf))

    return sorted(ranks, key=dumped_at)


def _rank_list(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def diagnose(dumps: dict[int, dict], world_size: int, local_ranks: list[int] | None = None) -> dict:
    """The findings as data (for diagnosis.json); :func:`format_diagnosis` words them.
    ``local_ranks``: the ranks this launcher ran (multi-node); the others' dumps are elsewhere."""
    origin = {r: d.get("wall_origin", 0.0) for r, d in dumps.items()}
    failures = []
    for rank, doc in dumps.items():
        for rec in doc.get("records", []):
            if rec["state"] == "failed":
                failures.append(
                    {
                        "rank": rank,
                        "at_s": rec["wall_end"] - origin[rank],
                        "comm": rec["comm"],
                        "op": rec["op"],
                        "seq": rec["seq"],
                        "error": rec["error"],
                    }
                )
    failures.sort(key=lambda f: f["at_s"])
    communicators = []
    by_comm: dict[str, dict[int, list[dict]]] = defaultdict(dict)
    for rank, doc in dumps.items():
        for rec in doc.get("records", []):
            if rec["op"] not in P2P:
                by_comm[rec["comm"]].setdefault(rank, []).append(rec)
    for comm, per_rank in sorted(by_comm.items()):
        members = sorted({p for recs in per_rank.values() for rec in recs for p in rec["peers"]})
        if comm == "world":
            members = list(range(world_size))
        last = {r: max(recs, key=lambda rec: rec["seq"]) for r, recs in per_rank.items()}
        unfinished = [rec for r, rec in last.items() if rec["state"] != "completed"]
        if not unfinished:
            continue
        stuck_seq = min(rec["seq"] for rec in unfinished)
        stuck = next(rec for rec in unfinished if rec["seq"] == stuck_seq)
        entered, waited, missing, unknown, elsewhere = [], [], [], [], []
        for r in members:
            if r not in dumps:
                (elsewhere if local_ranks is not None and r not in local_ranks else unknown).append(r)
                continue
            recs = {rec["seq"]: rec for rec in per_rank.get(r, [])}
            rec = recs.get(stuck_seq)
            if rec is None:
                before = [x for x in per_rank.get(r, []) if x["seq"] < stuck_seq]
                prev = max(before, key=lambda x: x["seq"]) if before else None
                missing.append(
                    {"rank": r, "last": None if prev is None else f"{prev['op']} #{prev['seq']}, {prev['state']}"}
                )
            elif rec["state"] == "completed":
                entered.append(r)
            else:
                end = rec["wall_end"] if rec["wall_end"] is not None else dumps[r].get("dumped_at_s", 0.0) + origin[r]
                waited.append(
                    {"rank": r, "state": rec["state"], "waited_s": end - rec["wall_start"], "error": rec["error"]}
                )
        communicators.append(
            {
                "comm": comm,
                "op": stuck["op"],
                "seq": stuck_seq,
                "never_entered": missing,
                "waiting": waited,
                "completed": entered,
                "no_record": unknown,
                "other_nodes": elsewhere,
            }
        )
    imbalance = []
    for rank, doc in sorted(dumps.items()):
        waited_for = doc.get("waited_for") or {}
        top = max(waited_for.items(), key=lambda kv: kv[1]) if waited_for else None
        imbalance.append(
            {
                "rank": rank,
                "clock_s": doc.get("clock"),
                "compute_s": doc.get("compute_s"),
                "comm_s": doc.get("comm_s"),
                "wait_s": doc.get("wait_s"),
                "waited_most_for": None if top is None else {"rank": int(top[0]), "seconds": top[1]},
                "reason": doc.get("reason"),
            }
        )
    return {
        "first_failure": failures[0] if failures else None,
        "communicators": communicators,
        "ranks": imbalance,
        "dumps_from": sorted(dumps),
        "world_size": world_size,
    }


def format_diagnosis(found: dict) -> str:
    """The report's "Collective state" section in words, from :func:`diagnose`'s findings: the first
    failure (wall seconds since the job started), per communicator who never entered the stuck call
    and who waited in it, why a rank dumped (unless it was only stopped), modeled time per rank (ms)."""
    lines = ["Collective state (from the ranks' flight recorders):"]
    first = found["first_failure"]
    if first is not None:
        lines.append(
            f"  first failure: rank {first['rank']} at {first['at_s']:.2f} s, {first['op']} #{first['seq']} "
            f"on '{first['comm']}': {first['error']}"
        )
    for c in found["communicators"]:
        call = f"{c['op']} #{c['seq']}"
        parts = []
        for m in c["never_entered"]:
            parts.append(
                f"rank {m['rank']} never entered {call}" + (f" (its last call: {m['last']})" if m["last"] else "")
            )
        failed = [w for w in c["waiting"] if w["state"] == "failed"]
        if failed:
            longest = max(w["waited_s"] for w in failed)
            errors = sorted({w["error"].split(":")[0] for w in failed})
            parts.append(
                f"{_rank_list([w['rank'] for w in failed])} waited {longest:.1f} s in {call} ({', '.join(errors)})"
            )
        inside = [w for w in c["waiting"] if w["state"] != "failed"]
        if inside:
            longest = max(w["waited_s"] for w in inside)
            parts.append(
                f"{_rank_list([w['rank'] for w in inside])} were still in {call} when stopped (after {longest:.1f} s)"
            )
        if c["no_record"]:
            parts.append(f"{_rank_list(c['no_record'])} left no flight record (killed before it could write one)")
        if c.get("other_nodes"):
            parts.append(f"{_rank_list(c['other_nodes'])} ran on other nodes (see their launchers' reports)")
        lines.append(f"  {c['comm']}: " + "; ".join(parts))
    for r in found["ranks"]:
        if r["reason"] and not r["reason"].startswith("stopped by SIGTERM"):
            lines.append(f"  rank {r['rank']}: {r['reason']}")
    busy = [r for r in found["ranks"] if r["clock_s"] is not None]
    if busy:
        lines.append("  modeled time per rank (ms):      clock     compute        comm        wait   waited most for")
        for r in busy:
            top = r["waited_most_for"]
            who = f"rank {top['rank']} ({top['seconds'] * 1e3:.3f} ms)" if top else "-"
            lines.append(
                f"    rank {r['rank']:<4}            {r['clock_s'] * 1e3:11.3f} {r['compute_s'] * 1e3:11.3f} "
                f"{r['comm_s'] * 1e3:11.3f} {r['wait_s'] * 1e3:11.3f}   {who}"
            )
    return "\n".join(lines)
