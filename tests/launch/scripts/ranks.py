"""A rank whose behaviour the launcher tests choose from the command line.

Every rank joins the hccl-py job first with ``--init`` (it binds its socket), writes its pid to
``--pid-dir`` (if given) and checks in at the launcher's store,
then: the ``--fail-rank`` waits until every rank has checked in (so the others really have to be
stopped, however slowly they started) and exits with ``--code`` after writing a few stderr
lines, the ``--sigkill-rank`` does the same and kills itself with SIGKILL, everyone else sleeps
``--sleep`` seconds and exits 0, or with ``--block`` waits until it is stopped.
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
parser.add_argument("--block", action="store_true", help="never finish on its own: wait until stopped")
parser.add_argument("--store-check", action="store_true", help="use the launcher's store before anything else")
parser.add_argument("--init", action="store_true", help="hccl_py.init() first (each rank binds its socket)")
opts = parser.parse_args()
rank = int(os.environ["RANK_ID"])

if opts.init:
    import hccl_py

    hccl_py.init()

if opts.store_check:
    from hccl_py.rendezvous.store import StoreClient

    with StoreClient.from_env(timeout_s=10) as store:
        store.set(f"rank{rank}", str(os.getpid()).encode())
        store.wait([f"rank{r}" for r in range(int(os.environ["RANK_SIZE"]))], timeout_s=10)
        print(f"store ok, arrivals={store.add('arrivals')}")

if opts.pid_dir:
    path = os.path.join(opts.pid_dir, f"rank_{rank}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)  # readers never see a half-written file

if opts.fail_rank >= 0 or opts.sigkill_rank >= 0:
    # Check in; the rank about to fail waits for every rank first (no guessed sleep).
    from hccl_py.rendezvous.store import StoreClient

    with StoreClient.from_env(timeout_s=60) as store:
        store.set(f"up/{rank}", b"1")
        if rank in (opts.fail_rank, opts.sigkill_rank):
            store.wait([f"up/{r}" for r in range(int(os.environ["RANK_SIZE"]))], timeout_s=60)

if rank == opts.fail_rank:
    for i in range(30):
        print(f"rank {rank} diagnostic line {i}", file=sys.stderr)
    print(f"fatal: rank {rank} gives up with code {opts.code}", file=sys.stderr)
    sys.exit(opts.code)
if rank == opts.sigkill_rank:
    print(f"rank {rank} about to SIGKILL itself", file=sys.stderr)
    os.kill(os.getpid(), signal.SIGKILL)

print(f"rank {rank} sleeping {'until stopped' if opts.block else opts.sleep}")
if opts.block:
    while True:
        signal.pause()
time.sleep(opts.sleep)
print(f"rank {rank} done")
