"""A unittest file in the shape of Ascend's own, on torch_npu.testing's helpers.

hccl-npu --devices 2 python npu_testing_helpers.py -v
"""

import os
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch_npu
from torch_npu.testing.common_distributed import skipIfUnsupportMultiNPU, with_comms
from torch_npu.testing.common_utils import SkipIfNotGteCANNVersion, SupportedDevices, create_common_tensor
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

    @SkipIfNotGteCANNVersion("9.0.0")
    def test_cann_versions(self):
        from torch_npu.utils import _is_gte_cann_version, _version_key, get_cann_version

        self.assertEqual(get_cann_version(), torch.version.cann.split()[0])
        self.assertTrue(_is_gte_cann_version("8.0.RC3") and not _is_gte_cann_version("9.3.0"))
        order = ["8.0.T5", "8.0.RC1", "8.0.RC3", "8.0.0", "8.1.RC1.alpha002", "8.1.RC1", "8.5.0", "9.0.0", "10.0.0"]
        self.assertEqual(sorted(order, key=_version_key), order)
        with self.assertRaises(ValueError):
            _version_key("9.x")

    def test_path_manager(self):
        import warnings

        from torch_npu.utils._path_manager import PathManager

        root = tempfile.mkdtemp()
        folder, file = os.path.join(root, "out", "deep"), os.path.join(root, "barrier")
        with self.assertRaisesRegex(RuntimeError, "does not exist"):
            PathManager.check_directory_path_readable(file)
        PathManager.make_dir_safety(folder)
        self.assertEqual(os.stat(folder).st_mode & 0o777, 0o750)
        PathManager.create_file_safety(file)
        self.assertEqual(os.stat(file).st_mode & 0o777, 0o640)
        PathManager.check_directory_path_readable(file)
        PathManager.check_directory_path_writeable(folder)
        with self.assertRaisesRegex(RuntimeError, "is a directory path"):
            PathManager.check_input_file_path(folder)
        with self.assertRaisesRegex(RuntimeError, "is a file path"):
            PathManager.check_input_directory_path(file)
        link = os.path.join(root, "link")
        os.symlink(file, link)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            PathManager.check_directory_path_readable(link)
            PathManager.check_input_file_path(os.path.join(root, "a;b"))
        self.assertTrue(len(seen) == 2, [str(w.message) for w in seen])
        self.assertTrue(PathManager.check_path_is_readable(file) and PathManager.check_path_is_writeable(folder))
        PathManager.remove_file_safety(file)
        PathManager.remove_path_safety(os.path.join(root, "out"))
        PathManager.remove_file_safety(file)  # gone already: nothing to do
        self.assertFalse(os.path.exists(file) or os.path.exists(folder))

    @SkipIfNotGteCANNVersion("99.0.0")
    def test_a_later_cann_skips(self):
        raise AssertionError("ran on a CANN before 99.0.0")


class WithCommsTest(TestCase):
    """with_comms on a one-rank case: the default group is "hccl" on card ``rank``, then destroyed."""

    rank, world_size = 0, 1

    def setUp(self):
        super().setUp()
        self.file_name = os.path.join(tempfile.mkdtemp(), "store")
        self.destroyed = False

    def destroy_pg(self):
        dist.destroy_process_group()
        self.destroyed = True

    @with_comms
    def test_runs_inside_an_hccl_group(self):
        self.assertEqual(dist.get_backend(), "hccl")
        backend = dist.group.WORLD._get_backend(torch.device("npu"))
        self.assertIsInstance(backend, torch_npu._C._distributed_c10d.ProcessGroupHCCL)
        self.assertEqual(torch.npu.current_device(), 0)
        t = torch.ones(3, device="npu")
        dist.all_reduce(t)
        self.assertEqual(t.cpu().tolist(), [1.0, 1.0, 1.0])

    def tearDown(self):
        self.assertTrue(self.destroyed and not dist.is_initialized())


def _put_and_return(rank, queue, put):
    queue.put((rank, torch.full((3,), float(rank), device=f"npu:{rank}").cpu()))
    put.set()


class ResultsOnAQueueTest(TestCase):
    """Ascend's tests (test_send_recv.py's harness): spawned ranks put CPU tensors on a queue and
    return at once; the parent fetches them after the ranks began to exit."""

    def test_the_parent_fetches_what_exiting_ranks_put(self):
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        events = [ctx.Event() for _ in range(2)]
        ranks = [ctx.Process(target=_put_and_return, args=(rank, queue, events[rank])) for rank in range(2)]
        for p in ranks:
            p.start()
        for p, put in zip(ranks, events):
            self.assertTrue(put.wait(120))
            p.join(1)  # a rank that put a tensor stays until it is fetched (torch_npu's exit handler)
        got = dict(queue.get(timeout=60) for _ in ranks)
        self.assertEqual({rank: t.tolist() for rank, t in got.items()}, {0: [0.0] * 3, 1: [1.0] * 3})
        for p in ranks:
            p.join(60)
            self.assertEqual(p.exitcode, 0)


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
