"""The multi-process test helpers themselves (tests/mp.py): a command that runs out of time is
stopped whole, grandchildren and multiprocessing's semaphores included."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.mp import is_gone, run_command, wait_until

_SPAWNS = """
import multiprocessing as mp, sys, time
if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    event = ctx.Event()  # a named semaphore, which the resource tracker unlinks when its users are gone
    child = ctx.Process(target=time.sleep, args=(600,))
    child.start()
    print(child.pid, event._cond._lock._semlock.name, flush=True)
    time.sleep(600)
"""


@pytest.mark.timeout(60)
def test_a_timed_out_command_is_stopped_with_its_children_and_semaphores(tmp_path):
    script = tmp_path / "spawns.py"
    script.write_text(_SPAWNS)
    with pytest.raises(subprocess.TimeoutExpired) as info:
        run_command([sys.executable, str(script)], timeout=8)
    pid, semaphore = info.value.output.split()
    assert is_gone(int(pid)), "the spawned grandchild outlived the timed-out command"
    shm_file = "/dev/shm/sem." + semaphore.lstrip("/")
    wait_until(lambda: not os.path.exists(shm_file), f"{shm_file} unlinked by the resource tracker", within=10)
