"""torch_npu.testing on hccl-py's npu: the helpers Ascend's own tests import (``testcase``,
``common_utils``, ``common_distributed``), written from their documented behaviour."""
