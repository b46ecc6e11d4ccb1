"""A connect timeout: one rank starts later than HCCL_CONNECT_TIMEOUT allows.

    HCCL_CONNECT_TIMEOUT=2 hccl-launch -n 4 examples/failures/connect_timeout.py

Rank 3 is slow to start (a long import, a cold cache, a node that boots late). The others give up
after HCCL_CONNECT_TIMEOUT with HcclTimeoutError naming the rank that never joined.
"""

import os
import time

import hccl_py as hccl

if os.environ.get("RANK") == os.environ.get("RANK_LATE", "3"):
    time.sleep(float(os.environ.get("HCCL_CONNECT_TIMEOUT", "120")) + 3)
try:
    comm = hccl.init()
except hccl.HcclTimeoutError as err:
    print(f"rank {os.environ.get('RANK')}: {err}")
    raise SystemExit(1)
print(f"rank {comm.rank}: joined")
