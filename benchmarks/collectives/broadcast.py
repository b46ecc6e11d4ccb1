"""Broadcast: root's buffer is copied into every rank's buffer (in place). busbw = algbw."""

from __future__ import annotations

from hccl_py.collectives import collective

from .base import Case, Collective, pattern, same_counts


def init(case: Case):
    """Every rank starts with its own pattern (so a rank that receives nothing is caught) and
    expects the root's."""
    return pattern(case.count, case.rank, case.dtype), pattern(case.count, case.root, case.dtype)


COLLECTIVE = Collective("broadcast", collective("broadcast"), counts=same_counts, init=init)
