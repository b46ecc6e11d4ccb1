"""``skipIfUnsupportMultiNPU`` as Ascend's distributed tests use it."""

from __future__ import annotations

import functools
import unittest

import torch


def skipIfUnsupportMultiNPU(npu_number_needed: int):  # noqa: N802  (Ascend's name)
    """Test decorator: skip unless this host shows at least ``npu_number_needed`` cards (under
    hccl-npu: ``--devices``)."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not torch.npu.is_available() or torch.npu.device_count() < npu_number_needed:
                raise unittest.SkipTest(f"Multi-NPU {npu_number_needed} condition not satisfied")
            return fn(*args, **kwargs)

        return wrapper

    return decorate
