"""``create_common_tensor``, ``SupportedDevices`` and ``SkipIfNotGteCANNVersion`` as Ascend's tests
use them."""

from __future__ import annotations

import functools
import os
import unittest

import numpy as np
import torch


def get_npu_device() -> str:
    """The card tests run on: ``npu:$SET_NPU_DEVICE``, else npu:0."""
    index = os.environ.get("SET_NPU_DEVICE")
    return f"npu:{int(index)}" if index not in (None, "") else "npu:0"


def create_common_tensor(item, minValue, maxValue, device=None):  # noqa: N803  (Ascend's names)
    """``item`` = [numpy dtype, ACL format, shape]: uniform values in [minValue, maxValue) of that
    dtype, as a (CPU tensor, npu tensor) pair of the same values; the npu one cast to the format
    unless it is -1."""
    dtype, npu_format, shape = item[0], item[1], item[2]
    values = np.random.uniform(minValue, maxValue, shape).astype(dtype)
    cpu_input = torch.from_numpy(values)
    npu_input = cpu_input.to(device or get_npu_device())
    if npu_format != -1:
        import torch_npu

        npu_input = torch_npu.npu_format_cast(npu_input, npu_format)
    return cpu_input, npu_input


def _short_name(name: str) -> str:
    if name.startswith("Ascend910_"):
        return name[:12]
    if name.startswith("Ascend950"):
        return name[:9]
    return name[:10]


def SupportedDevices(devices: list[str]):  # noqa: N802  (Ascend's name)
    """Class or test decorator: skip unless this card's model (its name cut as Ascend's helper
    cuts it, e.g. "Ascend910B") is in ``devices``."""

    def decorate(target):
        name = _short_name(torch.npu.get_device_name(0))
        if name not in devices:
            return unittest.skip(f"Only run on {devices!r}, current device is {name}.")(target)
        return target

    return decorate


class SkipIfNotGteCANNVersion:  # noqa: N801  (Ascend's name)
    """Test decorator: skip unless this host's CANN ``module`` is ``base_version`` or later (the
    simulated CANN reports ``torch.version.cann``'s version)."""

    def __init__(self, base_version: str, module: str = "CANN"):
        self.base_version, self.module = base_version, module

    def __call__(self, fn):
        from torch_npu.utils import _is_gte_cann_version, get_cann_version

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not _is_gte_cann_version(self.base_version, module=self.module):
                current = get_cann_version(module=self.module)
                raise unittest.SkipTest(
                    f"Only run on {self.base_version} or greater, current cann version is {current}."
                )
            return fn(*args, **kwargs)

        return wrapper
