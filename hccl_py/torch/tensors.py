"""Tensors as the numpy arrays hccl-py's communicator takes, without copies where possible.

A contiguous CPU tensor and its array share memory (``t.numpy()``), and so does an npu tensor
(its bytes are host memory: the array is a view of the same bytes, ``device.as_cpu``); bfloat16 goes through a view
of the same bytes as int16, then ml_dtypes' bfloat16 (numpy has no bfloat16 of its own); bool
travels as uint8. A non-contiguous tensor is staged: the collective runs on a contiguous copy,
which is copied back into the tensor afterwards (:class:`Staged`)::

    a = as_array(t)                  # same memory as t
    s = Staged(t_strided); comm.all_reduce(s.array); s.copy_back()
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from .. import env
from ..dtypes import bfloat16 as _BF16
from ..errors import HcclParamError
from . import device as _device
from . import formats

# Element types that map one-to-one: t.numpy() shares the tensor's memory.
_PLAIN = frozenset(
    {torch.float32, torch.float16, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}
)
# Element types seen through another of the same width: (torch view type, numpy view type or None).
_VIEWED = {torch.bfloat16: (torch.int16, _BF16), torch.bool: (torch.uint8, None)}
SUPPORTED = ", ".join(sorted(str(d).removeprefix("torch.") for d in (*_PLAIN, *_VIEWED)))


class AscendRefusal(HcclParamError):
    """A tensor Ascend's "hccl" backend refuses, refused here the same way: torch gets a plain
    ``RuntimeError`` with torch_npu's text and error code (``torch_text``), this error as its cause."""

    torch_text: str | None = None


def refusal(text: str, code: str | None, what: str, detail: str = "", **fields) -> AscendRefusal:
    """An AscendRefusal whose torch text is torch_npu's: ``text``, then its ``[ERROR]`` line with
    ``code`` (ERRxxxxx) when torch_npu adds one; ``detail`` (the values) only in hccl-py's message."""
    err = AscendRefusal(f"{what}: {text}" + (f" ({detail})" if detail else ""), **fields)
    err.torch_text = (
        text
        if code is None
        else f"{text}\n[ERROR] {time.strftime('%Y-%m-%d-%H:%M:%S')} "
        f"(PID:{os.getpid()}, Device:{_current_card()}, RankID:{os.environ.get(env.RANK, '0')}) {code}"
    )
    return err


def _current_card() -> int:
    ext = _device.installed()
    return ext.current_device() if ext is not None else 0


def strict() -> bool:
    """Under hccl-npu and hccl-launch --npu the backend refuses what Ascend's refuses (CPU tensors,
    non-contiguous ones), so a program that passes here does not fail on the cluster for it."""
    return os.environ.get(env.HCCL_PY_NPU_STRICT) == "1"


def check(t: torch.Tensor, what: str) -> None:
    """HcclParamError unless ``t`` is a CPU or npu tensor of an element type hccl-py carries (under
    hccl-npu: a contiguous npu tensor, as Ascend's HCCL backend asks)."""
    if not isinstance(t, torch.Tensor):
        raise HcclParamError(
            f"{what}: expected a torch.Tensor, got {type(t).__name__}",
            arg="tensor",
            rule="type",
            expected="torch.Tensor",
        )
    if t.device.type not in ("cpu", "npu"):
        raise HcclParamError(
            f"{what}: hccl-py's torch backend takes CPU and npu tensors, got one on {t.device}",
            arg="tensor",
            value=str(t.device),
            rule="device",
            expected="npu",
        )
    if strict() and t.device.type != "npu":  # torch_npu's ProcessGroupHCCL serves npu tensors only
        raise refusal(
            f"No backend type associated with device type {t.device.type}",
            None,
            what,
            arg="tensor",
            value=str(t.device),
            rule="device",
            expected="npu",
        )
    if strict() and not t.is_contiguous():
        raise refusal("Tensors must be contiguous", "ERR02002 DIST invalid type", what, arg="tensor", rule="contiguous")
    if t.device.type == "npu" and t.storage_offset() != 0 and formats.is_internal(t):
        raise refusal(
            "For a tensor of internal format, it's storage_offset must be 0",
            "ERR02007 DIST feature not supported",
            what,
            arg="tensor",
            value=t.storage_offset(),
            rule="offset",
            expected=0,
        )
    if t.layout is not torch.strided:
        raise HcclParamError(
            f"{what}: {t.layout} tensors are not supported (HCCL's collectives move dense buffers); pass t.to_dense()",
            arg="tensor",
            value=str(t.layout),
            rule="layout",
            expected="torch.strided",
        )
    if t.dtype not in _PLAIN and t.dtype not in _VIEWED:
        raise HcclParamError(
            f"{what}: dtype {t.dtype} is not supported by hccl-py; use one of {SUPPORTED}",
            arg="tensor",
            dtype=str(t.dtype),
            rule="choices",
            choices=SUPPORTED.split(", "),
        )


def same_device(tensors: list, like: torch.Tensor, what: str, op: str) -> None:
    """Refuse, as torch_npu does, a call whose inputs and outputs sit on different cards (a
    communicator serves one card)."""
    devices = {str(t.device) for t in tensors if isinstance(t, torch.Tensor)} | {str(like.device)}
    if len(devices) > 1 and any(d.startswith("npu") for d in devices):
        raise refusal(
            f"Corresponding input/output tensors to {op} must all reside on the same device",
            "ERR02001 DIST invalid parameter",
            what,
            arg="tensor",
            value=sorted(devices),
            rule="device",
        )


def as_array(t: torch.Tensor) -> np.ndarray:
    """The numpy array sharing ``t``'s memory (``t`` contiguous, on the CPU or an npu, of a supported type)."""
    dtype = t.dtype
    if t.requires_grad:
        t = t.detach()
    if t.device.type == "npu":
        t = _device.installed().as_cpu(t)
    if dtype in _PLAIN:
        return t.numpy()
    raw, np_dtype = _VIEWED[dtype]
    a = t.view(raw).numpy()
    return a if np_dtype is None else a.view(np_dtype)


class Staged:
    """A tensor's contents as a contiguous array: the tensor's own memory when it is contiguous,
    else a contiguous copy that :meth:`copy_back` writes into the tensor."""

    __slots__ = ("tensor", "buffer", "array")

    def __init__(self, t: torch.Tensor, what: str):
        check(t, what)
        self.tensor = t
        self.buffer = t if t.is_contiguous() else t.detach().contiguous()
        self.array = as_array(self.buffer)

    def copy_back(self) -> None:
        """Write the result into the tensor if it was staged through a copy."""
        if self.buffer is not self.tensor:
            with torch.no_grad():
                self.tensor.copy_(self.buffer)


def contiguous_array(t: torch.Tensor, what: str) -> np.ndarray:
    """An input's contents as a contiguous array (the tensor's memory, or a contiguous copy)."""
    check(t, what)
    return as_array(t if t.is_contiguous() else t.detach().contiguous())


def empty_like_stack(tensors: list[torch.Tensor] | torch.Tensor, n: int | None = None) -> torch.Tensor:
    """A contiguous tensor of shape ``(n, *t.shape)`` for ``n`` tensors like ``t`` (staging of list
    forms: all_gather, gather)."""
    t = tensors if isinstance(tensors, torch.Tensor) else tensors[0]
    return torch.empty((n if n is not None else len(tensors), *t.shape), dtype=t.dtype, device=t.device)
