"""Unmodified torch scripts on the "hccl" backend, as users start them.

Each workload script (``scripts/``) imports torch_npu when it can and then uses "hccl", else
gloo: run plainly under hccl-launch it runs on gloo (which also shows that torch's own env://
rendezvous works under hccl-launch), run under ``hccl-launch --npu`` it finds hccl-py's
torch_npu stand-in and runs on hccl-py. Both runs must give rank 0 the same results.
``examples/torch_infer.py`` runs under hccl-launch and under torchrun; the Ascend-style benchmark
``examples/npu_collective_bench.py`` through the stand-in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = Path(__file__).resolve().parent / "scripts"

pytestmark = pytest.mark.usefixtures("no_leaks")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"  # the same arithmetic order on both backends
    env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo on one host, whatever the host name resolves to
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    return env


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command[2:])} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def _launch(*args: str, timeout: float = 100) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "launch.cli", *args], timeout)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("script", ["dp_infer", "tp_mlp", "moe_dispatch"])
def test_script_on_hccl_matches_gloo(tmp_path, script):
    path = str(SCRIPTS / f"{script}.py")
    _launch("-n", "2", path, str(tmp_path / "gloo.pt"))
    _launch("--npu", "-n", "2", "--trace", str(tmp_path / "trace"), path, str(tmp_path / "hccl.pt"))
    trace = json.loads((tmp_path / "trace" / "trace.json").read_text())  # the torch calls, on the modeled timeline
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith(("allreduce", "alltoall", "allgather", "broadcast")) for n in names), sorted(names)[:20]
    gloo, hccl = torch.load(tmp_path / "gloo.pt"), torch.load(tmp_path / "hccl.pt")
    assert gloo.keys() == hccl.keys()
    for key, expected in gloo.items():
        got = hccl[key]
        if key == "backends":
            assert (expected, got) == (["gloo"], ["hccl"])
        elif isinstance(expected, torch.Tensor) and expected.is_floating_point():
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=lambda m: f"{script} {key}: {m}")
        elif isinstance(expected, torch.Tensor):
            assert torch.equal(got, expected), (script, key)
        else:
            assert got == expected, (script, key)
    if script == "tp_mlp":  # and the sharded block is the whole block
        torch.testing.assert_close(
            torch.stack([hccl["y"], hccl["y_sp"], hccl["y_async"]]), hccl["reference"], rtol=1e-4, atol=1e-3
        )
    if script == "moe_dispatch":
        torch.testing.assert_close(hccl["out"][0], hccl["reference0"], rtol=1e-5, atol=1e-6)


def _check_infer(stdout: str, n: int) -> None:
    for rank in range(n):  # torchrun does not keep the ranks' lines apart: look for each
        assert f"rank {rank}/{n}: 2 steps, max |error|" in stdout, stdout
    assert "output matches the whole model on every rank" in stdout


@pytest.mark.timeout(150)
def test_torch_infer_under_hccl_launch():
    done = _launch("-n", "4", "examples/torch_infer.py", "--steps", "2", timeout=120)
    _check_infer(done.stdout, 4)
    assert "modeled" in done.stdout


@pytest.mark.timeout(150)
def test_torch_infer_under_torchrun():
    done = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "4",
            "examples/torch_infer.py",
            "--steps",
            "2",
        ],
        timeout=120,
    )
    _check_infer(done.stdout, 4)


@pytest.mark.timeout(120)
def test_ascend_style_benchmark_through_the_npu_standin(tmp_path):
    out = tmp_path / "rows.json"
    done = _launch(
        "--npu",
        "-n",
        "2",
        "--topology",
        "ascend910b-8p",
        "examples/npu_collective_bench.py",
        "--op",
        "all_gather",
        "--sizes",
        "4K,1M",
        "--iters",
        "2",
        "--json",
        str(out),
    )
    assert "(Ascend910B3)" in done.stdout  # get_device_name(): the modeled card
    rows = json.loads(out.read_text())["rows"]
    assert [r["bytes"] for r in rows] == [4096, 1 << 20]
    # events read the modeled card: a bigger message takes longer; 1 MiB is bandwidth-bound, so its
    # bus bandwidth is near the modeled link's (HCCS on the 910B preset: tens of GB/s, far from
    # anything this CPU emulation moves per wall second)
    assert 0 < rows[0]["time_us"] < rows[1]["time_us"]
    assert rows[1]["busbw_GBps"] > 10
