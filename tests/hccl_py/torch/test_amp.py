"""Mixed precision on the npu device (``hccl_py/torch/amp``, the device's ``AutocastPrivateUse1``
kernels in csrc/amp.h): ``torch_npu.npu.amp.autocast`` and ``torch.autocast("npu")`` cast
as torch casts for its accelerators (without the device's kernels every op stayed float32), and
``GradScaler`` runs on npu gradients. A script under ``hccl-npu --devices 2`` in a child process.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tests.hccl_py.torch.test_npu_device_gaps import _run  # noqa: E402

_AUTOCAST = r"""
import torch.nn.functional as F
from torch_npu.npu.amp.autocast_mode import autocast
from torch_npu.npu.amp import GradScaler

assert torch.npu.amp.autocast is autocast
assert torch.npu.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
assert torch.get_autocast_dtype("npu") == torch.float16
torch.manual_seed(0)
lin = torch.nn.Linear(8, 8).to("npu:1")
x = torch.randn(8, 8, device="npu:1")
with autocast():
    assert torch.is_autocast_enabled("npu")
    y = lin(x)                                    # lower precision: matmul family, linear
    assert y.dtype == torch.float16 and (x @ x).dtype == torch.float16
    assert F.mse_loss(y, torch.zeros_like(y)).dtype == torch.float32      # fp32: losses
    assert torch.softmax(y, 0).dtype == torch.float32 and y.exp().dtype == torch.float32
    assert torch.addcmul(x.half(), x, x).dtype == torch.float32            # promote: the widest input
    with autocast(enabled=False):
        assert lin(x).dtype == torch.float32
# the float16 result is the float16 computation's, not another
assert torch.equal(y.cpu(), F.linear(x.cpu().half(), lin.weight.cpu().half(), lin.bias.cpu().half()))
with torch.autocast("npu", dtype=torch.bfloat16):
    assert lin(x).dtype == torch.bfloat16
assert lin(x).dtype == torch.float32

@autocast()
def forward(inp):
    return lin(inp)
assert forward(x).dtype == torch.float16

# GradScaler: scaled loss, unscaled npu gradients, a step skipped on an infinity
scaler = GradScaler(init_scale=1024.0)
opt = torch.optim.SGD(lin.parameters(), lr=0.1)
with autocast():
    loss = lin(x).float().square().mean()
scaler.scale(loss).backward()
grad = lin.weight.grad.clone()
scaler.unscale_(opt)
assert torch.allclose(lin.weight.grad.cpu(), grad.cpu() / 1024.0)
scaler.step(opt); scaler.update()
assert scaler.get_scale() == 1024.0
opt.zero_grad()
lin.weight.grad = torch.full_like(lin.weight, float("inf")); lin.bias.grad = torch.zeros_like(lin.bias)
before = lin.weight.detach().clone()
scaler.step(opt); scaler.update()
assert torch.equal(lin.weight.detach().cpu(), before.cpu()) and scaler.get_scale() == 512.0
"""


@pytest.mark.timeout(120)
def test_autocast_on_npu_casts_as_torch_does_and_the_grad_scaler_runs(tmp_path):
    _run(tmp_path, _AUTOCAST)
