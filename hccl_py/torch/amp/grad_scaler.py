"""``torch_npu.npu.amp.GradScaler``: torch's gradient scaler on the npu."""

from __future__ import annotations

import torch

__all__ = ["GradScaler"]


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("npu", ...)``: scales the loss, unscales the npu gradients and skips
    steps with infinities or NaNs, adjusting the scale as torch's does."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        super().__init__("npu", init_scale, growth_factor, backoff_factor, growth_interval, enabled)
