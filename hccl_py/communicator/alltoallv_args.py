"""All-to-all-v's arguments, as plain functions: counts and displacements per peer checked
(``layout``), the counts matrix every rank knows checked (``vc_matrix``), and the matrix the
ranks agreed on found from their exchanged rows (``agreed``). Each refuses with the caller's
``bad(what, message, **fields)``, which adds the communicator's fields to an HcclParamError.

Example::

    counts, displs = layout(4, "all_to_all_v on 'world'", "send", [1, 2, 0, 1], None, 4, comm_bad)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..algorithms._common import packed_displacements
from ..algorithms.alltoallv import as_matrix
from ..errors import HcclParamError

Bad = Callable[..., HcclParamError]  # bad(what, message, **fields): the refusal to raise


def whole(value) -> int:
    """``value`` as an int when it is a whole number (an int, a numpy integer, or a float or
    array element without a fraction); ValueError for 1.5, TypeError for what is no number."""
    if isinstance(value, bool):
        raise TypeError("bool is not a count")
    number = int(value)
    if number != value:
        raise ValueError(f"{value!r} is not a whole number")
    return number


def layout(size: int, what: str, side: str, counts, displs, available: int, bad: Bad) -> tuple[list[int], list[int]]:
    """``counts`` and ``displs`` (None: packed) of the ``side`` buffer, checked: one per rank,
    non-negative, inside ``available`` elements, blocks not overlapping."""
    try:
        counts = [whole(c) for c in counts]
        displs = packed_displacements(counts) if displs is None else [whole(d) for d in displs]
    except (TypeError, ValueError):
        raise bad(
            what,
            f"{side}_counts and {side}_displs must be sequences of whole numbers (no fractions), "
            f"got {counts!r} and {displs!r}",
            arg=f"{side}_counts",
            rule="type",
        ) from None
    if len(counts) != size or len(displs) != size:
        raise bad(
            what,
            f"{side}_counts and {side}_displs need {size} entries (one per rank), got {len(counts)} and {len(displs)}",
            arg=f"{side}_counts",
            rule="length",
            expected=size,
        )
    for name, values in ((f"{side}_counts", counts), (f"{side}_displs", displs)):
        negative = [i for i, v in enumerate(values) if v < 0]
        if negative:
            raise bad(
                what,
                f"{name}[{negative[0]}] = {values[negative[0]]} is negative",
                arg=name,
                value=values[negative[0]],
                rule="range",
                expected=">= 0",
            )
    past = [j for j in range(size) if displs[j] + counts[j] > available]
    if past:
        j = past[0]
        raise bad(
            what,
            f"{side} block {j} ({counts[j]} elements at {displs[j]}) runs past the {side} buffer "
            f"({available} elements)",
            arg=f"{side}_displs",
            value=displs[j],
            rule="range",
        )
    blocks = sorted((displs[j], displs[j] + counts[j], j) for j in range(size) if counts[j])
    for (a0, a1, ja), (b0, b1, jb) in zip(blocks, blocks[1:]):
        if b0 < a1:
            raise bad(
                what,
                f"{side} blocks {ja} and {jb} overlap ({a0}..{a1} and {b0}..{b1})",
                arg=f"{side}_displs",
                rule="overlap",
                value=[ja, jb],
            )
    return counts, list(displs)


def vc_matrix(size: int, what: str, counts, bad: Bad) -> tuple[tuple[int, ...], ...]:
    """all_to_all_vc's ``counts``, checked: a ``size`` x ``size`` matrix of non-negative whole numbers."""
    try:
        matrix = tuple(tuple(whole(c) for c in row) for row in counts)
    except (TypeError, ValueError):
        raise bad(
            what, f"counts must be a {size} x {size} matrix of whole numbers", arg="counts", rule="type"
        ) from None
    if len(matrix) != size or any(len(row) != size for row in matrix) or any(c < 0 for row in matrix for c in row):
        raise bad(
            what,
            f"counts must be a {size} x {size} matrix of non-negative ints",
            arg="counts",
            rule="shape",
            expected=[size, size],
        )
    return matrix


def agreed(size: int, what: str, table: np.ndarray, bad: Bad) -> tuple:
    """The counts matrix of an all-to-all-v from the exchanged rows ``[ok, sent..., expected...]``
    of every rank; refused when a rank rejected its own or two ranks disagree."""
    rejected = [r for r in range(size) if table[r, 0] != 1]
    if rejected:
        raise bad(
            what,
            f"rank(s) {rejected} passed counts or displacements they reject (see their own error); no data moved",
            arg="counts",
            rule="peer",
            ranks=rejected,
        )
    sent, expected = table[:, 1 : 1 + size], table[:, 1 + size :]
    wrong = [
        [int(i), int(j), int(sent[i, j]), int(expected[j, i])]
        for i in range(size)
        for j in range(size)
        if sent[i, j] != expected[j, i]
    ]  # [sender, receiver, sent, expected]
    if wrong:
        shown = "; ".join(
            f"rank {i} sends {n} element(s) to rank {j}, which expects {m} from rank {i}" for i, j, n, m in wrong[:6]
        )
        raise bad(
            what,
            f"send and receive counts disagree: {shown}{' ...' if len(wrong) > 6 else ''}; no data moved",
            arg="counts",
            rule="agree",
            mismatches=wrong,
        )
    return as_matrix(sent)
