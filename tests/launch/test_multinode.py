"""Multi-node hccl-launch on loopback: two launchers form one job. Each gets its own host
identity (HCCL_PY_HOST_ID), so ranks of one "node" share memory and the nodes talk TCP."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from launch.cli import parse_args
from topology import RankTable, Topology

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
JOB = ROOT / "tests" / "hccl_py" / "transport" / "scripts" / "transport_job.py"

pytestmark = pytest.mark.usefixtures("no_leaks")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HCCL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(SCRIPTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "launch.cli", *args],
        env=_env(**env),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _two_nodes(nproc: int, *args: str, env1: dict[str, str] | None = None, timeout: float = 60, **env: str):
    """Both launchers of one job (node 1 first: it must wait for node 0); their (code, out, err)."""
    port = str(_free_port())
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port, "-n", str(nproc)]
    node1 = _launch("--node-rank", "1", *common, *args, **{"HCCL_PY_HOST_ID": "node1", **env, **(env1 or {})})
    node0 = _launch("--node-rank", "0", *common, *args, **{"HCCL_PY_HOST_ID": "node0", **env})
    out = []
    for proc in (node0, node1):
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        out.append((proc.returncode, stdout, stderr))
    return out


def _results(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(n)]


@pytest.mark.timeout(90)
def test_two_launchers_form_one_job_with_the_clocks_of_one_host(tmp_path: Path) -> None:
    (c0, _, err0), (c1, _, err1) = _two_nodes(2, str(JOB), "--out", str(tmp_path / "two"))
    assert c0 == 0 and c1 == 0, err0 + err1
    assert err0.startswith(
        "hccl-launch: node 0 of 2: ranks 0-1 of 4, modeled server 0 of topology 2x2p-roce "
        "(default for 2 nodes x 2 cards)"
    ), err0
    assert err1.startswith("hccl-launch: node 1 of 2: ranks 2-3 of 4, modeled server 1 of topology 2x2p-roce"), err1
    assert "[0] hccl-py: transport shm+tcp (4 ranks, 2 hosts: node0 ranks 0-1, node1 ranks 2-3)" in err0
    # The same program and modeled cluster on one host, all in shared memory: same results, same clocks.
    one = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.cli",
            "-n",
            "4",
            "--topology",
            "2x2p-roce",
            str(JOB),
            "--out",
            str(tmp_path / "one"),
        ],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert one.returncode == 0, one.stderr
    assert "[0] hccl-py: transport shm (4 ranks, 1 host)" in one.stderr
    assert _results(tmp_path / "two", 4) == _results(tmp_path / "one", 4)


@pytest.mark.timeout(60)
def test_the_rank_table_gives_each_node_its_server(tmp_path: Path) -> None:
    doc = RankTable.generate(Topology.preset("2x2p-roce")).to_dict()
    # server 0 holds ranks 0-1 on devices 0 and 3, server 1 ranks 2-3 on devices 2 and 1
    doc["server_list"][0]["device"] = [
        {"device_id": "0", "device_ip": "172.16.0.1", "rank_id": "0"},
        {"device_id": "3", "device_ip": "172.19.0.1", "rank_id": "1"},
    ]
    doc["server_list"][1]["device"] = [
        {"device_id": "2", "device_ip": "172.18.0.2", "rank_id": "2"},
        {"device_id": "1", "device_ip": "172.17.0.2", "rank_id": "3"},
    ]
    table = tmp_path / "table.json"
    table.write_text(json.dumps(doc))
    (c0, out0, err0), (c1, out1, err1) = _two_nodes(2, "--rank-table", str(table), str(SCRIPTS / "print_env.py"))
    assert c0 == 0 and c1 == 0, err0 + err1
    assert "node 1 of 2: ranks 2-3 of 4, modeled server 1 of rank table" in err1

    def env_of(out: str) -> dict[int, dict[str, str]]:
        ranks: dict[int, dict[str, str]] = {}
        for line in out.splitlines():
            m = re.fullmatch(r"\[(\d+)\] (\w+)=(.*)", line)
            if m:
                ranks.setdefault(int(m[1]), {})[m[2]] = m[3]
        return ranks

    node0, node1 = env_of(out0), env_of(out1)
    assert sorted(node0) == [0, 1] and sorted(node1) == [2, 3]
    got = {
        r: (e["RANK_ID"], e["DEVICE_ID"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["WORLD_SIZE"])
        for r, e in {**node0, **node1}.items()
    }
    assert got == {
        0: ("0", "0", "0", "2", "4"),
        1: ("1", "3", "1", "2", "4"),
        2: ("2", "2", "0", "2", "4"),
        3: ("3", "1", "1", "2", "4"),
    }
    assert len({e["HCCL_PY_JOB_ID"] for e in {**node0, **node1}.values()}) == 1  # one job
    # torch's env:// rendezvous: one MASTER_PORT on every node (node 0's choice), not the store's
    torch_ports = {e["MASTER_PORT"] for e in {**node0, **node1}.values()}
    assert len(torch_ports) == 1 and torch_ports != {e["HCCL_PY_STORE_PORT"] for e in node0.values()}


@pytest.mark.timeout(90)
def test_a_crash_on_one_node_fails_the_other_node_fast(tmp_path: Path) -> None:
    # HCCL_EXEC_TIMEOUT (600 s) is far beyond the launchers' bound (60 s): node 0 passes only by
    # learning of the crash from the dropped TCP connections.
    (c0, _, err0), (c1, _, err1) = _two_nodes(
        2,
        str(JOB),
        "--out",
        str(tmp_path),
        HCCL_EXEC_TIMEOUT="600",
        env1={"HCCL_PY_FAULTS": "rank=3,action=crash,at=allreduce#2"},
    )
    assert c1 != 0 and "injected crash" in err1, err1
    assert c0 != 0 and "HcclRemoteError" in err0, err0


@pytest.mark.timeout(60)
def test_a_node_without_node_0_gives_up_within_the_connect_timeout() -> None:
    proc = _launch(
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-port",
        str(_free_port()),
        "-n",
        "1",
        str(SCRIPTS / "print_env.py"),
        HCCL_CONNECT_TIMEOUT="1",
    )
    _, err = proc.communicate(timeout=40)
    assert proc.returncode == 1, err
    assert "node 1: no job from node 0 at 127.0.0.1:" in err and "--node-rank 0" in err


def test_multinode_options_are_checked() -> None:
    script = str(SCRIPTS / "print_env.py")
    cfg = parse_args(["--nnodes", "2", "--node-rank", "1", "--master-port", "29500", "-n", "4", script])
    assert (cfg.world_size, cfg.node_ranks()[0], cfg.default_topology()) == (8, (4, 0), "2x4p-roce")
    for bad in (
        ["--nnodes", "2", "-n", "2", script],  # no --master-port: node 1 could not find node 0
        ["--nnodes", "2", "--node-rank", "2", "--master-port", "29500", "-n", "2", script],
    ):
        with pytest.raises(SystemExit) as exit_:
            parse_args(bad)
        assert exit_.value.code == 2
