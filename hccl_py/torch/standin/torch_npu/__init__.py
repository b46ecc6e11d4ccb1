"""hccl-py's torch_npu (Huawei's Ascend extension of PyTorch) on simulated NPUs.

``hccl-npu`` and ``hccl-launch --npu`` put this folder first on a run's path, so ``import
torch_npu`` finds it (and torch's device-backend autoload calls :func:`_autoload` when a script
never imports it): ``npu`` becomes a torch device backed by hccl-py's simulated cards, ``torch.npu``
is ``hccl_py.torch.npu``, and the "hccl" backend serves npu tensors. What it covers: docs/torch.md.
"""

import os
import sys

# `import torch_npu` before `import torch` (as Ascend's migration guide puts it, at a script's top):
# torch's autoload would import this module again, half-initialised, and fail to find _autoload.
# So torch is imported with autoload off, as torch's own out-of-tree example does, and the switch
# restored for the processes this one starts.
if "torch" not in sys.modules:
    _AUTOLOAD = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    try:
        import torch  # noqa: F401
    finally:
        if _AUTOLOAD is None:
            del os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"]
        else:
            os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = _AUTOLOAD

from hccl_py.torch import install, npu  # noqa: E402
from hccl_py.torch.formats import get_npu_format, npu_format_cast, npu_format_cast_  # noqa: E402

install.install()
sys.modules[__name__ + ".npu"] = npu
# torch_npu.npu.amp (torch.npu.amp): torch_npu.npu is hccl_py.torch.npu, a module, so its
# subpackage is named here for imports such as `from torch_npu.npu.amp.autocast_mode import autocast`.
sys.modules[__name__ + ".npu.amp"] = npu.amp
sys.modules[__name__ + ".npu.amp.autocast_mode"] = npu.amp.autocast_mode
sys.modules[__name__ + ".npu.amp.grad_scaler"] = npu.amp.grad_scaler

# as torch_npu: torch_npu._C and torch_npu.distributed without their own import
from . import _C, distributed  # noqa: E402, F401

__version__ = "2.13.0+hccl.py"  # torch_npu's releases follow torch's (torch_npu 2.13.x for torch 2.13.x)
__all__ = ["distributed", "get_npu_format", "npu", "npu_format_cast", "npu_format_cast_"]


def _autoload() -> None:
    """torch's device-backend autoload entry point (``torch.backends`` group): ``import torch`` runs
    it, as with the real torch_npu; importing this module already did the work."""
