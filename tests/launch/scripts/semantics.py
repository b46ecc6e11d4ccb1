"""What a rank sees of its interpreter: argv, path, __main__, its own random numbers, threads and
atexit at exit, and how it ends (RANK 1's ending is chosen by argv[1]: ok, exit3, raise, interrupt).

The tests run it under ``hccl-launch --start fork`` and ``--start exec`` and expect the same.
"""

import atexit
import os
import sys
import threading
import time

import numpy as np

rank = int(os.environ["RANK"])
print(f"argv={sys.argv}")
print(f"path0={sys.path[0]}")
print(f"path1={sys.path[1]}")
print(f"name={__name__}")
print(f"file={__file__}")
print(f"random={np.random.randint(0, 1 << 62)}")
print(f"stdin={sys.stdin.read()!r}")
atexit.register(lambda: print("atexit=ran", flush=True))


def late() -> None:
    time.sleep(0.2)  # the interpreter waits for a non-daemon thread before atexit
    print("thread=done", flush=True)


threading.Thread(target=late).start()
if rank == 1:
    ending = sys.argv[1]
    if ending == "exit3":
        sys.exit(3)
    if ending == "raise":
        raise ValueError("rank 1 raised this")
    if ending == "interrupt":
        raise KeyboardInterrupt
