"""hccl-py's stand-in for torch_npu (Huawei's Ascend extension of PyTorch), on CPU tensors.

``hccl-launch --npu`` puts its folder first on the ranks' path, so ``import torch_npu`` finds this:
``torch.npu`` becomes hccl-py's stand-in and the "hccl" backend is registered. What it covers:
``hccl_py/torch/npu.py`` and docs/torch.md.
"""

import sys

from hccl_py.torch import npu

npu.install()
sys.modules[__name__ + ".npu"] = npu

__version__ = "0.0.0+hccl-py-standin"
__all__ = ["npu"]
