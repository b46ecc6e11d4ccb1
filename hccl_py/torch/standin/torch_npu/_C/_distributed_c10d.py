"""torch_npu._C._distributed_c10d: ``ProcessGroupHCCL``, the class of the "hccl" backend's groups,
is hccl-py's process group (a Python one: torch_npu's C++ options and internal stream ids are not
part of it, docs/torch.md)."""

from hccl_py.torch.process_group import HcclProcessGroup as ProcessGroupHCCL

__all__ = ["ProcessGroupHCCL"]
