"""A rank whose behaviour the launcher tests choose from the command line.

Every rank joins the hccl-py job first with ``--init``, writes its pid to ``--pid-dir`` (if
given), then: the ``--fail-rank`` exits with
``--code`` after writing a few stderr lines, the ``--sigkill-rank`` kills itself with SIGKILL,
everyone else sleeps ``--sleep`` seconds and exits 0.
"""

import argparse
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--pid-dir")
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--code", type=int, default=3)
parser.add_argument("--sigkill-rank", type=int, default=-1)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--store-check", action="store_true", help="use the launcher's store before anything else")
parser.add_argument("--init", action="store_true", help="hccl_py.init() first (each rank binds its socket)")
opts = parser.parse_args()
rank = int(os.environ["RANK_ID"])

if opts.init:
    import hccl_py

    hccl_py.init()

if opts.store_check:
    from hccl_py.store import StoreClient

    with StoreClient.from_env(timeout_s=10) as store:
        store.set(f"rank{rank}", str(os.getpid()).encode())
        store.wait([f"rank{r}" for r in range(int(os.environ["RANK_SIZE"]))], timeout_s=10)
        print(f"store ok, arrivals={store.add('arrivals')}")

if opts.pid_dir:
    path = os.path.join(opts.pid_dir, f"rank_{rank}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)  # readers never see a half-written file

if rank == opts.fail_rank:
    time.sleep(0.2)  # let the others get going, so they really have to be stopped
    for i in range(30):
        print(f"rank {rank} diagnostic line {i}", file=sys.stderr)
    print(f"fatal: rank {rank} gives up with code {opts.code}", file=sys.stderr)
    sys.exit(opts.code)
if rank == opts.sigkill_rank:
    time.sleep(0.2)
    print(f"rank {rank} about to SIGKILL itself", file=sys.stderr)
    os.kill(os.getpid(), signal.SIGKILL)

print(f"rank {rank} sleeping {opts.sleep}")
time.sleep(opts.sleep)
print(f"rank {rank} done")
