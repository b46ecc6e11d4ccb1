"""Gathering picklable Python objects (reports, timelines) over a communicator: two all_gathers,
one of the sizes and one of the padded bytes.

    reports = all_gather_objects(comm, {"rank": comm.rank, "peak": comm.device.peak_bytes})
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ..communicator import Communicator


def all_gather_objects(comm: Communicator, obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if comm.size == 1:
        return [obj]
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = comm.all_gather(np.array([payload.size], np.int64)).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: payload.size] = payload
    table = comm.all_gather(padded)
    return [pickle.loads(table[r, : int(sizes[r])].tobytes()) for r in range(comm.size)]
