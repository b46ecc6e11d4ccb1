"""A job whose store is at an IPv6 address (``--master-addr ::1``, ``MASTER_ADDR=::1``) runs as on
127.0.0.1: the launcher's free port, the store (zmq wants ``tcp://[::1]:port`` and its IPV6
option, else "No such device") and the TCP transport's listener all take the address family of
the address given."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hccl_py.transport.tcp import address_family, advertised_address, unbracketed
from launch.proc import free_port

ROOT = Path(__file__).resolve().parents[2]

ALL_REDUCE = """
import numpy as np, hccl_py
comm = hccl_py.init()
x = np.full(1000, comm.rank + 1, np.float32)
comm.all_reduce(x)
print(f"rank {comm.rank} sum {x[0]:g} {x[-1]:g}", flush=True)
"""


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) on this host")


@needs_ipv6
def test_addresses_of_either_family() -> None:
    assert 0 < free_port("::1") < 65536 and 0 < free_port("[::1]") < 65536 and 0 < free_port("127.0.0.1") < 65536
    assert address_family("::1") == socket.AF_INET6 and address_family("127.0.0.1") == socket.AF_INET
    assert unbracketed("[::1]") == "::1" and unbracketed("10.0.0.1") == "10.0.0.1"
    assert advertised_address("[::1]", 29500, None) == advertised_address("::1", 29500, None) == "::1"
    assert advertised_address("127.0.0.1", 29500, None) == "127.0.0.1"


@needs_ipv6
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_hccl_launch_with_master_addr_ipv6(tmp_path: Path) -> None:
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    done = subprocess.run(
        [sys.executable, "-m", "launch.cli", "-n", "2", "--master-addr", "::1", str(script)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(line for line in done.stdout.splitlines()) == ["[0] rank 0 sum 3 3", "[1] rank 1 sum 3 3"]


@needs_ipv6
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_ranks_started_by_hand_with_master_addr_ipv6(tmp_path: Path, transport: str) -> None:
    """As torchrun or mp.spawn start them: RANK, WORLD_SIZE, MASTER_ADDR=::1, MASTER_PORT; rank 0
    hosts the store (and with tcp every rank listens on ::1)."""
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    port = free_port("::1")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "RANK": str(r),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "::1",
                "MASTER_PORT": str(port),
                "HCCL_PY_TRANSPORT": transport,
                "HCCL_CONNECT_TIMEOUT": "10",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        results = [p.communicate(timeout=45) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, (out, err)) in enumerate(zip(procs, results)):
        assert p.returncode == 0, err
        assert out.splitlines() == [f"rank {r} sum 3 3"]
    assert f"transport {transport}" in results[0][1]  # rank 0 says which transport the job took
