"""A ctypes client of HCCL's C API in vLLM-ascend's pyhccl shape (written for hccl-py's tests):
a gloo group carries the root info as a ByteTensor, the library is HCCL_SO_PATH, the buffers are
npu tensors' data_ptr() and the stream torch.npu.current_stream().npu_stream.

    hccl-npu --devices 2 torchrun --nproc-per-node 2 pyhccl_client.py
"""

import ctypes
import os

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401


def pytest_approx(value: float) -> float:
    """``value`` as a C float holds it (aclrtEventElapsedTime writes a float)."""
    return ctypes.c_float(value).value


class RootInfo(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 4108)]


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.npu.set_device(rank)
device = torch.device(f"npu:{rank}")
lib = ctypes.CDLL(os.environ["HCCL_SO_PATH"])
lib.HcclGetErrorString.restype = ctypes.c_char_p
lib.HcclGetRootInfo.argtypes = [ctypes.POINTER(RootInfo)]
lib.HcclCommInitRootInfo.argtypes = [
    ctypes.c_int,
    ctypes.POINTER(RootInfo),
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_void_p),
]
lib.HcclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
lib.HcclAllReduce.argtypes += [ctypes.c_void_p, ctypes.c_void_p]
lib.HcclBroadcast.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
lib.HcclBroadcast.argtypes += [ctypes.c_void_p]
lib.HcclCommDestroy.argtypes = [ctypes.c_void_p]

root = RootInfo()
if rank == 0:
    with torch.npu.device(device):
        assert lib.HcclGetRootInfo(ctypes.byref(root)) == 0
carrier = torch.ByteTensor(list(root.internal))  # as vLLM sends it: a tensor of its bytes
dist.broadcast(carrier, src=0)
for i, byte in enumerate(carrier.tolist()):
    root.internal[i] = byte
comm = ctypes.c_void_p()
with torch.npu.device(device):
    assert lib.HcclCommInitRootInfo(world, ctypes.byref(root), rank, ctypes.byref(comm)) == 0

stream = torch.npu.current_stream()
x = torch.arange(1024, dtype=torch.float32, device=device) + rank
out = torch.empty_like(x)
start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
assert start.npu_event == 0  # as torch_npu's: the aclrtEvent is made at the first record
start.record(stream)
code = lib.HcclAllReduce(x.data_ptr(), out.data_ptr(), x.numel(), 4, 0, comm, stream.npu_stream)
assert code == 0, lib.HcclGetErrorString(code)
end.record(stream)
stream.synchronize()
# an Event's npu_event is its aclrtEvent: C reads the stamps torch recorded, C records what torch reads
ms = ctypes.c_float()
handles = ctypes.c_void_p(start.npu_event), ctypes.c_void_p(end.npu_event)
assert lib.aclrtEventElapsedTime(ctypes.byref(ms), *handles) == 0
assert start.elapsed_time(end) > 0 and ms.value == pytest_approx(start.elapsed_time(end)), (ms, start.elapsed_time(end))
assert lib.aclrtRecordEvent(start, stream) == 0  # an Event is its aclrtEvent, as a Stream is its aclrtStream
assert start.elapsed_time(end) == 0.0
assert lib.aclrtEventElapsedTime(ctypes.byref(ms), ctypes.c_void_p(123456), handles[1]) != 0  # no event there
expected = torch.arange(1024, dtype=torch.float32) * world + sum(range(world))
assert torch.equal(out.cpu(), expected), out[:4]

y = torch.full((257,), float(rank * 10 + 3), dtype=torch.float16, device=device)
assert lib.HcclBroadcast(y.data_ptr(), y.numel(), 3, world - 1, comm, stream) == 0  # a Stream is its aclrtStream
assert torch.equal(y.cpu(), torch.full((257,), float((world - 1) * 10 + 3), dtype=torch.float16))

# a CPU tensor is no card memory: refused on every rank, the communicator still usable
cpu = torch.zeros(16)
assert lib.HcclAllReduce(cpu.data_ptr(), cpu.data_ptr(), 16, 4, 0, comm, stream.npu_stream) == 1
code = lib.HcclAllReduce(x.data_ptr(), x.data_ptr(), x.numel(), 4, 2, comm, stream.npu_stream)  # in place, max
assert code == 0 and torch.equal(x.cpu(), torch.arange(1024, dtype=torch.float32) + world - 1)

# Ray's way: no argtypes at all, pointers wrapped in c_void_p, counts and enums as plain ints
untyped = ctypes.CDLL(os.environ["HCCL_SO_PATH"])  # a handle of its own: its functions carry no argtypes
z = torch.full((300,), float(rank + 1), device=device)
code = untyped.HcclAllReduce(
    ctypes.c_void_p(z.data_ptr()),
    ctypes.c_void_p(z.data_ptr()),
    z.numel(),
    4,
    2,
    comm,
    ctypes.c_void_p(stream.npu_stream),
)
assert code == 0 and torch.equal(z.cpu(), torch.full((300,), float(world))), code

# aclrtMalloc books the npu device's pool: one HBM ledger per card
before = torch.npu.memory_allocated(rank)
buf = ctypes.c_void_p()
assert lib.aclrtMalloc(ctypes.byref(buf), ctypes.c_size_t(1 << 20), 0) == 0
assert torch.npu.memory_allocated(rank) - before == 1 << 20
free, total = ctypes.c_size_t(), ctypes.c_size_t()
assert lib.aclrtGetMemInfo(1, ctypes.byref(free), ctypes.byref(total)) == 0
assert (free.value, total.value) == torch.npu.mem_get_info(rank)
assert lib.HcclAllReduce(buf, buf, (1 << 20) // 4, 4, 0, comm, stream.npu_stream) == 0  # aclrtMalloc's memory too
assert lib.aclrtFree(buf) == 0 and torch.npu.memory_allocated(rank) == before

assert lib.HcclCommDestroy(comm) == 0
dist.destroy_process_group()
print(f"rank {rank}: ok")
