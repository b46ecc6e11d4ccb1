"""A hang: one rank never calls a collective the others wait in.

    HCCL_EXEC_TIMEOUT=3 hccl-launch -n 4 examples/failures/hang.py

Rank 2 skips the third all_reduce (a data-dependent `if` gone wrong, the classic cause); the
others time out after HCCL_EXEC_TIMEOUT and hccl-launch's report names rank 2 and the call.
The same hang can be injected without editing code:

    HCCL_EXEC_TIMEOUT=3 hccl-launch -n 4 --fault rank=2,op=allreduce,seq=3,action=hang examples/allreduce.py
"""

import time

import numpy as np

import hccl_py as hccl

comm = hccl.init()
x = np.ones(1024, np.float32)
for step in range(1, 5):
    if comm.rank == 2 and step == 3:
        time.sleep(3600)  # skips the collective: never enters allreduce #3
    comm.all_reduce(x)
print(f"rank {comm.rank}: done")
