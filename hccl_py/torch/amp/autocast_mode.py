"""``torch_npu.npu.amp.autocast_mode``: ``autocast`` on the npu and the ``custom_fwd``/``custom_bwd``
decorators (see the package's doc)."""

from __future__ import annotations

import functools

import torch

__all__ = ["autocast", "custom_bwd", "custom_fwd"]


class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801  (torch_npu's name)
    """``torch.autocast("npu", ...)`` with float16 as the default lower precision, as a context
    manager or a decorator."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """``torch.amp.custom_fwd`` for the npu: a custom autograd Function's ``forward`` runs with
    the autocast state it was called in (or, with ``cast_inputs``, with autocast off and its
    floating npu inputs cast to that dtype)."""
    if fwd is None:
        return functools.partial(custom_fwd, cast_inputs=cast_inputs)
    return torch.amp.custom_fwd(fwd, device_type="npu", cast_inputs=cast_inputs)


def custom_bwd(bwd):
    """``torch.amp.custom_bwd`` for the npu: ``backward`` runs with the autocast state of the
    forward."""
    return torch.amp.custom_bwd(bwd, device_type="npu")
