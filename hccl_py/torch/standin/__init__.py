"""The folder ``hccl-launch --npu`` puts first on a run's path: it holds the ``torch_npu`` stand-in
(never a top-level package of an installation; see ``hccl_py/torch/npu.py``)."""
