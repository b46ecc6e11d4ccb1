"""npu tensors across ``torch.multiprocessing``, as torch_npu passes them on an Ascend server: the
card memory is shared between the processes of the host, so what the receiver writes the sender
sees, and nothing is copied but once.

How: the first time an npu tensor (or storage) is pickled for another process, its storage's bytes
move, in place, into POSIX shared memory (every tensor on that storage keeps it; the card still
books the bytes); the pickle carries that shared CPU storage, which torch's own reductions pass as
a file descriptor (or a file name, under the "file_system" strategy), and the card's index. The
receiver opens the bytes as an npu storage on the same card, booked by the sender's card only (an
opened IPC handle is not the receiver's allocation, as with CUDA).

Before this, torch's reductions asked the npu storage for a CPU file descriptor from the queue's
feeder thread after ``put()`` returned: the feeder printed "_share_fd_: only available on CPU",
the receiver waited forever.

Example (hccl-npu --devices 2)::

    q = torch.multiprocessing.get_context("spawn").SimpleQueue()
    x = torch.zeros(4, device="npu:1")
    q.put(x)             # the child's q.get() is an npu:1 tensor over x's bytes
"""

from __future__ import annotations

import threading
from multiprocessing.reduction import ForkingPickler

import torch
import torch.utils.hooks
from torch.multiprocessing import reductions as _torch_reductions

from . import device as _device_impl

_installed = False
_moving = threading.Lock()  # two threads pickling one storage move it once


def install() -> None:
    """Put the npu's reductions in front of torch's for tensors, parameters and untyped storages."""
    global _installed
    if _installed:
        return
    _installed = True
    for cls in (torch.Tensor, torch.nn.Parameter):
        ForkingPickler.register(cls, _reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)


def _ext():
    ext = _device_impl.installed()
    if ext is None:
        _device_impl.install()
        ext = _device_impl.installed()
    return ext


def _shared_bytes(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """The shared CPU storage behind the npu ``storage``, moving its bytes there the first time."""
    ext = _ext()
    handle = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    with _moving:
        backing = ext.cpu_backing(handle)
        if backing is not None and backing.untyped_storage().is_shared():
            return backing.untyped_storage()
        # Nothing in flight on the card (a collective's view of the bytes) may use the old bytes.
        torch.npu.synchronize(storage.device)
        shared = torch.UntypedStorage._new_shared(storage.nbytes())
        ext.move_into_shared(handle, torch.empty(0, dtype=torch.uint8).set_(shared))
        return shared


def _reduce_tensor(tensor: torch.Tensor):
    if tensor.device.type != "npu":
        return _torch_reductions.reduce_tensor(tensor)
    if tensor.requires_grad and not tensor.is_leaf:
        _torch_reductions.reduce_tensor(tensor)  # raises torch's own "Cowardly refusing ..." error
    torch.utils.hooks.warn_if_has_hooks(tensor)
    shared = _shared_bytes(tensor.untyped_storage())
    layout = (tensor.dtype, tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset())
    layout += (_ext().get_format(tensor),)  # torch_npu's storage format travels with the bytes
    return _rebuild_tensor, (type(tensor), shared, tensor.device.index, layout, tensor.requires_grad)


def _reduce_storage(storage: torch.UntypedStorage):
    if storage.device.type != "npu":
        return _torch_reductions.reduce_storage(storage)
    return _rebuild_storage, (_shared_bytes(storage), storage.device.index)


def _opened(shared: torch.UntypedStorage, card: int) -> torch.Tensor:
    return _ext().opened_shared(torch.empty(0, dtype=torch.uint8).set_(shared), card)


def _rebuild_storage(shared: torch.UntypedStorage, card: int) -> torch.UntypedStorage:
    return _opened(shared, card).untyped_storage()


def _rebuild_tensor(cls, shared: torch.UntypedStorage, card: int, layout, requires_grad: bool) -> torch.Tensor:
    dtype, size, stride, offset, storage_format = layout
    storage = _opened(shared, card).untyped_storage()
    tensor = torch.empty(0, dtype=dtype, device=f"npu:{card}").set_(storage, offset, size, stride)
    if storage_format != -1:
        _ext().set_format(tensor, storage_format)
    if cls is torch.nn.Parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)
