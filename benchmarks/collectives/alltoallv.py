"""AlltoAllV: alltoall's data through the call with counts per pair, every count equal (as HCCL's
alltoallv_test runs it).

Size is the whole send buffer (n blocks), as alltoall; each rank passes ``n`` equal send and
receive counts and packed displacements. Inputs and expected outputs are alltoall's, so a block
delivered to the wrong rank or slot is caught. busbw = algbw * (n-1)/n. hccl-py runs
``all_to_all_v``, which first exchanges the counts (its modeled time includes that), MPI
``Alltoallv``; gloo does not run it.
"""

from __future__ import annotations

from hccl_py.collectives import collective

from . import alltoall
from .base import Collective

COLLECTIVE = Collective("alltoallv", collective("alltoallv"), counts=alltoall.counts, init=alltoall.init)
