"""Single-process data parallelism over npu cards (``hccl_py/torch/nn_parallel.py``):
``nn.DataParallel`` and ``torch.nn.parallel.comm`` on npu tensors, as torch_npu serves them on an
Ascend host (torch's CPU build has no ``torch._C._broadcast_coalesced``, ``_scatter``, ``_gather``:
``nn.DataParallel`` over npu cards failed with an AttributeError). Each check is a script run under
``hccl-npu --devices 2`` in a child process.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tests.hccl_py.torch.test_npu_device_gaps import _run  # noqa: E402

_DATA_PARALLEL = r"""
import copy
import torch.nn as nn
from torch.nn.parallel import comm
import torch.nn.parallel as dp

torch.manual_seed(0)
# nn.DataParallel over both cards: the output and the gradients are the one-card module's
fc = nn.Linear(10, 5).to("npu:0")
ref = copy.deepcopy(fc)
x = torch.randn(20, 10, device="npu:0")
out = nn.DataParallel(fc, device_ids=[0, 1])(x)
assert out.device == torch.device("npu:0") and out.shape == (20, 5)
expected = ref(x)
assert torch.allclose(out.cpu(), expected.cpu(), atol=1e-6)
out.square().sum().backward(); expected.square().sum().backward()
assert torch.allclose(fc.weight.grad.cpu(), ref.weight.grad.cpu(), atol=1e-5)
replicas = dp.replicate(fc, [0, 1])
assert replicas[1].weight.device == torch.device("npu:1") and torch.equal(replicas[1].weight.cpu(), fc.weight.cpu())

# broadcast: on its own card the tensor itself, elsewhere a copy
t = torch.arange(6.0, device="npu:0").view(2, 3)
b0, b1 = comm.broadcast(t, [0, 1])
assert b0 is t and b1.device == torch.device("npu:1") and torch.equal(b1.cpu(), t.cpu())
h0, h1 = comm.broadcast(t.cpu(), [0, 1])  # from host memory: copies on both cards
assert (h0.device.index, h1.device.index) == (0, 1) and torch.equal(h0.cpu(), t.cpu())
outs = [torch.empty(2, 3, device="npu:1"), torch.empty(2, 3, device="npu:0")]
assert list(comm.broadcast(t, out=outs)) == outs and torch.equal(outs[0].cpu(), t.cpu())
u = torch.ones(4, device="npu:0")
first, second = comm.broadcast_coalesced([t, u], [0, 1])
assert first[0] is t and first[1] is u
assert [s.device.index for s in second] == [1, 1] and torch.equal(second[0].cpu(), t.cpu())
try:
    comm.broadcast_coalesced([t, u.to("npu:1")], [0, 1])
except RuntimeError as err:
    assert "devices[0]" in str(err), err
else:
    raise SystemExit("broadcast_coalesced took a tensor off devices[0]")

# scatter: chunks on their cards (a view where the chunk is already there), from host memory too
big = torch.arange(24.0, device="npu:0").view(6, 4)
c0, c1 = comm.scatter(big, [0, 1], dim=0)
assert c0.data_ptr() == big.data_ptr() and c1.device.index == 1 and torch.equal(c1.cpu(), big[3:].cpu())
s0, s1 = comm.scatter(big, [1, 0], chunk_sizes=[1, 3], dim=1)
assert s0.device.index == 1 and torch.equal(s0.cpu(), big[:, :1].cpu()) and s1.shape == (6, 3)
streams = [torch.npu.Stream(0), torch.npu.Stream(1)]
h0, h1 = comm.scatter(big.cpu(), [0, 1], streams=streams)
assert (h0.device.index, h1.device.index) == (0, 1) and torch.equal(h1.cpu(), big[3:].cpu())
dst = [torch.empty(2, 4, device="npu:1"), torch.empty(4, 4, device="npu:0")]
comm.scatter(big, out=dst)
assert torch.equal(dst[0].cpu(), big[:2].cpu()) and torch.equal(dst[1].cpu(), big[2:].cpu())
h0, h1 = comm.scatter(big.cpu(), [0, 1], streams=[torch.npu.Stream(0)])  # fewer streams than cards
assert torch.equal(h0.cpu(), big[:3].cpu()) and torch.equal(h1.cpu(), big[3:].cpu())
# refused as torch refuses them, never scattered along another dim or onto another card's stream
refusals = {
    "dim -3 of a 2-d tensor": (lambda: comm.scatter(big, [0, 1], dim=-3), IndexError, "Dimension out of range"),
    "dim 2 of a 2-d tensor": (lambda: comm.scatter(big, out=dst, dim=2), IndexError, "Dimension out of range"),
    "no output": (lambda: comm.scatter(big, out=[]), RuntimeError, "at least one output tensor"),
    "a stream of card 1 at index 0": (
        lambda: comm.scatter(big.cpu(), [0, 1], streams=[torch.npu.Stream(1), None]),
        RuntimeError,
        "the stream at index 0 (was 1)",
    ),
}
for name, (call, kind, text) in refusals.items():
    try:
        call()
    except kind as err:
        assert text in str(err), (name, err)
    else:
        raise SystemExit(f"scatter served {name}")

# gather: to a card, to host memory (-1), into out=
parts = [torch.ones(2, 3, device="npu:0"), torch.zeros(1, 3, device="npu:1")]
g = comm.gather(parts, dim=0, destination=1)
assert g.device == torch.device("npu:1") and g.tolist() == [[1.0] * 3] * 2 + [[0.0] * 3]
assert comm.gather(parts, 0, destination="cpu").device.type == "cpu"
out = torch.empty(3, 3)
assert comm.gather(parts, out=out) is out and out.sum().item() == 6.0
for bad, text in (([torch.ones(2, 3, device="npu:0"), torch.ones(2, 4, device="npu:1")], "invalid shape"),
                  ([torch.ones(2, 3, device="npu:0"), torch.ones(2, 3)], "npu tensors")):
    try:
        comm.gather(bad, dim=0, destination=0)
    except RuntimeError as err:
        assert text in str(err), err
    else:
        raise SystemExit(f"gather took {[t.device for t in bad]}")
"""


@pytest.mark.timeout(120)
def test_data_parallel_and_nn_parallel_comm_run_over_npu_cards(tmp_path):
    _run(tmp_path, _DATA_PARALLEL)
