"""Everything ``import torch_npu`` changes in torch, in order, in one place (openreg's
``Module.cpp`` and ``__init__.py`` together): :func:`install` is what hccl-py's torch_npu stand-in
(``standin/torch_npu``) and ``transfer_to_npu`` run; a process that only receives npu tensors
installs the device alone, with steps 2 and 3 (:func:`_when_loaded`)::

    from hccl_py.torch import install
    install.install(devices=2)      # as `import torch_npu` under hccl-npu --devices 2
"""

from __future__ import annotations

import types

from . import backend, device, ipc, nn_parallel, npu


def install(devices: int | None = None) -> types.ModuleType:
    """Make ``npu`` a torch device on hccl-py's simulated cards, as torch_npu makes it on Ascend's
    (idempotent); returns ``torch.npu``. In order:

    1. ``device.install``: torch's PrivateUse1 renamed ``npu``; the C++ extension built and loaded
       (device guard and hooks, allocator, kernels, autocast); the card count; the ops torch checks
       devices for; each card's pool at its HBM; ``.npu()``/``.is_npu`` on tensors, modules,
       storages and packed sequences; ``torch.version.cann``; clean-ups at exit; then, through
       :func:`_when_loaded`:
    2. ``torch.npu`` is ``hccl_py.torch.npu``; events and kernels on the card's modeled clock;
    3. the "hccl" backend serves npu tensors (c10d's kernels for PrivateUse1);
       and the kernel log starts recording.
    4. ``torch._C._broadcast`` and the others ``torch.nn.parallel`` calls, for npu tensors;
    5. npu tensors cross ``torch.multiprocessing`` with the card's memory shared;
    6. torch.distributed's and exit's changes (:func:`~hccl_py.torch.npu.patch_distributed`).
    """
    device.install(devices)
    nn_parallel.install()
    ipc.install()
    npu.patch_distributed()
    return npu


def _when_loaded(ext) -> None:
    """Steps 2 and 3, run by ``device.install`` once the extension is loaded (also when a process
    installs the device alone: one that only receives npu tensors)."""
    npu.as_torch_npu(ext)
    backend.serve_npu()


device.on_install(_when_loaded)
