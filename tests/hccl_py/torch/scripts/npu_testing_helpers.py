"""A unittest file in the shape of Ascend's own, on torch_npu.testing's helpers.

hccl-npu --devices 2 python npu_testing_helpers.py -v
"""

import numpy as np
import torch
import torch_npu
from torch_npu.testing.common_distributed import skipIfUnsupportMultiNPU
from torch_npu.testing.common_utils import SupportedDevices, create_common_tensor
from torch_npu.testing.testcase import TestCase, run_tests


class HelpersTest(TestCase):
    def test_common_tensor_pairs(self):
        cpu, npu = create_common_tensor([np.float32, 29, (3, 4)], -1, 1)
        self.assertEqual(npu.device, torch.device("npu:0"))
        self.assertEqual(torch_npu.get_npu_format(npu), 29)
        self.assertRtolEqual(cpu.numpy(), npu.cpu().numpy())
        self.assertTrue(bool(((cpu >= -1) & (cpu < 1)).all()))
        cpu, npu = create_common_tensor([np.int32, -1, (5,)], 0, 10)
        self.assertEqual(torch_npu.get_npu_format(npu), 2)
        self.assertEqual(cpu.dtype, torch.int32)
        self.assertEqual(cpu, npu)

    def test_assert_equal_is_within_precision(self):
        self.assertEqual(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-7]))
        self.assertNotEqual(torch.tensor([1.0]), torch.tensor([1.1]))
        with self.assertRaises(AssertionError):
            self.assertRtolEqual(torch.ones(100), torch.full((100,), 2.0))

    @skipIfUnsupportMultiNPU(2)
    def test_two_cards(self):
        self.assertEqual(torch.ones(2, device="npu:1").sum().item(), 2.0)

    @skipIfUnsupportMultiNPU(65)
    def test_too_many_cards_skips(self):
        raise AssertionError("ran without 65 cards")


@SupportedDevices(["Ascend910B"])
class On910BTest(TestCase):
    def test_runs_on_the_modeled_910b(self):
        self.assertEqual(torch.npu.get_device_name(0), "Ascend910B3")


@SupportedDevices(["Ascend950"])
class On950Test(TestCase):
    def test_skipped_elsewhere(self):
        raise AssertionError("ran on a card that is not an Ascend950")


if __name__ == "__main__":
    run_tests()
