"""A rank that starts a family of processes which would outlive it unless someone kills them.

``start_family`` starts, from the calling rank: a child in the rank's process group
(``sleep 600``), a child in a process group of its own (setpgid), and a grandchild orphaned by a
double fork that also leaves the group. Each family member's pid (the rank's too) is written to
``<pid_dir>/family_<rank>.pids`` once all of them run, one per line.

As a script (under hccl-launch): ``family.py --pid-dir DIR [--then block|exit]``: start the
family, then block until stopped (default) or exit 0 at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys


def start_family(rank: int, pid_dir: str) -> list[int]:
    same_group = subprocess.Popen(["sleep", "600"])
    own_group = subprocess.Popen(["sleep", "600"], process_group=0)
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle child: fork the grandchild and leave it orphaned
        try:
            os.close(read_end)
            grandchild = os.fork()
            if grandchild == 0:
                os.close(write_end)
                os.setpgid(0, 0)
                os.execvp("sleep", ["sleep", "600"])
            os.write(write_end, str(grandchild).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        grandchild = int(f.read())
    os.waitpid(middle, 0)
    pids = [os.getpid(), same_group.pid, own_group.pid, grandchild]
    path = os.path.join(pid_dir, f"family_{rank}.pids")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(map(str, pids)) + "\n")
    os.replace(path + ".tmp", path)  # readers never see a half-written file
    return pids


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid-dir", required=True)
    parser.add_argument("--then", choices=("block", "exit"), default="block")
    opts = parser.parse_args()
    start_family(int(os.environ["RANK_ID"]), opts.pid_dir)
    print(f"family of rank {os.environ['RANK_ID']} started", flush=True)
    if opts.then == "block":
        while True:
            signal.pause()
    sys.exit(0)
