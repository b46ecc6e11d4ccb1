"""``torch.npu.amp`` (torch_npu's ``torch_npu.npu.amp``): mixed precision on the npu device.

- ``autocast(enabled=True, dtype=torch.float16, cache_enabled=True)``: ``torch.autocast("npu")``,
  whose default lower precision is float16 as on Ascend; inside it the npu device casts as torch
  casts for its accelerators (matmuls, convolutions and linear layers in the lower precision,
  losses, norms and reductions in float32, mixed inputs promoted: torch's own op lists, which the
  device registers under ``AutocastPrivateUse1``, csrc/amp.h);
- ``custom_fwd``/``custom_bwd``: torch's, for the npu;
- ``GradScaler``: ``torch.amp.GradScaler("npu")``.
"""

from .autocast_mode import autocast, custom_bwd, custom_fwd
from .grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]
