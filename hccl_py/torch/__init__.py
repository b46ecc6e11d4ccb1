"""torch.distributed's ``"hccl"`` backend on hccl-py, for CPU tensors.

Importing this module registers the backend (explicit import only: nothing registers itself for
every torch user)::

    import torch, torch.distributed as dist
    import hccl_py.torch                      # registers "hccl"
    dist.init_process_group("hccl")           # under hccl-launch, torchrun, or env:// by hand
    t = torch.full((4,), float(dist.get_rank()))
    dist.all_reduce(t)

If the real torch_npu already registered "hccl", the import fails with HcclNotSupportedError
naming it instead of shadowing it. Scripts written for Ascend (``import torch_npu``,
``torch.npu``, ``transfer_to_npu``) run unchanged under ``hccl-launch --npu``, which puts a
stand-in ``torch_npu`` on that run's path (``hccl_py/torch/npu.py``). See docs/torch.md.
"""

from ..errors import HcclNotSupportedError

try:  # the adapter's one optional dependency: say how to get it rather than a bare ModuleNotFoundError
    import torch  # noqa: F401
except ImportError:
    raise HcclNotSupportedError(
        "hccl_py.torch needs torch: pip install 'hccl-py[torch]' (the CPU build of torch 2.13.0)", module="torch"
    ) from None

from . import install  # noqa: E402, F401  (what `import torch_npu` changes, registered in order)
from .backend import communicator, foreign_registration, monitored_barrier, register  # noqa: E402
from .process_group import HcclProcessGroup  # noqa: E402
from .work import HcclWork, synchronize  # noqa: E402

__all__ = [
    "HcclProcessGroup",
    "HcclWork",
    "communicator",
    "foreign_registration",
    "monitored_barrier",
    "register",
    "synchronize",
]

register()
