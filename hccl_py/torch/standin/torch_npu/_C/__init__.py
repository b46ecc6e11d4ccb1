"""torch_npu._C: of torch_npu's C++ extension, what the stand-in has: ``_distributed_c10d`` with
``ProcessGroupHCCL``, the class of the "hccl" backend's process groups (hccl-py's own,
:class:`hccl_py.torch.process_group.HcclProcessGroup`), for programs that check a group's
backend by type::

    isinstance(group._get_backend(torch.device("npu")), torch_npu._C._distributed_c10d.ProcessGroupHCCL)
"""

from . import _distributed_c10d  # noqa: F401
