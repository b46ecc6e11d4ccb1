"""Fault injection: one spec language for hangs, crashes, delays, stragglers, degraded links and
lost messages, given as ``hccl-launch --fault SPEC`` (repeatable) or ``HCCL_PY_FAULTS`` (specs
separated by ``;``)::

    rank=2,op=allreduce,seq=3,action=hang      rank 2 never finishes allreduce #3 (it blocks in it)
    rank=1,action=crash,at=allgather#2         rank 1 dies (exit 1) entering allgather #2
    rank=3,action=delay,seconds=2.5            rank 3 enters its first collective 2.5 s late
    rank=1,action=slow,factor=1.8              rank 1's card computes 1.8x slower (a straggler)
    link=0-1,action=degrade,factor=0.25        the route between ranks 0 and 1 keeps 25% of its bandwidth
    rank=0,action=drop                         rank 0's first message is lost: its peer must time out

``seq`` (and ``#n`` in ``at=``) is the call's sequence number on its communicator, as error
messages print it (``allreduce #3 on communicator 'world'``); ``comm=NAME`` narrows a fault to one
communicator (default: any). Without ``op``/``seq`` a hang, crash, delay or drop hits the first
collective call. Delays count in modeled time as well as in wall time, and stragglers and degraded
links only in modeled time, so the same spec always gives the same modeled outcome.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .collectives import COLLECTIVES, collective
from .errors import HcclParamError

ACTIONS = ("hang", "crash", "delay", "slow", "degrade", "drop")
OPS = (*COLLECTIVES, "send", "recv")
_KEYS = {"rank", "op", "seq", "at", "comm", "action", "seconds", "factor", "link"}
_NEEDS = {
    "hang": {"rank"},
    "crash": {"rank"},
    "delay": {"rank", "seconds"},
    "slow": {"rank", "factor"},
    "degrade": {"link", "factor"},
    "drop": {"rank"},
}
_ALLOWS = {
    "hang": {"op", "seq", "at", "comm"},
    "crash": {"op", "seq", "at", "comm"},
    "delay": {"op", "seq", "at", "comm"},
    "slow": set(),
    "degrade": set(),
    "drop": {"op", "seq", "at", "comm"},
}


@dataclass(frozen=True)
class Fault:
    """One parsed fault; ``matches`` says whether a call triggers it."""

    action: str
    rank: int | None = None
    op: str | None = None
    seq: int | None = None
    comm: str | None = None
    seconds: float = 0.0
    factor: float = 1.0
    link: tuple[int, int] | None = None
    spec: str = ""

    def matches(self, op: str, seq: int, comm: str) -> bool:
        """Whether a call (``op``, sequence number ``seq`` on communicator ``comm``) triggers this fault:
        a fault naming neither op nor seq matches the first call it is checked against."""
        if self.op is None and self.seq is None:
            return True  # the first call that reaches the check (the caller fires it once)
        return (
            (self.op is None or self.op == op)
            and (self.seq is None or self.seq == seq)
            and (self.comm is None or self.comm == comm)
        )


def _error(spec: str, problem: str, **fields) -> HcclParamError:
    """The error for a bad fault spec; ``fields``: ``field`` (the spec's key at fault), ``value``
    (as written), ``rule`` and its details, as for any rejected input."""
    return HcclParamError(
        f"fault spec {spec!r}: {problem}. Example: 'rank=2,op=allreduce,seq=3,action=hang'", spec=spec, **fields
    )


def _number(spec: str, key: str, text: str, kind=float, positive: bool = True):
    try:
        value = kind(text)
    except ValueError:
        raise _error(
            spec,
            f"{key}={text!r} is not a{'n integer' if kind is int else ' number'}",
            field=key,
            value=text,
            rule="type",
            expected="int" if kind is int else "number",
        ) from None
    if (
        value != value
        or value in (float("inf"), float("-inf"))
        or (positive and value <= 0)
        or (not positive and value < 0)
    ):
        raise _error(
            spec,
            f"{key}={text!r} must be {'> 0' if positive else '>= 0'}",
            field=key,
            value=text,
            rule="range",
            expected="> 0" if positive else ">= 0",
        )
    return value


def parse_fault(spec: str) -> Fault:
    """One spec (``key=value`` pairs joined by commas) -> :class:`Fault`; ``HcclParamError``
    naming the exact problem otherwise::

        parse_fault("rank=1,action=crash,at=allgather#2")   # Fault(action='crash', rank=1, op='allgather', seq=2, ...)
    """
    if not isinstance(spec, str) or not spec.strip():
        raise _error(str(spec), "it is empty", rule="nonempty")
    fields: dict[str, str] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not key or not value:
            raise _error(
                spec, f"{part.strip()!r} is not key=value", value=part.strip(), rule="format", expected="key=value"
            )
        if key not in _KEYS:
            raise _error(
                spec,
                f"unknown key {key!r}; keys are {', '.join(sorted(_KEYS))}",
                field=key,
                rule="unknown",
                choices=sorted(_KEYS),
            )
        if key in fields:
            raise _error(spec, f"{key} is given twice", field=key, rule="unique")
        fields[key] = value
    action = fields.pop("action", None)
    if action is None:
        raise _error(
            spec,
            f"action is missing; one of {', '.join(ACTIONS)}",
            field="action",
            rule="required",
            choices=list(ACTIONS),
        )
    action = action.lower()
    if action not in ACTIONS:
        raise _error(
            spec,
            f"unknown action {action!r}; one of {', '.join(ACTIONS)}",
            field="action",
            value=action,
            rule="choices",
            choices=list(ACTIONS),
        )
    if "at" in fields:
        if "op" in fields or "seq" in fields:
            raise _error(spec, "give either at=OP#SEQ or op= and seq=, not both", field="at", rule="exclusive")
        match = re.fullmatch(r"([a-z_]+)#(\d+)", fields["at"].lower())
        if not match:
            raise _error(
                spec, "at= must look like allgather#2", field="at", value=fields["at"], rule="format", expected="OP#SEQ"
            )
        del fields["at"]
        fields["op"], fields["seq"] = match[1], match[2]
    missing = _NEEDS[action] - fields.keys()
    if missing:
        raise _error(
            spec,
            f"action={action} needs {', '.join(sorted(missing))}",
            field=sorted(missing)[0],
            rule="required",
            action=action,
        )
    extra = fields.keys() - _NEEDS[action] - _ALLOWS[action]
    if extra:
        raise _error(
            spec,
            f"action={action} does not take {', '.join(sorted(extra))}",
            field=sorted(extra)[0],
            rule="unknown",
            action=action,
        )
    op = fields.get("op")
    if op is not None:
        op = op.lower()
        if op not in OPS:
            try:
                op = collective(op).name  # any spelling of a collective (reducescatter, all_reduce, ...)
            except HcclParamError:
                pass
        if op not in OPS:
            raise _error(
                spec,
                f"unknown op {fields['op']!r}; one of {', '.join(OPS)}",
                field="op",
                value=fields["op"],
                rule="choices",
                choices=list(OPS),
            )
    link = None
    if "link" in fields:
        match = re.fullmatch(r"(\d+)-(\d+)", fields["link"])
        if not match or match[1] == match[2]:
            raise _error(
                spec,
                "link= must name two different ranks, like link=0-1",
                field="link",
                value=fields["link"],
                rule="format",
                expected="RANK-RANK",
            )
        link = (int(match[1]), int(match[2]))
    factor = _number(spec, "factor", fields["factor"]) if "factor" in fields else 1.0
    if action == "degrade" and factor > 1:
        raise _error(
            spec,
            f"factor={fields['factor']} must be in (0, 1] for degrade: the share of bandwidth kept",
            field="factor",
            value=fields["factor"],
            rule="range",
            expected="(0, 1]",
            action=action,
        )
    if action == "slow" and factor < 1:
        raise _error(
            spec,
            f"factor={fields['factor']} must be >= 1 for slow: how many times slower the card computes",
            field="factor",
            value=fields["factor"],
            rule="range",
            expected=">= 1",
            action=action,
        )
    return Fault(
        action=action,
        rank=_number(spec, "rank", fields["rank"], int, positive=False) if "rank" in fields else None,
        op=op,
        seq=_number(spec, "seq", fields["seq"], int) if "seq" in fields else None,
        comm=fields.get("comm"),
        seconds=_number(spec, "seconds", fields["seconds"], positive=False) if "seconds" in fields else 0.0,
        factor=factor,
        link=link,
        spec=spec.strip(),
    )


def parse_faults(text: str | None) -> list[Fault]:
    """``HCCL_PY_FAULTS``: specs separated by ``;`` (blank: none)."""
    if not text or not text.strip():
        return []
    return [parse_fault(part) for part in text.split(";") if part.strip()]


def check_ranks(faults: list[Fault], world_size: int) -> None:
    """Reject faults naming ranks outside the job (at launch, before anything starts)."""
    for fault in faults:
        for rank in ([fault.rank] if fault.rank is not None else []) + list(fault.link or ()):
            if not 0 <= rank < world_size:
                raise _error(
                    fault.spec,
                    f"rank {rank} is not in this job (ranks 0..{world_size - 1})",
                    field="rank" if rank == fault.rank else "link",
                    value=rank,
                    rule="range",
                    expected=f"0..{world_size - 1}",
                )
