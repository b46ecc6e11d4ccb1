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

from .backend import communicator, foreign_registration, monitored_barrier, register
from .process_group import HcclProcessGroup
from .work import HcclWork, synchronize

__all__ = ["HcclProcessGroup", "HcclWork", "communicator", "foreign_registration", "monitored_barrier", "register",
           "synchronize"]

register()
