"""torch_npu's rules and extensions of the collectives, under hccl-npu on 2 or more ranks, each
checked against a value every rank can compute: a batch with a send and a receive to the rank
itself, uneven all_gather and reduce_scatter, the 'lifted' reduce_scatter, premul sum,
torch_npu.distributed's uneven tensor forms; and the refusals with torch_npu's messages (a
non-contiguous tensor, a CPU tensor, an internal-format view at an offset); HCCL's group
(the backend's _group_start/_group_end) and torch's coalescing manager given the device; uneven
lists that disagree between ranks, a call mismatch.

    hccl-npu --devices 2 torchrun --nproc-per-node 2 npu_ascend_ops.py
"""

import os

import torch
import torch.distributed as dist
import torch_npu

rank = int(os.environ["LOCAL_RANK"])
torch.npu.set_device(rank)
dist.init_process_group("hccl")
world, me = dist.get_world_size(), dist.get_rank()


def block(r, n, scale=1.0):
    """Rank r's contribution of n elements (every rank can compute every rank's)."""
    return (torch.arange(n, dtype=torch.float32) + 100 * r) * scale


# a batch with a send and a receive to the rank itself, in the order that posts the receive first
a, b, c = torch.full((4,), float(me), device="npu"), torch.empty(4, device="npu"), torch.empty(4, device="npu")
ops = [
    dist.P2POp(dist.irecv, b, me),
    dist.P2POp(dist.isend, a, me),
    dist.P2POp(dist.isend, a, (me + 1) % world),
    dist.P2POp(dist.irecv, c, (me - 1) % world),
]
for work in dist.batch_isend_irecv(ops):
    work.wait()
assert b.cpu().tolist() == [float(me)] * 4 and c.cpu().tolist() == [float((me - 1) % world)] * 4, (b, c)

# what Ascend refuses, refused with torch_npu's own text as a plain RuntimeError, before data moves
for bad, text in (
    (torch.ones(4, 4, device="npu").t(), "Tensors must be contiguous"),
    (torch.ones(2), "No backend type associated with device type cpu"),
):
    try:
        dist.all_reduce(bad)
        raise SystemExit(f"not refused: {text}")
    except RuntimeError as err:
        assert type(err) is RuntimeError and str(err).startswith(text), err

# all_gather of other sizes per rank
sizes = [3 + r for r in range(world)]
outs = [torch.empty(n, device="npu") for n in sizes]
dist.all_gather(outs, block(me, sizes[me]).npu())
assert all(torch.equal(o.cpu(), block(r, n)) for r, (o, n) in enumerate(zip(outs, sizes))), outs

# reduce_scatter of other sizes per block: rank r gets the sum of every rank's r-th block
ins = [block(me, n, r + 1).npu() for r, n in enumerate(sizes)]
out = torch.empty(sizes[me], device="npu")
dist.reduce_scatter(out, ins)
expected = sum(block(q, sizes[me], me + 1) for q in range(world))
assert torch.equal(out.cpu(), expected), (out, expected)

# the lifted reduce_scatter: 3 inputs of 5 elements, outputs of 4: flattened, cut or padded
flat = torch.cat([block(me, 5) for _ in range(3)])
lifted = torch.zeros(4 * world)
lifted[: min(15, 4 * world)] = flat[: 4 * world]
out = torch.empty(4, device="npu")
dist.reduce_scatter(out, [block(me, 5).npu() for _ in range(3)])
total = sum(
    torch.cat([torch.cat([block(q, 5) for _ in range(3)]), torch.zeros(max(0, 4 * world - 15))])[: 4 * world]
    for q in range(world)
)
assert torch.equal(out.cpu(), total[4 * me : 4 * me + 4]), (out, total)

# premul sum: the sum of factor * x
t = block(me, 6).npu()
dist.all_reduce(t, op=torch_npu.distributed._make_hccl_premul_sum(0.5))
assert torch.allclose(t.cpu(), 0.5 * sum(block(q, 6) for q in range(world))), t

# torch_npu.distributed's uneven tensor forms (rows split 1, 2, ...)
rows = [r + 1 for r in range(world)]
gathered = torch.empty(sum(rows), 2, device="npu")
torch_npu.distributed.all_gather_into_tensor_uneven(
    gathered, torch.full((rows[me], 2), float(me), device="npu"), output_split_sizes=rows
)
assert torch.equal(gathered.cpu(), torch.cat([torch.full((n, 2), float(r)) for r, n in enumerate(rows)]))
mine = torch.empty(rows[me], 2, device="npu")
torch_npu.distributed.reduce_scatter_tensor_uneven(mine, torch.ones(sum(rows), 2, device="npu"), input_split_sizes=rows)
assert torch.equal(mine.cpu(), torch.full((rows[me], 2), float(world)))

# an internal-format view that does not start its storage: refused as on Ascend, nothing moved
nz = torch_npu.npu_format_cast(torch.ones(4, 4, device="npu"), 29)
try:
    dist.all_reduce(nz[2:])
    raise SystemExit("internal format at an offset was not refused")
except RuntimeError as err:
    assert type(err) is RuntimeError and "storage_offset must be 0" in str(err) and "ERR02007" in str(err), err
dist.all_reduce(nz)  # at offset 0 it is served (the format is metadata here)
assert torch.equal(nz.cpu(), torch.full((4, 4), float(world)))

# HCCL's group (torch_npu's backend._group_start/_group_end): its calls complete together, so
# waiting for the first waited for the second, issued after it
backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("npu"))
x, y = torch.full((1 << 18,), me + 1.0, device="npu"), torch.full((8,), me + 1.0, device="npu")
backend._group_start()
work_x, work_y = dist.all_reduce(x, async_op=True), dist.all_reduce(y, async_op=True)
backend._group_end()
work_x.wait()
assert work_x.is_completed() and work_y.is_completed(), (work_x, work_y)
total = world * (world + 1) / 2
assert torch.equal(x.cpu(), torch.full((1 << 18,), total)) and torch.equal(y.cpu(), torch.full((8,), total)), (x, y)
try:
    backend._group_end()
    raise SystemExit("a group end without a start was not refused")
except RuntimeError as err:
    assert "group end without a group start" in str(err), err

# torch's coalescing manager given the device (as Ascend's test_coalesced_manager): one Work for its calls
ts = [torch.full((3,), me + 10.0 * i, device="npu") for i in range(3)]
with dist._coalescing_manager(device=torch.device("npu", rank), async_ops=True) as cm:
    for t in ts:
        dist.all_reduce(t)
cm.wait()
expected = [world * (world - 1) / 2 + world * 10.0 * i for i in range(3)]
assert [t.cpu().tolist() for t in ts] == [[e] * 3 for e in expected], (ts, expected)

# the functional collectives' out variant of all_gather (torch's C++ reaches the group through its
# dispatcher), large enough to be in flight when wait_tensor waits
out = torch.empty(2 * world, 4096, device="npu")
out = torch.ops._c10d_functional.all_gather_into_tensor_out(
    torch.full((2, 4096), float(me), device="npu"), world, dist.group.WORLD.group_name, out=out
)
out = torch.ops._c10d_functional.wait_tensor(out)
assert out[:, 0].cpu().tolist() == [float(r) for r in range(world) for _ in range(2)], out

# uneven lists that disagree between ranks but share the largest size: a call mismatch on every
# rank, no data (the last call: a mismatch aborts the communicator)
sizes = [2] * world
sizes[me] = 3  # each rank's own block is the big one: every rank's list differs from the others'
try:
    dist.all_gather([torch.empty(n, device="npu") for n in sizes], torch.ones(3, device="npu"))
    raise SystemExit("uneven lists that disagree moved data")
except dist.DistBackendError as err:
    assert "call mismatch" in str(err) and "counts #" in str(err), err
dist.destroy_process_group()
print(f"OK {me}", flush=True)
