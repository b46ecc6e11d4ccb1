"""Importing this maps CUDA onto the NPU stand-in, as torch_npu's own ``transfer_to_npu``: ``torch.cuda``
is ``torch.npu``, "cuda" devices are "npu" devices, "nccl" becomes "hccl" (``hccl_py.torch.transfer``)."""

from hccl_py.torch.transfer import transfer_to_npu as _transfer

_transfer()
