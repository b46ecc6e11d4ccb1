"""``TestCase`` and ``run_tests`` as Ascend's tests use them: a unittest case that selects the card
(``SET_NPU_DEVICE``, default npu:0), seeds torch and ``random`` (``SEED``, default 666) before each
test, compares tensors within a precision whatever their dtypes and devices, and adds
``assertRtolEqual``::

    class MyTest(TestCase):
        def test_add(self):
            cpu, npu = create_common_tensor([np.float32, 2, (4,)], -1, 1)
            self.assertRtolEqual(cpu + 1, (npu + 1).cpu())
"""

from __future__ import annotations

import math
import os
import random
import sys
import unittest

import numpy as np
import torch

from .common_utils import get_npu_device


def run_tests() -> None:
    """Run the calling module's tests (``unittest.main``), as Ascend's test files end."""
    unittest.main(argv=sys.argv)


def _as_tensor(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


class TestCase(unittest.TestCase):
    """Ascend's base test case (see the module doc)."""

    _precision = 1e-5
    maxDiff = None
    exact_dtype = False

    @property
    def precision(self) -> float:
        """The default absolute tolerance of :meth:`assertEqual`."""
        return self._precision

    @precision.setter
    def precision(self, value: float) -> None:
        self._precision = value

    @classmethod
    def setUpClass(cls) -> None:
        """Select the test card: ``SET_NPU_DEVICE`` or npu:0."""
        cls.npu_device = get_npu_device()
        torch.npu.set_device(cls.npu_device)

    def setUp(self) -> None:
        """Seed torch and ``random`` (``SEED``, default 666) before each test."""
        seed = int(os.environ.get("SEED", "666"))
        torch.manual_seed(seed)
        random.seed(seed)

    def assertEqual(self, x, y, prec=None, message="", allow_inf=False, exact_dtype=None):  # noqa: N802
        """Equal within ``prec`` (default :attr:`precision`): tensors of one size (values compared
        in ``x``'s dtype on the CPU, NaNs where the other has NaNs), numbers, and lists, tuples
        and dicts of them; a string third argument is the message."""
        if isinstance(prec, str) and not message:
            prec, message = None, prec
        prec = self.precision if prec is None else prec
        exact = self.exact_dtype if exact_dtype is None else exact_dtype
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            a, b = _as_tensor(x).detach().cpu(), _as_tensor(y).detach().cpu()
            super().assertEqual(a.size(), b.size(), message)
            if exact:
                super().assertEqual(a.dtype, b.dtype, message)
            if a.dtype == torch.bool or b.dtype == torch.bool:
                a, b = a.to(torch.int64), b.to(torch.int64)
            b = b.to(a.dtype)
            if a.numel() == 0:
                return
            if a.is_floating_point() or a.is_complex():
                nan_a, nan_b = torch.isnan(a), torch.isnan(b)
                super().assertTrue(torch.equal(nan_a, nan_b), message or "NaNs in different places")
                a, b = a.masked_fill(nan_a, 0), b.masked_fill(nan_b, 0)
                if allow_inf:
                    same_inf = torch.isinf(a) & (a == b)
                    a, b = a.masked_fill(same_inf, 0), b.masked_fill(same_inf, 0)
            diff = (a.double() - b.double()).abs().max().item()
            super().assertLessEqual(diff, prec, message or f"tensors differ by {diff} > {prec}")
        elif isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            if math.isnan(x) or math.isnan(y):
                super().assertTrue(math.isnan(x) and math.isnan(y), message)
            else:
                super().assertLessEqual(abs(x - y), prec, message or f"{x} != {y} within {prec}")
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            super().assertEqual(len(x), len(y), message)
            for a, b in zip(x, y):
                self.assertEqual(a, b, prec, message, allow_inf, exact_dtype)
        elif isinstance(x, dict) and isinstance(y, dict):
            super().assertEqual(sorted(x), sorted(y), message)
            for key in x:
                self.assertEqual(x[key], y[key], prec, message, allow_inf, exact_dtype)
        else:
            super().assertEqual(x, y, message or None)

    def assertRtolEqual(self, x, y, prec=1.0e-4, prec16=1.0e-3, auto_trans_dtype=False, message=None):  # noqa: N802
        """Close by both absolute and relative error: fails only where more than ``size * prec``
        elements miss both (``prec16`` for float16 and bfloat16); shapes and dtypes must match
        (``auto_trans_dtype`` converts ``y`` to ``x``'s dtype first), booleans exactly."""
        a = x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        b = y.detach().cpu() if isinstance(y, torch.Tensor) else torch.as_tensor(np.asarray(y))
        if auto_trans_dtype:
            b = b.to(a.dtype)
        self.assertTrue(a.shape == b.shape, message or f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
        self.assertTrue(a.dtype == b.dtype, message or f"dtypes differ: {a.dtype} vs {b.dtype}")
        if a.dtype == torch.bool:
            self.assertTrue(torch.equal(a, b), message or "booleans differ")
            return
        if a.dtype == torch.bfloat16:
            self.assertTrue(torch.allclose(a.float(), b.float(), rtol=prec16, atol=prec16), message)
            return
        tolerance = prec16 if a.dtype == torch.float16 else prec
        a64, b64 = a.double(), b.double()
        diff = (a64 - b64).abs()
        relative = diff / (torch.maximum(a64.abs(), b64.abs()) + 1e-12)
        budget = a.numel() * tolerance
        misses = int(((diff > tolerance) & (relative > tolerance)).sum())
        self.assertTrue(
            misses <= budget,
            message
            or f"{misses} elements differ beyond {tolerance} (max abs {diff.max().item() if a.numel() else 0.0})",
        )

    def assertNotEqual(self, x, y, prec=None, message=""):  # noqa: N802
        """Not equal within ``prec`` (see :meth:`assertEqual`)."""
        try:
            self.assertEqual(x, y, prec, message)
        except AssertionError:
            return
        raise AssertionError(message or f"{x!r} == {y!r}")
