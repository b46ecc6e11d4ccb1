"""hccl-py's own API (no torch in the program): ``hccl_py.init()`` under torchrun meets through
torchrun's agent store."""

import sys

import numpy as np

import hccl_py

comm = hccl_py.init()
x = np.full(8, comm.rank + 1, np.float32)
comm.all_reduce(x)
print(f"rank {comm.rank}/{comm.size} sum {x[0]:g} adapter loaded: {'hccl_py.torch' in sys.modules}", flush=True)
comm.destroy()
