"""``skipIfUnsupportMultiNPU``, ``with_comms``, ``init_pg`` and ``TEST_SKIPS`` as Ascend's
distributed tests use them."""

from __future__ import annotations

import functools
import unittest
from collections import namedtuple

import torch
import torch.distributed as dist

TestSkip = namedtuple("TestSkip", "exit_code, message")
TestSkip.__doc__ = "Why a test process skipped: the exit code it reports and the message."
# The exit codes a test process reports a skip with (75: not enough cards), as torch's TEST_SKIPS.
TEST_SKIPS = {
    "multi-npu": TestSkip(75, "Multi-NPU condition not satisfied"),
    **{f"multi-npu-{n}": TestSkip(75, f"Need at least {n} ASCEND devices") for n in range(1, 9)},
    "hccl": TestSkip(76, "c10d not compiled with HCCL support"),
    "known_issues": TestSkip(77, "Test skipped due to known issues"),
}


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


def init_pg(backend: str = "hccl", world_size: int = 1, rank: int = 0, file_name: str = "file://") -> None:
    """Join the default group through the file ``file_name`` ("hccl" or "gloo"); with "hccl", this
    rank then works on card ``rank``. Too few cards for "hccl" is a RuntimeError naming the need."""
    if backend not in ("hccl", "gloo"):
        raise RuntimeError(f"Backend {backend} not supported!")
    if backend == "hccl" and torch.npu.device_count() < world_size:
        raise RuntimeError(TEST_SKIPS[f"multi-npu-{world_size}"].message)
    dist.init_process_group(backend=backend, world_size=world_size, rank=rank, init_method=f"file://{file_name}")
    if backend == "hccl":
        torch.npu.set_device(rank)


def with_comms(func):
    """Decorator of a test method of a multi-process test case (torch's ``MultiProcessTestCase``:
    ``self.rank``, ``self.world_size``, ``self.file_name``, ``self.destroy_pg()``): the test runs
    inside a default group, "hccl" on npu cards when there are enough for the world, else "gloo";
    the npu generator is seeded with 0 first."""
    if func is None:
        raise RuntimeError("Test function is None.")

    @functools.wraps(func)
    def wrapper(self, *args, **kwargs):
        enough = torch.npu.is_available() and torch.npu.device_count() >= self.world_size
        init_pg("hccl" if enough else "gloo", world_size=self.world_size, rank=self.rank, file_name=self.file_name)
        torch.npu.manual_seed(0)
        func(self, *args, **kwargs)
        self.destroy_pg()

    return wrapper
