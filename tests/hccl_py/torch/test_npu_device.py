"""The npu device (``hccl_py/torch/device.py``, ``npu.py``) and ``hccl-npu`` (``launch/npu.py``).

Programs written for Ascend run as they are: the device API in one process (a child: installing
the device renames torch's private-use backend for good), HCCL's sample shape (mp.spawn over the
cards), DDP under torchrun against the same training in one process on the CPU, and Ascend's rules and
extensions of the collectives (``scripts/npu_ascend_ops.py``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hccl_py.errors import HcclNotSupportedError, HcclParamError  # noqa: E402
from launch import npu as hccl_npu  # noqa: E402
from tests.mp import free_port, run_command  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "HCCL_PY_STORE_PORT",
            "HCCL_PY_NPU_DEVICES",
            "HCCL_PY_NPU_STRICT",
            "TORCH_DEVICE_BACKEND_AUTOLOAD",
            "TORCHELASTIC_USE_AGENT_STORE",
        )
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"  # the same arithmetic order on both backends
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env.update(extra)
    return env


def _hccl_npu(*args: str, timeout: float = 150, cwd: Path = ROOT, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_command([sys.executable, "-m", "launch.npu", *args], env=_env(**extra), cwd=cwd, timeout=timeout)


def _runs_ok(path: Path, script: str, *, devices: int) -> subprocess.CompletedProcess[str]:
    """``script`` run as ``path`` under ``hccl-npu --devices N`` ends cleanly with "OK"."""
    path.write_text(script)
    done = _hccl_npu("--devices", str(devices), sys.executable, str(path), timeout=110)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stdout[-2000:] + done.stderr[-3000:]
    return done


def _torchrun(n: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(n),
        "--master-port",
        str(free_port()),
    ]


def _torchrun_on_two_cards(script: str, *args, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``hccl-npu --devices 2 torchrun --nproc-per-node 2 script args...``"""
    return _hccl_npu("--devices", "2", *_torchrun(2), script, *map(str, args), cwd=cwd, timeout=timeout)


# -- the device in one process ----------------------------------------------------------------------------
_PROBE = r"""
import os, torch, torch.distributed as dist
assert hasattr(torch, "npu"), "autoload: torch.npu without importing torch_npu"
import torch_npu
assert torch.npu.device_count() == 3 and torch.npu.is_available()
assert str(torch.accelerator.current_accelerator()) == "npu" and torch.accelerator.device_count() == 3
assert torch.version.cann and torch_npu.__version__.startswith("2.13")
for how in (1, "npu:1", torch.device("npu:1")):
    torch.npu.set_device(0); torch.npu.set_device(how); assert torch.npu.current_device() == 1, how
x = torch.ones(4, device="npu")
assert x.device == torch.device("npu:1") and x.is_npu and x.npu() is x and x.cpu().tolist() == [1.0] * 4

# autograd on a card above 0 (the device guard reports the cards to autograd's engine)
torch.manual_seed(0)
lin = torch.nn.Linear(3, 2)
ref_in = torch.randn(5, 3)
ref = lin(ref_in).square().sum(); ref.backward(); ref_grad = lin.weight.grad.clone(); lin.weight.grad = None
lin_npu = torch.nn.Linear(3, 2).to("npu:2"); lin_npu.load_state_dict(lin.state_dict())
out = lin_npu(ref_in.to("npu:2")).square().sum(); out.backward()
assert lin_npu.weight.grad.device == torch.device("npu:2")
assert torch.allclose(lin_npu.weight.grad.cpu(), ref_grad), (lin_npu.weight.grad, ref_grad)
assert torch.nn.Linear(2, 2).to(0).weight.device == torch.device("npu:0")  # an int: the accelerator's card

# views share the card's bytes; out= and in-place ops write them
v = x.view(2, 2); v[0, 0] = 7.0; assert x[0].item() == 7.0
y = torch.empty(0, device="npu:1"); torch.add(x, x, out=y); assert y.cpu().tolist() == [14.0, 2.0, 2.0, 2.0]

# random numbers: seeded like the CPU's, and manual_seed does not recurse through transfer_to_npu
from torch_npu.contrib import transfer_to_npu
assert torch.cuda is torch.npu and torch.cuda.is_available()
torch.manual_seed(3); a = torch.randn(4, device="cuda"); torch.manual_seed(3); b = torch.randn(4)
assert a.device.type == "npu" and torch.equal(a.cpu(), b)
assert torch.zeros(2).cuda().device.type == "npu" and torch.ones(1).to("cuda:2").device == torch.device("npu:2")

# memory: the card's HBM pool, 512-byte blocks, torch's OutOfMemoryError past it
torch.npu.set_device(2); torch.npu.reset_peak_memory_stats()
# streams: a negative index or a float means the current card (torch.cuda.Stream's rule, Ascend's test_with_device)
assert [torch.npu.Stream(d).device_index for d in (-1, -258, -0.2, 1, "npu:0")] == [2, 2, 2, 1, 0]
before = torch.npu.memory_allocated()
z = torch.empty(1000, dtype=torch.uint8, device="npu")
assert torch.npu.memory_allocated() - before == 1024, torch.npu.memory_allocated() - before
assert torch.npu.memory_reserved() >= torch.npu.memory_allocated() and torch.npu.max_memory_allocated() >= 1024
free, total = torch.npu.mem_get_info()
assert total == torch.npu.get_device_properties().total_memory > 0 and 0 < free <= total
del z
assert torch.npu.memory_allocated() == before
try:
    torch.empty(total // 4 + 1, dtype=torch.float32, device="npu")
    raise SystemExit("no OOM past the card's HBM")
except torch.OutOfMemoryError as err:
    text = str(err)
    assert "NPU out of memory. Tried to allocate" in text and f"requested_bytes={total + 4}" in text, text
    assert "reserved_bytes=" in text and "free_bytes=" in text, text
assert torch.npu.memory_stats()["num_ooms"] == 1

# formats travel with the tensor
nz = torch_npu.npu_format_cast(x, 29)
assert torch_npu.get_npu_format(nz) == 29 and torch_npu.get_npu_format(x) == 2 and torch.equal(nz.cpu(), x.cpu())

# the hccl backend: chosen for npu tensors by init_process_group() without a backend; events time the card
dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)
t = torch.full((3,), 2.0, device="npu"); dist.all_reduce(t); assert t.cpu().tolist() == [2.0] * 3
import hccl_py.torch
card = hccl_py.torch.communicator().device
start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
start.record(); took = card.run(1e12, 0.0); end.record(); end.synchronize(); torch.npu.synchronize()
ms = start.elapsed_time(end)
assert ms > 0 and abs(ms - took * 1e3) < 1e-9, (ms, took)
# torch_npu's Event: npu_event (its aclrtEvent) 0 until recorded; elapsed_time with torch's own events
fresh, plain = torch.npu.Event(enable_timing=True), torch.Event(device="npu", enable_timing=True)
assert fresh.npu_event == 0 and start.npu_event != 0 and isinstance(plain, torch.npu.Event)
fresh.record(); card.run(1e12, 0.0); plain.record()
assert abs(fresh.elapsed_time(plain) - took * 1e3) < 1e-9 and abs(start.elapsed_time(fresh) - ms) < 1e-9
try:
    torch.npu.Event().elapsed_time(end)
    raise SystemExit("elapsed_time of an event without timing")
except ValueError as err:
    assert "enable_timing=True" in str(err), err
# torch ops on npu tensors charge the card's modeled compute, as hccl-py's own device ops do
from hccl_py.modeled.cost_model import cube_flops
a, b = torch.randn(64, 128, device="npu"), torch.randn(128, 32, device="npu")
torch.npu.synchronize()
start.record(); c = a @ b; end.record()
expected = card.kernel_time_s(cube_flops(64, 32, 128), (64 * 128 + 128 * 32 + 64 * 32) * 4, "float32") * 1e3
assert abs(start.elapsed_time(end) - expected) < 1e-9, (start.elapsed_time(end), expected)
# a compute benchmark written in torch, measured as limulidae's bench_flops.py measures (events
# around torch.mm(A, B, out=C), the fastest timed run, 2mnk flops) lands on the fidelity table's rows
from hccl_py.planning.fidelity import load_table, predict
rows = {row["id"]: row for row in load_table()}
for n, row_id in ((1024, "tptd-910b2-fp32-1024"), (2048, "tptd-910b2-fp32-2048")):
    A, B, C = torch.randn(n, n, device="npu"), torch.randn(n, n, device="npu"), torch.empty(n, n, device="npu")
    runs = []
    for _ in range(3):  # one warm-up, two timed
        start.record(); torch.mm(A, B, out=C); end.record(); torch.npu.synchronize(); runs.append(start.elapsed_time(end))
    tflops = 2 * n**3 / (min(runs[1:]) / 1e3) / 1e12
    row = rows[row_id]
    assert row["model"]["card"] == card.model.name and abs(tflops / predict(row)[0] - 1) < 1e-9, (tflops, row)
    assert abs(tflops / row["measured"]["tflops"] - 1) <= row["tolerance"], (tflops, row)
del A, B, C
start.record(); c.relu_(); d = c.sum(); end.record()
expected = (card.kernel_time_s(0, 64 * 32 * 4, "float32") + card.kernel_time_s(0, 64 * 32 * 4 + 4, "float32")) * 1e3
assert abs(start.elapsed_time(end) - expected) < 1e-9, (start.elapsed_time(end), expected)

# the pool's growth: a device synchronisation (the compute stream waits for the asynchronous calls
# issued so far), then the segment's allocation; a block the pool already holds costs nothing
def segments():
    return torch.npu.memory_stats()["segment.all.allocated"]
def timed(fn):
    start.record(); fn(); end.record()
    return start.elapsed_time(end)
alloc_ms = card.model.segment_alloc_s * 1e3
src, dst = torch.ones(1 << 20, device="npu"), torch.empty(1 << 20, device="npu")
torch.npu.synchronize()
comm_ms = timed(lambda: dist.all_gather_single(dst, src, async_op=True).wait())  # the call alone, joined
grown = segments()
pool = []
assert abs(timed(lambda: pool.append(torch.empty(16 << 20, device="npu"))) - alloc_ms) < 1e-9
assert segments() == grown + 1
pool.clear()
assert timed(lambda: pool.append(torch.empty(16 << 20, device="npu"))) == 0.0 and segments() == grown + 1
works = []
def grow_beside_a_call():
    works.append(dist.all_gather_single(dst, src, async_op=True))
    pool.append(torch.empty(40 << 20, device="npu"))
assert comm_ms > 0 and abs(timed(grow_beside_a_call) - (comm_ms + alloc_ms)) < 1e-9, (comm_ms, alloc_ms)
assert segments() == grown + 2
works.pop().wait()
pool.clear(); reserved = torch.npu.memory_reserved()
def empty_beside_a_call():  # empty_cache synchronises the card too
    works.append(dist.all_gather_single(dst, src, async_op=True))
    torch.npu.empty_cache()
assert abs(timed(empty_beside_a_call) - comm_ms) < 1e-9 and torch.npu.memory_reserved() < reserved
works.pop().wait()

# copies between host memory and the card cross the card's PCIe link: latency + bytes / bandwidth
from hccl_py.modeled.cost_model import host_copy_s
topology = hccl_py.torch.communicator().topology
route = topology.host_route(card.rank)
assert [topology.link(*hop).kind for hop in route.hops] == ["PCIE"]
copy_ms = host_copy_s(route, 64 << 20) * 1e3
assert abs(copy_ms - (route.latency_s + (64 << 20) / route.bandwidth_Bps) * 1e3) < 1e-12
host = torch.ones(16 << 20)  # 64 MiB
pool.append(torch.empty(16 << 20, device="npu")); pool.clear(); grown = segments()  # the pool holds the block
on_card, back = [], []
assert abs(timed(lambda: on_card.append(host.to("npu"))) - copy_ms) < 1e-9
assert abs(timed(lambda: back.append(on_card[0].cpu())) - copy_ms) < 1e-9 and torch.equal(back[0], host)
assert abs(timed(lambda: on_card[0].copy_(host, non_blocking=True)) - copy_ms) < 1e-9
assert abs(timed(lambda: back[0].copy_(on_card[0], non_blocking=True)) - copy_ms) < 1e-9
assert segments() == grown
assert torch.npu.get_device_name() == "Ascend910B3" and card.model.name == "ascend910b"  # hccl-npu: a 910B server

# pinned host memory (aclrtMallocHost): is_pinned() holds, views too (DDP's reducer asserts it)
pinned = torch.arange(4.0).pin_memory()
assert pinned.is_pinned() and pinned[1:].is_pinned() and not torch.ones(2).is_pinned()
assert torch.empty(0, pin_memory=True).is_pinned()
assert pinned.to("npu:1", non_blocking=True).cpu().tolist() == [0.0, 1.0, 2.0, 3.0]

# at exit, one backward on each card used frees autograd's worker threads' last graph tasks (a
# program whose last statement was backward() aborted at exit under load, about 1 run in 8)
from hccl_py.torch import device as npu_device
npu_device._drain_autograd_workers(npu_device.installed())
drained = npu_device._drain_leaves[0::3]
assert sorted(leaf.device.index for leaf in drained) == [0, 1, 2], drained
assert all(leaf.grad.item() == 1.0 for leaf in drained), [leaf.grad for leaf in drained]
dist.destroy_process_group()
print("OK")
"""


@pytest.mark.timeout(120)
def test_the_npu_device_in_one_process(tmp_path):
    _runs_ok(tmp_path / "probe.py", _PROBE, devices=3)


_KERNEL_LOG = r"""
# The kernel log as the card's clock reads it: entries of the extension's fields and kinds
import torch, torch_npu
from hccl_py.torch import device as npu_device

ext = npu_device.installed()
assert tuple(ext.ENTRY_FIELDS) == ("name", "m", "n", "k", "batch", "nbytes", "dtype", "kind"), ext.ENTRY_FIELDS
kinds = dict(ext.ENTRY_KINDS)
assert sorted(kinds.values()) == [0, 1, 2, 3] and set(kinds) == {"kernel", "segment", "host_to_device", "device_to_host"}
ext.drain_kernels()
a = torch.ones(64, 32).npu()                 # a segment grows, then a host-to-card copy
b = torch.ones(32, 16, device="npu")
c = a @ b                                    # the matmul family: m, n, k
host = c.cpu()                               # a card-to-host copy
entries = [dict(zip(ext.ENTRY_FIELDS, e)) for e in ext.drain_kernels()]
by_kind = {}
for e in entries:
    by_kind.setdefault(e["kind"], []).append(e)
assert by_kind[kinds["segment"]][0]["name"] == "aclrtMalloc", entries
assert by_kind[kinds["host_to_device"]][0]["nbytes"] == 64 * 32 * 4, entries
assert by_kind[kinds["device_to_host"]][0]["nbytes"] == 64 * 16 * 4, entries
mm = [e for e in by_kind[kinds["kernel"]] if e["m"]]
assert [(e["m"], e["n"], e["k"]) for e in mm] == [(64, 16, 32)], entries
assert torch.equal(host, torch.full((64, 16), 32.0))
print("OK")
"""


@pytest.mark.timeout(120)
def test_the_kernel_log_carries_the_extensions_fields_and_kinds(tmp_path):
    _runs_ok(tmp_path / "kernel_log.py", _KERNEL_LOG, devices=1)


_CUDA_FORMS = r"""
# CUDA code's device forms (pytorch/examples' tutorials and what they call), under transfer_to_npu
import torch_npu
from torch_npu.contrib import transfer_to_npu
import os, tempfile, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP
npu1 = torch.device("npu:1")
assert torch.device("cuda:1") == torch.device("cuda", 1) == torch.device(type="cuda", index=1) == npu1
assert isinstance(torch.device("cuda"), torch.device) and isinstance(npu1, torch.device) and torch.device("cuda").type == "npu"
for how in (torch.device("cuda:1"), "cuda:1", 1):
    torch.cuda.set_device(0); torch.cuda.set_device(how); assert torch.cuda.current_device() == 1, how
torch.cuda.set_device(0)
with torch.cuda.device("cuda:1"):
    assert torch.cuda.current_device() == 1
assert torch.cuda.current_device() == 0
with torch.device("cuda:1"):
    assert torch.zeros(2).device == npu1
for made in (torch.rand(2, device="cuda:1"), torch.ones(2, device=torch.device("cuda", 1)), torch.ones(2).to("cuda:1"),
             torch.ones(2).to(torch.device("cuda:1")), torch.ones(2).cuda(1), torch.zeros(1).new_ones(2, device="cuda:1"),
             torch.fft.fftfreq(4, device="cuda:1"), torch.nn.Linear(2, 2).to("cuda:1").weight):
    assert made.device == npu1, made
assert torch.nn.Linear(2, 2).cuda().weight.device == torch.device("npu:0")
# the npu's generator is the CPU's: a seeded "cuda" generator draws the CPU's numbers
g = torch.Generator(device="cuda"); g.manual_seed(5)
assert torch.equal(torch.rand(3, generator=g, device="cuda").cpu(), torch.rand(3, generator=torch.Generator().manual_seed(5)))
assert torch.Stream("cuda:1").device == npu1 and torch.Event("cuda").device.type == "npu"
assert torch.cuda.Stream(torch.device("cuda:1")).device_index == 1 and torch.cuda.Event(enable_timing=True) is not None
for autocast in (lambda: torch.autocast("cuda", dtype=torch.bfloat16), lambda: torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)):
    with autocast():
        assert torch.nn.Linear(2, 2).cuda()(torch.ones(1, 2, device="cuda")).dtype == torch.bfloat16
assert torch.cuda.get_device_properties("cuda:1").total_memory > 0 and torch.cuda.memory_allocated(torch.device("cuda:1")) >= 0
torch.cuda.synchronize("cuda:1")
assert torch.get_device_module("cuda") is torch.cuda is torch.npu
torch.set_default_device("cuda:1"); assert torch.zeros(1).device == npu1; torch.set_default_device(None)
snapshot = os.path.join(tempfile.mkdtemp(), "w.pt"); torch.save({"w": torch.ones(2)}, snapshot)
for where in ("cuda:1", torch.device("cuda:1"), {"cpu": "cuda:1"}):
    assert torch.load(snapshot, map_location=where)["w"].device == npu1, where
# "nccl" is "hccl"; device_id, DDP's device_ids and the mesh take cuda's forms
dist.init_process_group(backend="nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda:0"))
assert dist.get_backend() == "hccl" and dist.is_nccl_available()
t = torch.ones(2, device="cuda"); dist.all_reduce(t); assert t.cpu().tolist() == [1.0, 1.0]
ddp = DDP(torch.nn.Linear(2, 2).cuda(), device_ids=[0]); ddp(torch.ones(1, 2, device="cuda")).sum().backward()
assert ddp.module.weight.grad.device == torch.device("npu:0")
assert init_device_mesh("cuda", (1,)).device_type == "npu"
dist.destroy_process_group()
print("OK")
"""


@pytest.mark.timeout(120)
def test_cuda_codes_device_forms_land_on_the_cards_under_transfer_to_npu(tmp_path):
    _runs_ok(tmp_path / "cuda_forms.py", _CUDA_FORMS, devices=2)


# -- programs with several ranks ------------------------------------------------------------------------------
@pytest.mark.timeout(150)
@pytest.mark.usefixtures("no_leaks")
def test_an_hccl_style_sample_spawns_its_ranks_over_the_cards():
    done = _hccl_npu(
        "--devices", "3", sys.executable, str(SCRIPTS / "npu_spawn_allreduce.py"), str(free_port()), timeout=140
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(
        re.findall(r"\[Rank \d\] Output: tensor\(\[[^]]*\], device='npu:\d'\)", done.stdout)
    )  # ranks interleave
    assert "Available NPU count: 3" in done.stdout
    assert lines == [f"[Rank {r}] Output: tensor([0., 3., 6.], device='npu:{r}')" for r in range(3)], lines


def _ddp_reference(world: int) -> dict:
    """What npu_ddp.py computes, in one process on the CPU: DDP steps on the mean of the ranks'
    gradients, each rank on its own batches; the losses summed over the ranks, the final weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = []
    for rank in range(world):
        torch.manual_seed(1 + rank)
        data.append((torch.randn(5, 8, 16), torch.randint(0, 4, (5, 8))))
    totals = torch.zeros(5)
    for step in range(5):
        opt.zero_grad()
        losses = [torch.nn.functional.cross_entropy(model(xs[step]), ys[step]) for xs, ys in data]
        (sum(losses) / world).backward()
        opt.step()
        totals[step] = sum(loss.item() for loss in losses)
    return {"losses": totals, "weights": model.state_dict()}


@pytest.mark.timeout(200)
@pytest.mark.usefixtures("no_leaks")
def test_ddp_on_npu_under_torchrun_trains_as_one_process_on_the_cpu(tmp_path):
    npu = _torchrun_on_two_cards(str(SCRIPTS / "npu_ddp.py"), tmp_path / "npu.pt", cwd=tmp_path, timeout=100)
    assert npu.returncode == 0, npu.stderr[-3000:]
    expected, got = _ddp_reference(2), torch.load(tmp_path / "npu.pt")
    assert got["device"] == "npu:0"
    torch.testing.assert_close(got["losses"], expected["losses"])
    for name, weight in expected["weights"].items():
        torch.testing.assert_close(got["weights"][name], weight)


# -- hccl-npu itself -------------------------------------------------------------------------------------------
def test_hccl_npu_sets_the_host_and_refuses_bad_input():
    got = hccl_npu.npu_environment({"PYTHONPATH": f"/x{os.pathsep}{hccl_npu.NPU_STANDIN}"}, 4)
    assert got["PYTHONPATH"].split(os.pathsep) == [str(hccl_npu.NPU_STANDIN), "/x"]
    assert got["HCCL_PY_NPU_DEVICES"] == "4" and got["HCCL_PY_NPU_STRICT"] == "1"
    assert hccl_npu.main(["--devices", "0", "true"]) == 2
    assert hccl_npu.main(["--topology", "no-such-preset", "true"]) == 2
    with pytest.raises(SystemExit):
        hccl_npu.main([])


@pytest.mark.parametrize(
    "args, environ, said",
    [
        (["--devices", "16", "--topology", "ascend910b-8p"], {}, "has 8 cards; 16 were asked for"),
        ([], {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:inf"}, "bad value 'inf' for max_split_size_mb"),
        ([], {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:1e300"}, "bad value '1e300'"),
        ([], {"PYTORCH_NPU_ALLOC_CONF": "pinned:True"}, "unrecognized key 'pinned'"),
        ([], {"HCCL_EXEC_TIMEOUT": "soon"}, "HCCL_EXEC_TIMEOUT='soon' is not accepted"),
    ],
)
def test_hccl_npu_refuses_what_would_fail_every_import_before_it_starts_the_command(
    args, environ, said, monkeypatch, capsys, tmp_path
):
    """Exit 2 with the cause, and the command never runs (its `import torch` would fail in every
    process, the cause buried in a chained traceback)."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    ran = tmp_path / "ran"
    assert hccl_npu.main([*args, "touch", str(ran)]) == 2
    assert said in capsys.readouterr().err and not ran.exists()


def test_hccl_npu_says_what_to_install_without_torch(monkeypatch, capsys):
    monkeypatch.setattr(hccl_npu.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(HcclNotSupportedError, match=r"pip install 'hccl-py\[torch\]'"):
        hccl_npu.check_ready()
    from launch import cli

    assert cli.main(["--npu", "-n", "2", str(SCRIPTS / "npu_ddp.py")]) == 2  # torch ranks: before any starts
    assert capsys.readouterr().err.count("pip install 'hccl-py[torch]'") == 1
    # hccl-npu still serves HCCL's C API (a C program needs no torch), and says what torch needs
    monkeypatch.setattr(hccl_npu.os, "execvpe", lambda *args: (_ for _ in ()).throw(SystemExit(0)))
    with pytest.raises(SystemExit):
        hccl_npu.main(["--devices", "2", "true"])
    assert "pip install 'hccl-py[torch]'" in capsys.readouterr().err


def test_hccl_npu_refuses_beside_a_real_torch_npu(monkeypatch):
    class Real:
        version = "2.5.1"

        def locate_file(self, path):
            return "/opt/site-packages"

    monkeypatch.setattr(hccl_npu.importlib.metadata, "distribution", lambda name: Real())
    with pytest.raises(HcclNotSupportedError, match="real torch_npu is installed") as err:
        hccl_npu.check_ready()
    assert "2.5.1" in err.value.fields["holder"]


def test_the_entry_point_lives_only_on_the_hccl_npu_path():
    import importlib.metadata

    assert not [e for e in importlib.metadata.entry_points(group="torch.backends") if e.value.startswith("torch_npu")]
    assert hccl_npu.foreign_torch_npu() is None


# -- settings ----------------------------------------------------------------------------------------------------
def test_alloc_conf_keys_are_honoured_or_refused_by_name():
    from hccl_py import env

    def parse(text):
        return env.alloc_conf({env.PYTORCH_NPU_ALLOC_CONF: text})

    assert parse("max_split_size_mb:128, expandable_segments:True,garbage_collection_threshold:0.6") == {
        "max_split_size_mb": 128.0,
        "expandable_segments": True,
        "garbage_collection_threshold": 0.6,
    }
    assert parse("") == {}
    with pytest.raises(HcclParamError, match="unrecognized key 'roundup_power2_divisions'") as err:
        parse("roundup_power2_divisions:4")
    assert err.value.code == 1
    bad_values = ("expandable_segments:yes", "max_split_size_mb:10", "garbage_collection_threshold:1.5")
    for bad in (*bad_values, "max_split_size_mb:inf", "max_split_size_mb:nan", "max_split_size_mb:1e300"):
        with pytest.raises(HcclParamError, match="bad value"):
            parse(bad)


def test_device_checked_ops_are_torchs_own(tmp_path):
    """The ops that refuse tensors on two devices: native_functions.yaml's functions without
    device_check: NoCheck, named as torch's generated wrappers are (structured ones without their
    overload, out= functions with "_out")."""
    from hccl_py.torch import device

    yaml = tmp_path / "native_functions.yaml"
    yaml.write_text(
        "- func: mm(Tensor self, Tensor mat2) -> Tensor\n  structured_delegate: mm.out\n  variants: function\n\n"
        "- func: mm.out(Tensor self, Tensor mat2, *, Tensor(a!) out) -> Tensor(a!)\n  structured: True\n\n"
        "- func: add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor\n"
        "  device_check: NoCheck   # TensorIterator\n  structured_delegate: add.out\n\n"
        "- func: index_select(Tensor self, int dim, Tensor index) -> Tensor\n  dispatch:\n    CPU: index_select_cpu_\n"
    )
    assert device.device_checked_ops(yaml) == {
        "aten::mm": "wrapper_PrivateUse1_mm",
        "aten::mm.out": "wrapper_PrivateUse1_mm_out_out",
        "aten::index_select": "wrapper_PrivateUse1__index_select",
    }
    installed = device.device_checked_ops()  # the installed torch's yaml
    assert installed["aten::mm"] == "wrapper_PrivateUse1_mm" and installed["aten::cat"] == "wrapper_PrivateUse1_cat"
    assert (
        "aten::add.Tensor" not in installed and "aten::copy_" not in installed and "aten::index.Tensor" not in installed
    )


def test_checkouts_of_one_source_share_one_build(tmp_path, monkeypatch):
    """The extension compiles from a copy of its source in the cache folder, so a clone beside a
    working tree (same source) loads the same build instead of rebuilding it from its own path."""
    from torch.utils import cpp_extension

    from hccl_py.torch import device

    monkeypatch.setenv("HCCL_PY_CACHE", str(tmp_path / "cache"))
    built = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: built.append(kw["sources"]) or "loaded")
    clone = tmp_path / "clone" / "npu_device.cpp"
    clone.parent.mkdir()
    for part in device.sources():
        (clone.parent / part.name).write_bytes(part.read_bytes())
    assert device.build() == "loaded"
    monkeypatch.setattr(device, "SOURCE", clone)
    assert device.build() == "loaded"
    assert built[0] == built[1] == [str(device.cache_dir() / "npu_device.cpp")]
    assert (device.cache_dir() / "npu_device.cpp").read_bytes() == clone.read_bytes()
    assert sorted(p.name for p in device.sources()) == sorted(
        p.name for p in device.cache_dir().iterdir() if p.suffix in (".cpp", ".h")
    )


def test_another_torch_is_refused_naming_the_supported_one():
    from hccl_py.torch import device

    device.check_torch("2.13.1+cpu")
    with pytest.raises(HcclNotSupportedError, match=r"supports torch 2\.13\.x.*this is torch 2\.12\.0"):
        device.check_torch("2.12.0")


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
def test_torch_npus_rules_and_extensions_of_the_collectives(tmp_path):
    done = _torchrun_on_two_cards(str(SCRIPTS / "npu_ascend_ops.py"), cwd=tmp_path, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(re.findall(r"OK \d", done.stdout)) == ["OK 0", "OK 1"], done.stdout


@pytest.mark.timeout(90)
def test_torch_npu_testing_helpers_run_an_ascend_style_unittest_file():
    done = _hccl_npu("--devices", "2", sys.executable, str(SCRIPTS / "npu_testing_helpers.py"), "-v", timeout=80)
    assert done.returncode == 0, done.stderr[-3000:]
    report = done.stderr
    assert "Ran 11 tests" in report and "OK (skipped=3)" in report, report
    assert "test_path_manager (__main__.HelpersTest.test_path_manager) ... ok" in report, report
    assert "Multi-NPU 65 condition not satisfied" in report and "current device is Ascend910B." in report, report
    assert "Only run on 99.0.0 or greater, current cann version is 9.2.0." in report, report


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
def test_a_script_that_spawns_its_ranks_is_refused_under_hccl_launch():
    done = run_command(
        [
            sys.executable,
            "-m",
            "launch.cli",
            "--npu",
            "-n",
            "2",
            str(SCRIPTS / "npu_spawns_its_ranks.py"),
            str(free_port()),
        ],
        env=_env(),
        cwd=ROOT,
        timeout=110,
    )
    assert done.returncode != 0
    assert "hccl-npu --devices N python SCRIPT" in done.stdout + done.stderr, done.stderr[-3000:]
    assert "EADDRINUSE" not in done.stdout + done.stderr and "Address already in use" not in done.stderr


def _reference_losses(world: int) -> dict[str, list[list[float]]]:
    """The losses of npu_fsdp_tp.py computed in one process on the CPU: FSDP2 trains on the mean
    of the ranks' gradients (its reduce-scatter averages); tensor parallel is the plain model."""
    import torch.nn as nn

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    out = {}
    for kind in ("fsdp2", "tp"):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        per_rank = [[] for _ in range(world)]
        for step in range(3):
            total = 0
            for r in range(world):
                torch.manual_seed(100 + step + (r if kind == "fsdp2" else 0))
                loss = model(torch.randn(8, 16)).pow(2).mean()
                per_rank[r].append(loss.item())
                total = total + loss / (world if kind == "fsdp2" else 1)
                if kind == "tp":
                    break
            total.backward()
            opt.step()
            opt.zero_grad()
        out[kind] = per_rank if kind == "fsdp2" else [per_rank[0]] * world
    return out


@pytest.mark.timeout(200)
@pytest.mark.usefixtures("no_leaks")
def test_fsdp2_and_tensor_parallel_on_npu_train_as_one_process_does(tmp_path):
    done = _torchrun_on_two_cards(str(SCRIPTS / "npu_fsdp_tp.py"), tmp_path / "losses", cwd=tmp_path, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    got = [json.loads((tmp_path / f"losses.{r}.json").read_text()) for r in range(2)]
    expected = _reference_losses(2)
    for kind in ("fsdp2", "tp"):
        for r in range(2):
            torch.testing.assert_close(got[r][kind], expected[kind][r], rtol=1e-5, atol=1e-7)


def test_the_extension_is_never_loaded_from_a_cache_another_user_can_change(tmp_path, monkeypatch):
    """The build refuses, before any compile or load, a cache folder writable by others (another
    user could swap the compiled extension), and its lock is never a symlink's target."""
    from hccl_py.errors import HcclSyscallError
    from hccl_py.torch import device

    open_to_all = tmp_path / "cache"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    monkeypatch.setenv("HCCL_PY_CACHE", str(open_to_all))
    with pytest.raises(HcclSyscallError, match="writable by other users"):
        device.build()
    assert list(open_to_all.iterdir()) == []  # nothing built, nothing locked
    open_to_all.chmod(0o700)
    where = device.cache_dir()
    where.mkdir(mode=0o700)
    (where / "hccl-py.lock").symlink_to(tmp_path / "victim")
    with pytest.raises(OSError):
        device.build()
    assert not (tmp_path / "victim").exists()
