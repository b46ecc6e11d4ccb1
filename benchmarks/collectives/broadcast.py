"""Broadcast: root's buffer is copied into every rank's buffer (in place). busbw = algbw."""

from __future__ import annotations

from hccl_py.collectives import collective

from .base import Case, Collective, elements, pattern


def counts(nbytes: int, itemsize: int, nranks: int) -> tuple[int, int, int]:
    count = elements(nbytes, itemsize)
    return count, count, count


def init(case: Case):
    # Every rank starts with its own pattern, so a rank that receives nothing is caught.
    return pattern(case.count, case.rank, case.dtype), pattern(case.count, case.root, case.dtype)


COLLECTIVE = Collective("broadcast", collective("broadcast"), counts=counts, init=init)
