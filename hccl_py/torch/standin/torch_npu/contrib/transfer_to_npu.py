"""Importing this maps CUDA onto the NPU stand-in, as torch_npu's own ``transfer_to_npu``: ``torch.cuda``
is ``torch.npu``, "cuda" devices stay on the CPU, "nccl" becomes "hccl" (``hccl_py.torch.npu.transfer_to_npu``)."""

from hccl_py.torch.npu import transfer_to_npu as _transfer

_transfer()
