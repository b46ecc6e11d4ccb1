"""Single-process data parallelism over this host's npu cards: what ``torch.nn.parallel.comm``
(under ``nn.DataParallel``, ``replicate``, ``scatter``, ``gather``) needs from a device.

torch's ``comm`` functions call ``torch._C._broadcast``, ``_broadcast_out``,
``_broadcast_coalesced``, ``_scatter``, ``_scatter_out``, ``_gather`` and ``_gather_out``. torch's
CUDA build defines them for CUDA tensors, torch_npu defines them for npu tensors on an Ascend
host, and torch's CPU build has none, so ``nn.DataParallel`` over npu cards failed with
``module 'torch._C' has no attribute '_broadcast_coalesced'``. :func:`install` defines them for npu
tensors as ``torch.nn.parallel.comm`` documents them (where torch already has one, the original
keeps serving other tensors):

- ``broadcast(tensor, devices)``: a copy of ``tensor`` on each card; on the card it already is
  on, ``tensor`` itself (no copy). ``broadcast_coalesced(tensors, devices)``: the same for a
  sequence of tensors that are all on ``devices[0]``; the first card's list is ``tensors`` itself.
- ``scatter(tensor, devices, chunk_sizes, dim, streams)``: ``tensor`` cut along ``dim`` (in
  ``chunk_sizes``, else into ``len(devices)`` chunks as ``Tensor.chunk`` cuts, so possibly fewer),
  chunk i on card ``devices[i]``; a chunk already there is a view of ``tensor``. Copies from the
  host run on ``streams[i]`` when given.
- ``gather(tensors, dim, destination)``: the tensors (npu, any cards, equal sizes but along
  ``dim``) concatenated along ``dim`` on card ``destination`` (None: the current card; -1: the
  host's memory).
- the ``*_out`` forms write into given tensors (shapes checked first) and return them.

Copies between cards are host copies here and cost no modeled time, as every copy between cards
of the npu device (docs/torch.md); copies from or to host memory are charged as any such copy.
"""

from __future__ import annotations

import torch


def _card(index: int) -> torch.device:
    return torch.device("npu", index)


def _is_npu(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "npu"


def _check_indices(devices) -> list[int]:
    devices = [int(d) for d in devices]
    for d in devices:
        if d < 0:
            raise RuntimeError(f"Expected non-negative device index, but got {d}")
    return devices


def broadcast(tensor: torch.Tensor, devices) -> list[torch.Tensor]:
    """Copies of ``tensor`` (npu or host memory) on cards ``devices``; on its own card ``tensor``
    itself."""
    own = tensor.get_device() if _is_npu(tensor) else None
    return [tensor if d == own else tensor.to(_card(d)) for d in _check_indices(devices)]


def broadcast_out(tensor: torch.Tensor, out) -> list[torch.Tensor]:
    """``tensor`` copied into each of ``out`` (npu tensors of ``tensor``'s shape); returns ``out``."""
    out = list(out)
    for i, dst in enumerate(out):
        if not _is_npu(dst):
            raise RuntimeError(
                f"Expected all output tensors to be npu tensors, but output tensor at index {i} is on {dst.device}"
            )
        if dst.shape != tensor.shape:
            raise RuntimeError(
                f"Expected all output tensors to have the shape of the source tensor {list(tensor.shape)}, "
                f"but output tensor at index {i} has shape {list(dst.shape)}"
            )
    for dst in out:
        if dst is not tensor:
            dst.copy_(tensor)
    return out


def broadcast_coalesced(tensors, devices, buffer_size: int = 10485760) -> list[list[torch.Tensor]]:
    """For each card of ``devices`` the list of copies of ``tensors`` (all on card ``devices[0]``);
    the first card's list holds ``tensors`` themselves. The copies carry no autograd history, as
    the coalesced buffers they come from on CUDA. ``buffer_size`` bounds CUDA's coalescing
    buffers; copies here are per tensor, so it changes nothing."""
    devices = _check_indices(devices)
    tensors = list(tensors)
    if not devices:
        raise RuntimeError("broadcast_coalesced: expected at least one device")
    for i, t in enumerate(tensors):
        if not _is_npu(t) or t.get_device() != devices[0]:
            raise RuntimeError(f"All tensors must be on devices[0]: npu:{devices[0]}, but tensor {i} is on {t.device}")
    outputs = [tensors]
    with torch.no_grad():
        for d in devices[1:]:
            outputs.append([t.detach().to(_card(d)) for t in tensors])
    return outputs


def _streams_for(devices, streams) -> list:
    """One stream or None per card of ``devices`` (a shorter list leaves the rest on the cards'
    current streams, as torch's); a stream on another card than its index's is refused."""
    streams = list(streams) if streams is not None else []
    for i, stream in enumerate(streams[: len(devices)]):
        if stream is not None and stream.device_index != devices[i]:
            raise RuntimeError(
                f"Expected the device associated with the stream at index {i} (was {stream.device_index}) to match "
                f"the device supplied at that index (expected {devices[i]})"
            )
    return streams + [None] * (len(devices) - len(streams))


def _wrap_dim(dim: int, ndim: int) -> int:
    """``dim`` of a tensor of ``ndim`` dims counted from 0 (a negative one from the end), as torch's
    ``maybe_wrap_dim``: IndexError when there is no such dim."""
    span = max(ndim, 1)  # a 0-dim tensor has dim 0 (or -1), as torch wraps scalars
    if not -span <= dim < span:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-span}, {span - 1}], but got {dim})")
    return dim % span


def scatter(tensor: torch.Tensor, devices, chunk_sizes=None, dim: int = 0, streams=None) -> list[torch.Tensor]:
    """``tensor`` cut along ``dim`` (``chunk_sizes``, else ``Tensor.chunk`` into ``len(devices)``),
    chunk i on card ``devices[i]`` (a view when already there), copied on ``streams[i]`` if
    given."""
    devices = _check_indices(devices)
    if not devices:
        raise RuntimeError("Expected at least one device to scatter to")
    streams = _streams_for(devices, streams)
    dim = _wrap_dim(dim, tensor.dim())
    if chunk_sizes is not None:
        chunk_sizes = [int(s) for s in chunk_sizes]
        if len(chunk_sizes) != len(devices):
            raise RuntimeError(
                f"Expected devices and chunk_sizes to be of the same length, but got {len(devices)} devices "
                f"and {len(chunk_sizes)} chunk sizes"
            )
        chunks = tensor.split(chunk_sizes, dim)
    else:
        chunks = tensor.chunk(len(devices), dim)
    out = []
    for i, chunk in enumerate(chunks):
        target = _card(devices[i])
        if chunk.device == target:
            out.append(chunk)
            continue
        with torch.npu.device(devices[i]), torch.npu.stream(streams[i]):
            out.append(chunk.to(target, non_blocking=True))
    return out


def scatter_out(tensor: torch.Tensor, out, dim: int = 0, streams=None) -> list[torch.Tensor]:
    """``tensor`` cut along ``dim`` into the npu tensors ``out`` (their sizes along ``dim`` are the
    chunks', their other sizes ``tensor``'s), copied on ``streams[i]`` if given; returns ``out``."""
    out = list(out)
    if not out:
        raise RuntimeError("Expected at least one output tensor to scatter to")
    dim = _wrap_dim(dim, tensor.dim())
    for i, dst in enumerate(out):
        if not _is_npu(dst):
            raise RuntimeError(
                f"Expected all output tensors to be npu tensors, but output tensor at index {i} is on {dst.device}"
            )
        expected = list(tensor.shape)
        if dst.dim() == tensor.dim():
            expected[dim] = dst.shape[dim]
        if list(dst.shape) != expected:
            raise RuntimeError(
                f"Output tensor at index {i} has shape {list(dst.shape)}, but expected {expected} "
                f"(the source's sizes but along dim {dim})"
            )
    streams = _streams_for([dst.get_device() for dst in out], streams)
    total = sum(dst.shape[dim] for dst in out)
    if total != tensor.shape[dim]:
        raise RuntimeError(
            f"Total size along dim {dim} of the output tensors ({total}) does not match the source's ({tensor.shape[dim]})"
        )
    offset = 0
    for i, dst in enumerate(out):
        chunk = tensor.narrow(dim, offset, dst.shape[dim])
        offset += dst.shape[dim]
        with torch.npu.device(dst.get_device()), torch.npu.stream(streams[i]):
            dst.copy_(chunk, non_blocking=True)
    return out


def _gather_shape(tensors, dim: int) -> tuple[list[int], int]:
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    first = tensors[0]
    dim = _wrap_dim(dim, first.dim())
    size = list(first.shape)
    total = 0
    for i, t in enumerate(tensors):
        if not _is_npu(t):
            raise RuntimeError(
                f"Expected all input tensors to be npu tensors, but tensor at index {i} is on {t.device}"
            )
        expected = list(size)
        expected[dim] = t.shape[dim] if t.dim() == first.dim() else size[dim]
        if list(t.shape) != expected:
            raise RuntimeError(f"Input tensor at index {i} has invalid shape {list(t.shape)}, but expected {expected}")
        total += t.shape[dim]
    size[dim] = total
    return size, dim


def _common_format(tensors) -> torch.memory_format:
    """channels_last (3d) when every tensor is laid out so and not also plainly contiguous, else
    contiguous: the output keeps the inputs' layout, as torch's gather does."""
    for layout, ndim in ((torch.channels_last, 4), (torch.channels_last_3d, 5)):
        if all(t.dim() == ndim and t.is_contiguous(memory_format=layout) and not t.is_contiguous() for t in tensors):
            return layout
    return torch.contiguous_format


def _copy_blocks(tensors, out: torch.Tensor, dim: int) -> torch.Tensor:
    offset = 0
    for t in tensors:
        out.narrow(dim, offset, t.shape[dim]).copy_(t, non_blocking=True)
        offset += t.shape[dim]
    return out


def gather(tensors, dim: int = 0, destination_index: int | None = None) -> torch.Tensor:
    """The npu tensors concatenated along ``dim`` on card ``destination_index`` (None: the current
    card; -1: host memory)."""
    tensors = list(tensors)
    size, dim = _gather_shape(tensors, dim)
    if destination_index is None:
        destination = _card(torch.npu.current_device())
    elif destination_index == -1:
        destination = torch.device("cpu")
    else:
        destination = _card(int(destination_index))
    out = torch.empty(size, dtype=tensors[0].dtype, device=destination, memory_format=_common_format(tensors))
    return _copy_blocks(tensors, out, dim)


def gather_out(tensors, out: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The npu tensors concatenated along ``dim`` into ``out`` (host memory or a card); returns
    ``out``."""
    tensors = list(tensors)
    size, dim = _gather_shape(tensors, dim)
    if list(out.shape) != size:
        raise RuntimeError(f"Expected out tensor to have shape {size}, but got {list(out.shape)}")
    return _copy_blocks(tensors, out, dim)


def _npu_or(original, ours, tensors_of):
    """``ours`` for calls whose tensors include an npu tensor, ``original`` (torch's) for others."""
    if original is None:
        return ours

    def either(*args, **kwargs):
        if any(_is_npu(t) for t in tensors_of(*args, **kwargs)):
            return ours(*args, **kwargs)
        return original(*args, **kwargs)

    either.__doc__ = ours.__doc__
    return either


def _flat(*items):
    for item in items:
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            yield from (t for t in item if isinstance(t, torch.Tensor))


_OURS = {
    "_broadcast": (broadcast, lambda tensor, devices: _flat(tensor)),
    "_broadcast_out": (broadcast_out, lambda tensor, out: _flat(tensor, out)),
    "_broadcast_coalesced": (broadcast_coalesced, lambda tensors, devices, buffer_size=0: _flat(tensors)),
    "_scatter": (scatter, lambda tensor, devices, chunk_sizes=None, dim=0, streams=None: _flat(tensor)),
    "_scatter_out": (scatter_out, lambda tensor, out, dim=0, streams=None: _flat(tensor, out)),
    "_gather": (gather, lambda tensors, dim=0, destination_index=None: _flat(tensors)),
    "_gather_out": (gather_out, lambda tensors, out, dim=0: _flat(tensors, out)),
}


def install() -> None:
    """Define ``torch._C._broadcast`` and the others ``torch.nn.parallel.comm`` calls for npu
    tensors (idempotent), as torch_npu does on an Ascend host."""
    for name, (ours, tensors_of) in _OURS.items():
        current = getattr(torch._C, name, None)
        if getattr(current, "__hccl_py__", False):
            continue
        served = _npu_or(current, ours, tensors_of)
        served.__hccl_py__ = True
        setattr(torch._C, name, served)
