"""torch_npu.distributed: what Ascend's programs call beside torch.distributed.

``reduce_scatter_tensor_uneven`` and ``all_gather_into_tensor_uneven`` split dim 0 by the given
sizes (default: as even as possible). Here they are made of torch's collectives on the "hccl"
backend: the uneven reduce-scatter reduces the whole input and keeps this rank's rows (the
result is the same; it moves more bytes than HCCL's), the uneven all-gather gathers padded rows.
"""

import torch
import torch.distributed as _dist

from hccl_py.torch.work import DONE as _DONE

is_hccl_available = _dist.is_hccl_available
_make_hccl_premul_sum = _dist._make_nccl_premul_sum  # torch_npu's alias of torch's premul-sum op


def _splits(rows: int, world: int, sizes) -> list[int]:
    if sizes is None:
        return [rows // world + (1 if r < rows % world else 0) for r in range(world)]
    sizes = [int(s) for s in sizes]
    if len(sizes) != world or sum(sizes) != rows or min(sizes) < 0:
        raise ValueError(f"split sizes {sizes} must be {world} non-negative counts adding up to {rows} rows")
    return sizes


def reduce_scatter_tensor_uneven(
    output, input, input_split_sizes=None, op=_dist.ReduceOp.SUM, group=None, async_op=False
):
    """Reduce ``input`` over the group and keep this rank's block of rows in ``output``
    (``input_split_sizes[r]`` rows for rank r)."""
    world, rank = _dist.get_world_size(group), _dist.get_rank(group)
    splits = _splits(input.shape[0], world, input_split_sizes)
    full = input.detach().clone()
    _dist.all_reduce(full, op, group)
    start = sum(splits[:rank])
    with torch.no_grad():
        output.copy_(full[start : start + splits[rank]].view(output.shape))
    return _DONE if async_op else None


def all_gather_into_tensor_uneven(output, input, output_split_sizes=None, group=None, async_op=False):
    """Gather every rank's ``input`` into ``output``'s blocks of rows (``output_split_sizes[r]`` rows
    for rank r)."""
    world = _dist.get_world_size(group)
    splits = _splits(output.shape[0], world, output_split_sizes)
    _dist.all_gather(list(output.split(splits)), input, group)
    return _DONE if async_op else None
