"""Ascend's rules under hccl-npu: a batch with a send and a receive to the rank itself works; a
non-contiguous tensor and a CPU tensor are refused with torch_npu's messages.

    hccl-npu --devices 2 torchrun --nproc-per-node 2 npu_rules.py
"""
import os, torch, torch.distributed as dist, torch_npu
r = int(os.environ["LOCAL_RANK"]); torch.npu.set_device(r)
dist.init_process_group("hccl")
w = dist.get_world_size(); me = dist.get_rank()
a = torch.full((4,), float(me), device="npu"); b = torch.empty(4, device="npu"); c = torch.empty(4, device="npu")
ops = [dist.P2POp(dist.irecv, b, me), dist.P2POp(dist.isend, a, me), dist.P2POp(dist.isend, a, (me+1)%w), dist.P2POp(dist.irecv, c, (me-1)%w)]
for wk in dist.batch_isend_irecv(ops): wk.wait()
print(f"{me} {b.tolist()} {c.tolist()}", flush=True)  # one write: ranks share the pipe
x = torch.ones(4, 4, device="npu").t()
try:
    dist.all_reduce(x)
except RuntimeError as e: print(f"noncontig: {str(e).splitlines()[0]}", flush=True)
try:
    y = torch.ones(2); dist.all_reduce(y); print(f"cpu passed {y}", flush=True)
except RuntimeError as e: print(f"cpu: {str(e).splitlines()[0]}", flush=True)
dist.destroy_process_group()
