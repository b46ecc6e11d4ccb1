"""Link and card figures: the one table every modeled time is computed from.

Every number carries, in the comment next to it, a public source that states it, or the word
*estimate* and the reasoning. Bandwidths are **per direction** in bytes/s and are what transfers
*achieve*, not the line rate (links are full duplex: a flow A->B does not slow a flow B->A);
latencies are per hop in seconds, and a route's latency (the sum over its hops) is the fixed cost
of one transfer over it: the DMA or RDMA task plus the notify handshakes HCCL posts around it,
what a point-to-point transfer pays. Where a collective step pays more than that (between 910B
servers: the notify records and stream synchronisation of HCCL's collective steps), the link
kind's ``step_sync_s`` per hop adds it to every transfer of a collective step. A
user overrides any figure from a JSON file with :func:`load_figures` (``hccl-calibrate`` writes
such files from hccl_test logs). ``docs/fidelity.md`` holds the figures against public
measurements (``hccl-sim validate``).

Sources cited below (quotes are in docs/fidelity.md and hccl_py/planning/fidelity/measurements.json):

[HCOMM-CAP] Huawei CANN hcomm (the HCCL algorithm layer), device_capacity.cc: the per-link
         bandwidths HCCL itself assumes, "// 常用带宽值   GB/s" used as GiB/s (x GB2B = 1024^3 in
         coll_alg_operator.cc): BANDWIDTH_HCCS_910A = 10.0f, BANDWIDTH_HCCS_910B = 18.3f,
         BANDWIDTH_RDMA_910A = 12.5f * 0.8, BANDWIDTH_RDMA_910B = 25.0f * 0.8,
         BANDWIDTH_PCIE_GEN4 = 32.0f * 0.85; and which dtypes and ops each chip reduces *inline*
         (IsDataTypeSupport / IsRedOpSupport, the SDMA engine reducing as it writes):
         910B fp32/fp16/int8/int16/int32/bf16 with sum/max/min; 910 fp32 sum; 310P3 fp32/int16/fp16 sum.
         https://github.com/libochao-huawei/hcomm/blob/8958adbf038b710779d790842b36b504c185c9e4/src/legacy/ascend910/platform/common/device_capacity.cc
[HCOMM-TASK] the same repository, src/legacy/ascend910/common/debug/profiling/task_profiling.h
         (HCCL's own task-time estimator): "SDMA的固定开销按照0.6us(<512KB), 1.5us(>512KB)计算",
         "RDMA的固定开销按照7us计算(实测7us)", "RDMA实测大包单流带宽为 12.5 GB(刨去协议头, 取12GB)",
         "统一按照10GB计算, CCE reduce的固定开销按照0.6us计算", "统一按1us算(片间1us, 片内0.5us),
         Notify Wait按0.02us估计".
[LIM]    gameofdimension/limulidae README (commit 27a8db0): torch_npu collectives on 2/4/8 x 910B,
         CANN 8.0.0.beta1: all_gather 38/64/149 GB/s, all_reduce 18/30/72 GB/s; matmul BF16 328,
         FP32 87 TFLOPS.
[FLAGPERF] FlagOpen/FlagPerf, Huawei-contributed Atlas 800T A2 results (later deleted from the
         tree): 8192^3 matmul FP16 313.182, BF16 304.277, FP32 82.920, INT8 608.554 TFLOPS;
         ascend-dmi d2h 24.926 GB/s.
[TPTD]   zzc0721/torch-performance-test-data: torch.mm on 910B2 by size (FP16 1024^2 98.08 ...
         4096^2 314.52 TFLOPS) and on 910ProA (FP32 39.83, FP16 110.01, BF16 1.11 TFLOPS; the
         database's own note: "仅供参考，910 有硬件向量缓存，基准测试不准").
[GUS]    Kirrito-k423/GroundUpScale issue-36 M-sweep on 910B2: "初步 median latency 从小 Shape 的约
         15–19 μs" for small fp32 matmuls (preliminary).
[HC31]   Huawei, "DaVinci: A Scalable Architecture for Neural Network Computing", Hot Chips 31
         (2019), as summarised at https://vengineer.hatenablog.com/entry/2019/09/06/070000:
         Ascend 910 "256 TFLOPS@FP16, 512 TOPS@INT8", "3x 240Gbps HCCS ports",
         "RoCE v2 ((2x100Gbps : for networking)"; cube = 4096 FP16 or 8192 INT8 MACs per cycle.
[LINLEY] Linley Group Microprocessor Report, "Huawei Delivers Powerful AI Training", 2019-10-08:
         Ascend 910 with four HBM2 stacks, 32 GB HBM2.
[AC-DS]  A. Chiao, "GPU Performance (Data Sheets) Quick Reference (2023)",
         https://arthurchiao.art/blog/gpu-data-sheets/ : Ascend 910B FP16 "320" TFLOPS, INT8
         "640", "64G HBM2e", HCCS "56GB/s" one-to-one (both directions), "392GB/s" one-to-many.
[AC-910B] A. Chiao, https://arthurchiao.art/blog/gpu-advanced-notes-2-zh/ : npu-smi on an
         8 x 910B server: 65536 MB HBM per NPU, HCCS between every pair, "网卡: 2*100G + 8*200G",
         hccn_tool "Speed: 200000Mb/s".
[DEPLOYER] https://www.hiascend.com/document/detail/zh/mindcluster/730/deployer/deployerug/deployer_0025.html :
         Atlas 800 (model 9000) "每台训练节点上的8个NPU网口", Atlas 800T A2 "每台训练节点的8个NPU网口":
         8 NPU network ports per 8-NPU server, i.e. one per NPU.
[POPOMEN] https://popomen.github.io/2023/10/16/%5BAscend%5D910B%E6%9C%89%E5%93%AA%E4%BA%9B%E6%8F%90%E5%8D%87 :
         "910:每张卡自带一个 100GE 的RoCE网卡。 910B:每张卡自带一个 200GE 的RoCE网卡。"
[LLS]    JiusiServe/light-llm-simulator conf/hardware_config.py (third-party simulator, "vendor-
         published hardware specifications"): 910B2/910B3 local_memory_bandwidth=1.6 TB/s.
[A300IDUO] Atlas 300I Duo (two Ascend 310P chips): 280 TOPS INT8, 96 GB LPDDR4X, 408 GB/s,
         PCIe 4.0 x16, as reported from Gamers Nexus / ComputerBase teardown coverage,
         e.g. https://avalanchenoticias.com.br/servidores-clusters-supercomputadores-computadores-industriais-e-multiprocessadores/o-acelerador-huawei-atlas-300i-duo-e-equipado-com-um-par-de-chips-ascend-310-ai
[AAS]    ascend-ai-coding/awesome-ascend-skills (commit 62a4ecb), skills/training/hccl-test/
         references/testing-scenarios.md (PR #23, issue #19): HCCL Test allreduce, fp32, 8 KB - 1 GB, on
         2 servers x 8 Ascend 910B3, "mpirun -f hostfile -n 16 ./bin/all_reduce_test -p 8 -b 8K -e 1G";
         1 GB in 41234.5 us, 8 KB in 89.5 us (the rows of hccl_py/planning/fidelity/measurements.json).
[HIXL]   hicann/hixl benchmarks/A2_benchmark_performance.md (commit f337d49): one-sided RDMA WRITE
         between two A2 servers, one NPU pair, 22.5-22.6 GB/s from 512 KB blocks up (8M: 22.633).
[HIXL-COMM] hicann/hixl benchmarks/performance.md (commit 4fc88fa; the fidelity table's rows cite the
         same table at 9ed283b), A2, 双机数据, "ROCE（通信域）":
         HIXL's one-sided writes through an HCCL communicator, 128 MiB in blocks, D2rD: 16K 0.718,
         32K 1.404, 64K 2.847, 128K 5.502, 256K 11.203 GB/s, i.e. 22.8, 23.3, 23.0, 23.8, 23.4 us a
         block: a fixed cost of about 23 us a write, the data (0.7-11 us at 23.5 GB/s) hidden in it.
[MSMODELING] Ascend/msmodeling tensor_cast/device.py (commit 84fec85), a vendor performance model,
         not a measurement: A2 between servers 25 GB/s and 1.5 us with comm_efficiency 0.7, inside a
         server 196 GB/s and 0.5 us (0.7), comm_op_cost_s = 10 us a collective.
[CANN-MEM] CANN 8.0 application development API reference, aclrtMalloc / aclrtMallocAlign32
         (https://www.hiascend.com/document/detail/en/canncommercial/800/apiref/appdevgapi/aclcppdevg_03_0095.html):
         "This API does not perform implicit device synchronization or stream synchronization";
         "Performance deterioration will be caused by too frequent calls to aclrtMalloc and aclrtFree".
[CUMALLOC] University of Virginia CUDA notes, "Memory Allocation Overhead"
         (https://www.cs.virginia.edu/~mwb7w/cuda_support/memory_management_overhead.html): cudaMalloc
         costs "a relatively constant overhead of about 50 microseconds up to 512 KB. Above 512 KB,
         the overhead increases significantly" (an older NVIDIA GPU; no Ascend measurement is public).
[PRACT]  A practitioner report on CANN's architecture this project started from (not public;
         what is used of it is quoted here whole, and figures resting on it are estimates): "a well-tiled FP16 matmul on a 910B reaches about 70-80% of
         the theoretical peak"; "the Cube unit works on 16x16x16 blocks".
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from .errors import TopologyError

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """One physical link kind: ``bandwidth_Bps`` achieved per direction (bytes/s), ``latency_s``
    per hop (a route's hops add up to the fixed cost of one transfer, what a point-to-point
    transfer pays) and ``step_sync_s`` per hop (what a transfer inside a collective step pays on
    top of that: the notify records and stream synchronisation of HCCL's collective steps between
    servers; 0 where a step pays no more than a transfer).

    >>> LINK_KINDS["PCIE"].bandwidth_Bps
    24926000000.0
    """

    kind: str
    bandwidth_Bps: float
    latency_s: float
    step_sync_s: float = 0.0

    @property
    def step_latency_s(self) -> float:
        """What a transfer inside a collective step pays per hop: ``latency_s + step_sync_s``."""
        return self.latency_s + self.step_sync_s


@dataclass(frozen=True, slots=True)
class CardModel:
    """One NPU model.

    Compute: nominal peak rates per dtype (``peak_fp16_flops``, ``peak_bf16_flops``,
    ``peak_fp32_flops``, ``peak_int8_ops``), the fraction of peak a large, well-tiled matmul
    reaches (``matmul_efficiency``), HBM capacity (bytes) and bandwidth (bytes/s), and the fixed
    cost of launching one op on the card (``launch_overhead_s``: a compute kernel or a collective).

    Memory: ``segment_alloc_s``, what the runtime takes to reserve one more segment of HBM for a
    memory pool (aclrtMalloc, as torch_npu's caching allocator calls it when the pool grows).

    Reduction in collectives: a received buffer is reduced *inline* by the transfer engine (no
    extra time) when its dtype is in ``inline_reduce_dtypes`` and the op in ``inline_reduce_ops``;
    otherwise by a vector-unit kernel costing ``reduce_launch_s`` + bytes / ``vector_bandwidth_Bps``.

    >>> CARD_MODELS["ascend910b"].hbm_bytes // 2**30
    64
    """

    name: str
    peak_fp16_flops: float
    hbm_bytes: int
    hbm_bandwidth_Bps: float
    vector_bandwidth_Bps: float
    launch_overhead_s: float
    peak_bf16_flops: float = 0.0
    peak_fp32_flops: float = 0.0
    peak_int8_ops: float = 0.0
    matmul_efficiency: float = 1.0
    reduce_launch_s: float = 0.0
    inline_reduce_dtypes: tuple[str, ...] = ()
    inline_reduce_ops: tuple[str, ...] = ()
    segment_alloc_s: float = 0.0

    def peak_flops(self, dtype: str | None = None) -> float:
        """Nominal peak of ``dtype`` (numpy name: float16, bfloat16, float32, int8, ...); ``None``
        is FP16. Other types are charged as the nearest: float64 at half the FP32 rate (no FP64
        cube path on Ascend; twice the bytes per element, estimate), other integers at FP32's."""
        key = _DTYPE_KIND.get(dtype or "float16", "fp32")
        if key == "fp16":
            return self.peak_fp16_flops
        if key == "bf16":
            return self.peak_bf16_flops or self.peak_fp16_flops
        if key == "int8":
            return self.peak_int8_ops or self.peak_fp16_flops
        if key == "fp64":
            return (self.peak_fp32_flops or self.peak_fp16_flops) / 2
        return self.peak_fp32_flops or self.peak_fp16_flops

    def reduces_inline(self, dtype: str, op: str) -> bool:
        """Whether the transfer engine reduces ``dtype`` with ``op`` as it writes (HCCL's
        IsSupportSDMAReduce), so the reduction adds no time to the transfer."""
        return dtype in self.inline_reduce_dtypes and op in self.inline_reduce_ops


_DTYPE_KIND = {
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "int8": "int8",
    "uint8": "int8",
    "float64": "fp64",
}

# HCCL's own figures (GiB/s: device_capacity.cc's "GB/s" times GB2B = 1024^3) [HCOMM-CAP]
_HCCL_GB = float(GiB)

# The fixed cost of one SDMA transfer between chips [HCOMM-TASK]: a notify record before (the
# receiver is ready) and after (the data is there), 1 us each between chips, plus the SDMA task's
# own 0.6 us (transfers below 512 KB; 1.5 us above, where bandwidth dominates anyway).
_SDMA_TRANSFER_S = 1.0e-6 + 1.0e-6 + 0.6e-6
# The fixed cost of one RDMA transfer: three RDMA operations - the receiver's "ready" notify, the
# data write, the "done" notify (a notify to another server is an RDMA write) - each paying the
# RDMA task's fixed cost, "RDMA的固定开销按照7us计算(实测7us)" (measured) [HCOMM-TASK]. Estimate: the
# three-operation handshake is HCCL's transfer protocol as its task types show (notify record /
# wait around each DMA); the per-operation cost is HCCL's measurement.
_RDMA_TRANSFER_S = 3 * 7.0e-6
# A same-leaf RoCE route has 4 hops (card->NIC->leaf->NIC->card); the transfer's fixed cost is
# spread evenly over them (estimate: the split is not observable; a cross-leaf route's 2 more hops
# through the spine add 2 x this, i.e. about one more switch pair's forwarding and queueing).
_ROCE_HOP_S = _RDMA_TRANSFER_S / 4

# The cross-server model of 910B (A2) clusters: four terms FITTED, each a physical quantity held
# inside a public bound (docs/fidelity.md, "The cross-server terms"): three to the one public
# multi-server sweep, HCCL Test allreduce on 2 servers x 8 Ascend 910B3 [AAS], and the RDMA
# operation's cost to HIXL's writes through an HCCL communicator between two A2 servers [HIXL-COMM]:
# - achievable bandwidth of one 200 GbE RoCE port, per direction: 23.5 GB/s. Bounds: at most the
#   line rate, 200 Gb/s = 25 GB/s [AC-910B]; at least HCCL's own level-1 figure 25 x 0.8 GiB/s =
#   21.5 GB/s [HCOMM-CAP] less 20% (a vendor model, [MSMODELING], takes 25 GB/s x efficiency 0.7 =
#   17.5 GB/s). HIXL's one-sided RDMA writes between two A2 servers saturate at 22.5-22.6 GB/s [HIXL].
# - cost of one RDMA operation between servers, what a point-to-point write pays (HIXL's one-sided
#   write through a communicator, hccl-py's send): 7 us. Fitted to [HIXL-COMM]'s 16 KiB blocks,
#   22.8 us each = the op launch (15 us, estimate, below) + 0.7 us of data at 23.5 GB/s + 7.1 us;
#   HCCL's task estimator measured the same, "RDMA的固定开销按照7us计算(实测7us)" [HCOMM-TASK].
#   Bound 1.5..22.8 us: [MSMODELING]'s latency between A2 servers (a vendor model, not a
#   measurement) to the whole 16 KiB block through the communicator, launch and data included.
# - what a collective step's transfer between servers pays on top of that RDMA operation: the
#   receiver's ready notify and the done notify (each an RDMA write to the other server) and the
#   synchronisation of the main and sub streams around them: 53 us. Fitted to the sweep, which
#   needs a cross-server step (this + the RDMA operation) of 55-60 us; at its upper bound.
#   Bound 14..53 us: two notify records as RDMA operations, 2 x 7 us [HCOMM-TASK], to HCCL's own
#   level-1 per-step figure for the whole step, "float delay = LATENCY; // 静态时延 60 us"
#   (coll_alg_operator.cc), less the RDMA operation ([MSMODELING]: 10 us a collective).
# - ports' worth of bandwidth a server's level-1 traffic moves through at once on two servers:
#   1.21 (LEVEL1_PORTS below, at every server count); bound 1..8: one port per NPU, 8 per server [DEPLOYER]. HCCL's
#   level-1 runs every plane at once (each NPU's own port), so 8 would be HCCL's code on a
#   non-blocking fabric; the sweep moves about one port's worth (docs/fidelity.md says why).
# Not fitted: the chunking of a payload larger than HCCL_BUFFSIZE, HCCL's own 200 MB CCL buffer
# (hccl_py.algorithms.alltoallv_continuous.CCL_BUFFER_BYTES); the sweep's pipeline slices (at most 64 MiB) fit one loop.
ROCE200_PORT_Bps = 23.5e9
ROCE200_RDMA_OP_S = 7e-6
ROCE200_STEP_SYNC_S = 53e-6

# Vector-unit (TBE/CCE) reduction of a received buffer when the engine cannot reduce inline:
# HCCL's estimate, "统一按照10GB计算, CCE reduce的固定开销按照0.6us计算" [HCOMM-TASK].
_VECTOR_REDUCE_Bps = 10e9
_VECTOR_REDUCE_LAUNCH_S = 0.6e-6

# One op launched on the card (eager mode: from the host through the runtime's task queue).
# [GUS]: small fp32 matmuls on a 910B2 take "约 15–19 μs" median, far above their arithmetic
# (a 1x512x512 matmul is 0.5 MFLOP): 15 us, the low end, is the per-op fixed cost. The same cost
# reproduces [TPTD]'s small square matmuls (1024^2 FP16: 98 TFLOPS measured, 98 modeled).
# Collectives are launched through the same task queue, so each call pays it too (estimate; the
# only public per-collective gaps are larger: 150 us between ops in AI_CPU expansion on A3,
# hicann/hccl docs/zh/user_guide/hccl_env/comm_retry_perf_impact.md). 910 and 310P: the same
# figure (estimate: same runtime; no public measurement).
_LAUNCH_S = 15e-6

# One segment reserved for a memory pool (aclrtMallocAlign32, what torch_npu's caching allocator
# calls when the pool grows: 2 MiB segments for small blocks, 20 MiB from 1 MiB). Estimate: no
# public Ascend measurement; CANN says only that frequent aclrtMalloc / aclrtFree calls degrade
# performance [CANN-MEM]. cudaMalloc was measured at about 50 us a call from 4 KB to 512 KB and
# more above [CUMALLOC]: 50 us, a floor for the segments' sizes. All three cards (same runtime).
_SEGMENT_ALLOC_S = 50e-6

_910B_INLINE_DTYPES = ("float32", "float16", "int8", "int16", "int32", "bfloat16")  # [HCOMM-CAP]
_SUM_MAX_MIN = ("sum", "max", "min")  # [HCOMM-CAP] IsRedOpSupport, 910B / 910_93


LINK_KINDS: dict[str, LinkSpec] = {
    # Ascend 910 HCCS: HCCL's own figure for the 910's level-0 links, BANDWIDTH_HCCS_910A = 10 GiB/s
    # [HCOMM-CAP]. Nominal: 240 Gb/s (30 GB/s) per port, 3 ports [HC31]; as on the 910B (below)
    # transfers achieve well under the nominal, and no public 910 measurement exists.
    # Latency: one SDMA transfer between chips [HCOMM-TASK].
    "HCCS": LinkSpec("HCCS", 10.0 * _HCCL_GB, _SDMA_TRANSFER_S),
    # Ascend 910B HCCS, per NPU pair and direction: HCCL's own BANDWIDTH_HCCS_910B = 18.3 GiB/s
    # = 19.65 GB/s [HCOMM-CAP], which is what collectives achieve: [LIM]'s 2-card all_gather moves
    # 38/2 = 19 GB/s per direction over the one link, its 8-card all_gather 149 x 7/8 / 7 = 18.6 GB/s
    # per link. The nominal is 56 GB/s per pair counting both directions [AC-DS], 28 per direction.
    "HCCS_910B": LinkSpec("HCCS_910B", 18.3 * _HCCL_GB, _SDMA_TRANSFER_S),
    # PCIe gen4 x16 as an Ascend card achieves it: 24.926 GB/s device-to-host on an Atlas 800T A2
    # (ascend-dmi, 512 MiB) [FLAGPERF]; nominal 31.5 GB/s (16 GT/s x 16 x 128/130 / 8); HCCL assumes
    # 27.2 GiB/s (BANDWIDTH_PCIE_GEN4 = 32 x 0.85) [HCOMM-CAP]. Latency: an SDMA transfer
    # [HCOMM-TASK] over the two hops card -> switch/root -> card, split evenly (estimate).
    "PCIE": LinkSpec("PCIE", 24.926e9, _SDMA_TRANSFER_S / 2),
    # RoCE v2 over 100 GbE, one port per NPU on 910 servers ([DEPLOYER]: 8 NPU ports per 8-NPU
    # Atlas 800 (9000); [POPOMEN]: "910:每张卡自带一个 100GE 的RoCE网卡"; the chip has 2 x 100G RoCE
    # [HC31]): HCCL measured 12 GB/s for a large single-stream RDMA transfer ("RDMA实测大包单流带宽为
    # 12.5 GB(刨去协议头, 取12GB)") [HCOMM-TASK]. Latency: the RDMA transfer's fixed cost per hop.
    "ROCE100": LinkSpec("ROCE100", 12e9, _ROCE_HOP_S),
    # RoCE v2 over 200 GbE, one port per NPU on Atlas 800T A2 ([AC-910B]: 8 x 200G, "Speed:
    # 200000Mb/s"; [DEPLOYER]: 8 NPU ports per node; [POPOMEN]). FITTED, within bounds (above):
    # 23.5 GB/s a port, 7 us an RDMA operation (every transfer) and 53 us more in a collective step,
    # each spread over the route's 4 hops as ROCE100's. (Before the fit: HCCL's own
    # BANDWIDTH_RDMA_910B = 20 GiB/s [HCOMM-CAP] and 3 x 7 us.)
    "ROCE200": LinkSpec("ROCE200", ROCE200_PORT_Bps, ROCE200_RDMA_OP_S / 4, ROCE200_STEP_SYNC_S / 4),
    # The host path: through the CPU complex, i.e. peer-to-peer forwarding between CPU sockets or
    # staging in host DRAM. Estimate, no public figure: staging crosses PCIe twice and host memory
    # once, so about half a PCIe gen4 x16 direction, ~12 GB/s; software forwarding ~5 us.
    "HOST": LinkSpec("HOST", 12e9, 5.0e-6),
}

# A server's uplink: how many RoCE ports' worth of bandwidth a server's cross-server traffic moves
# through at once. HCCL's level 1 runs every plane at once (each NPU talks to the same-index NPUs
# of the other servers through its own port), so a non-blocking fabric gives 8 ports a server
# [DEPLOYER]; the one public multi-server sweep, 2 servers x 8 Ascend 910B3 [AAS], moves about one
# port's worth. FITTED to it (docs/fidelity.md, "The cross-server terms"); bound 1..8. A property
# of the cluster's network, not of HCCL: it holds at every server count, and a cluster with a
# non-blocking fabric says so in its figures file ({"links": {"ROCE200_UPLINK": {"bandwidth_Bps":
# 188e9}}}: 8 x 23.5 GB/s).
LEVEL1_PORTS = 1.21
# the uplink's link kind per NPU port kind; a port kind not listed reaches the leaf directly
SERVER_UPLINK = {"ROCE200": "ROCE200_UPLINK"}
LINK_KINDS["ROCE200_UPLINK"] = LinkSpec("ROCE200_UPLINK", LEVEL1_PORTS * ROCE200_PORT_Bps, 0.0)


CARD_MODELS: dict[str, CardModel] = {
    # Ascend 310P (Atlas 300I Pro/Duo inference cards), per chip.
    "ascend310p": CardModel(
        "ascend310p",
        # 140 TOPS INT8 per chip (280 for the two-chip Duo [A300IDUO]); the DaVinci cube does half
        # as many FP16 as INT8 MACs [HC31] -> 70 TFLOPS FP16 (derived; no published FP16 figure).
        peak_fp16_flops=140e12 / 2,
        peak_int8_ops=140e12,
        # Estimate: no public BF16 figure; charged at the FP16 rate.
        peak_bf16_flops=140e12 / 2,
        # Estimate: no public FP32 figure; the FP32/FP16 ratio measured on the 910B (87 / 320 [LIM],
        # [AC-DS]) applied to 70 TFLOPS.
        peak_fp32_flops=140e12 / 2 * 87 / 320,
        # Estimate: no measurement; the middle of "70-80% of the theoretical peak" [PRACT].
        matmul_efficiency=0.75,
        # The Duo carries 96 GB LPDDR4X over its two chips [A300IDUO]: 48 GB per chip. (No public
        # figure was found for the single-chip Atlas 300I Pro.)
        hbm_bytes=96 * GiB // 2,
        # 408 GB/s over two chips [A300IDUO] -> 204 GB/s per chip.
        hbm_bandwidth_Bps=408e9 / 2,
        vector_bandwidth_Bps=_VECTOR_REDUCE_Bps,
        reduce_launch_s=_VECTOR_REDUCE_LAUNCH_S,
        inline_reduce_dtypes=("float32", "int16", "float16"),  # [HCOMM-CAP], DEV_TYPE_310P3
        inline_reduce_ops=("sum",),
        launch_overhead_s=_LAUNCH_S,
        segment_alloc_s=_SEGMENT_ALLOC_S,
    ),
    # Ascend 910 (Atlas 300T / Atlas 800 model 9000).
    "ascend910": CardModel(
        "ascend910",
        peak_fp16_flops=256e12,  # [HC31]
        peak_int8_ops=512e12,  # [HC31]
        # The 910 has no BF16 cube path: torch.mm in BF16 measured 1.11 TFLOPS on a 910ProA [TPTD],
        # whose FP32 measured 39.83 TFLOPS; both are taken as peak x efficiency (so the peaks are
        # back-derived, estimate; the source marks its 910 numbers as for reference only).
        peak_bf16_flops=1.11e12 / 0.75,
        peak_fp32_flops=39.83e12 / 0.75,
        # Estimate: "70-80% of the theoretical peak" [PRACT]; the one 910 measurement (FP16 110 of
        # 256 TFLOPS [TPTD]) is flagged unreliable by its own source.
        matmul_efficiency=0.75,
        hbm_bytes=32 * GiB,  # 32 GB HBM2 [LINLEY]
        # Estimate: four HBM2 stacks [LINLEY] x 1024 bits x 2.4 Gb/s per pin (JEDEC JESD235B top
        # speed grade) / 8 = 1.23 TB/s; no public figure.
        hbm_bandwidth_Bps=1.2e12,
        vector_bandwidth_Bps=_VECTOR_REDUCE_Bps,
        reduce_launch_s=_VECTOR_REDUCE_LAUNCH_S,
        inline_reduce_dtypes=("float32",),  # [HCOMM-CAP], DEV_TYPE_910: fp32 sum only
        inline_reduce_ops=("sum",),
        launch_overhead_s=_LAUNCH_S,
        segment_alloc_s=_SEGMENT_ALLOC_S,
    ),
    # Ascend 910B (Atlas 800T A2).
    "ascend910b": CardModel(
        "ascend910b",
        # 320 TFLOPS FP16, 640 TOPS INT8 [AC-DS]; bins differ (910B2 353.8, 910B3 294.9 [LLS]).
        peak_fp16_flops=320e12,
        peak_int8_ops=640e12,
        # Estimate: no published BF16 figure; the cube runs BF16 at its FP16 rate: measured BF16
        # matmuls are within 3% of FP16 (304.3 vs 313.2 TFLOPS at 8192^3 [FLAGPERF]).
        peak_bf16_flops=320e12,
        # Estimate: no published FP32 figure; the best measured FP32 matmul (87 TFLOPS [LIM]) / the
        # efficiency below.
        peak_fp32_flops=87e12 / (313.182 / 320),
        # 313.182 TFLOPS measured for FP16 8192^3 matmuls (8-card average) [FLAGPERF] / 320.
        matmul_efficiency=313.182 / 320,
        hbm_bytes=64 * GiB,  # 64 GB HBM2e [AC-DS]; npu-smi reports 65536 MB [AC-910B]
        # 1.6 TB/s for 910B2/910B3 [LLS] (a third-party table; Huawei publishes no 910B datasheet).
        hbm_bandwidth_Bps=1.6e12,
        vector_bandwidth_Bps=_VECTOR_REDUCE_Bps,
        reduce_launch_s=_VECTOR_REDUCE_LAUNCH_S,
        inline_reduce_dtypes=_910B_INLINE_DTYPES,
        inline_reduce_ops=_SUM_MAX_MIN,
        launch_overhead_s=_LAUNCH_S,
        segment_alloc_s=_SEGMENT_ALLOC_S,
    ),
}

Figures = tuple[dict[str, LinkSpec], dict[str, CardModel]]
FiguresArg = Union[Figures, str, os.PathLike, None]

_LINK_FIELDS = ("bandwidth_Bps", "latency_s", "step_sync_s")
_ZERO_ALLOWED_FIELDS = ("step_sync_s",)  # a collective step may pay no more than a transfer
_CARD_FIELDS = tuple(f.name for f in dataclasses.fields(CardModel) if f.name != "name")
_NAME_LIST_FIELDS = ("inline_reduce_dtypes", "inline_reduce_ops")
_FRACTION_FIELDS = ("matmul_efficiency",)


def load_figures(path: str | os.PathLike) -> Figures:
    """Read a JSON file that overrides any link or card figure; return ``(link_kinds, card_models)``.

    The file names only what it changes; everything else keeps the table's value::

        {"links": {"ROCE200": {"bandwidth_Bps": 2.0e10, "latency_s": 3e-6}},
         "cards": {"ascend910b": {"hbm_bytes": 34359738368}}}

    >>> links, cards = load_figures("figures.json")          # doctest: +SKIP
    >>> Topology.preset("2x8p-roce", figures=(links, cards))  # doctest: +SKIP

    Unknown sections, link kinds, card models or fields raise :class:`TopologyError` naming the key.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TopologyError(
            f"figures file {os.fspath(path)} is not a valid real path or cannot be read ({err.__class__.__name__}). "
            "Fix: pass an existing, readable JSON file.",
            "path",
            value=os.fspath(path),
            path=os.fspath(path),
            rule="file",
        ) from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise TopologyError(
            f"figures file {os.fspath(path)} is not valid JSON: {err}. "
            'Fix: write {"links": {...}, "cards": {...}}.',
            None,
            path=os.fspath(path),
            rule="json",
        ) from None
    return figures_from_dict(doc)


def figures_from_dict(doc: Any) -> Figures:
    """Apply an override document (the content of a figures file) to the default table."""
    if not isinstance(doc, dict):
        raise TopologyError(
            'figures must be a JSON object with "links" and/or "cards". Fix: write {"links": {...}, "cards": {...}}.',
            None,
            rule="type",
            expected="object",
        )
    links = dict(LINK_KINDS)
    cards = dict(CARD_MODELS)
    for section, value in doc.items():
        if section == "links":
            table, fields, defaults = links, _LINK_FIELDS, LINK_KINDS
        elif section == "cards":
            table, fields, defaults = cards, _CARD_FIELDS, CARD_MODELS
        else:
            raise TopologyError(
                f'unknown key {section!r} in figures. Fix: use "links" or "cards".',
                section,
                rule="unknown",
                choices=["links", "cards"],
            )
        if not isinstance(value, dict):
            raise TopologyError(
                f"figures {section!r} must map names to objects of fields.", section, rule="type", expected="object"
            )
        for name, override in value.items():
            if name not in defaults:
                raise TopologyError(
                    f"unknown {section[:-1]} {name!r} in figures. Fix: use one of {', '.join(sorted(defaults))}.",
                    f"{section}.{name}",
                    rule="unknown",
                    choices=sorted(defaults),
                )
            if not isinstance(override, dict):
                raise TopologyError(
                    f"figures {section}.{name} must be an object of fields.",
                    f"{section}.{name}",
                    rule="type",
                    expected="object",
                )
            changes = {}
            for field, number in override.items():
                key = f"{section}.{name}.{field}"
                if field not in fields:
                    raise TopologyError(
                        f"unknown field {field!r} for {section[:-1]} {name!r} in figures. "
                        f"Fix: use one of {', '.join(fields)}.",
                        key,
                        rule="unknown",
                        choices=list(fields),
                    )
                if field in _NAME_LIST_FIELDS:
                    changes[field] = _names(number, key)
                else:
                    changes[field] = _positive(
                        number, key, integral=(field == "hbm_bytes"), zero=(field in _ZERO_ALLOWED_FIELDS)
                    )
                    if field in _FRACTION_FIELDS and changes[field] > 1:
                        raise TopologyError(
                            f"Value [{number!r}] for figure {key} is invalid. Expected value: a fraction in (0, 1].",
                            key,
                            value=number,
                            rule="range",
                            expected="(0, 1]",
                        )
            table[name] = dataclasses.replace(table[name], **changes)
    return links, cards


def resolve_figures(figures: FiguresArg) -> Figures:
    """``None`` -> the default table; a path -> :func:`load_figures`; a pair -> used as given."""
    if figures is None:
        return LINK_KINDS, CARD_MODELS
    if isinstance(figures, (str, os.PathLike)):
        return load_figures(figures)
    if isinstance(figures, tuple) and len(figures) == 2 and all(isinstance(t, dict) for t in figures):
        return figures
    raise TopologyError(
        "figures must be None, a path to a JSON file, or the (link_kinds, card_models) pair returned by load_figures.",
        "figures",
        rule="type",
        expected="path or (link_kinds, card_models)",
    )


def _positive(value: Any, key: str, *, integral: bool, zero: bool = False) -> float | int:
    """``value`` as a positive finite number (``zero``: or 0), else TopologyError naming ``key``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        what = "a finite number, 0 or more" if zero else "a positive finite number"
        raise TopologyError(
            f"Value [{value!r}] for figure {key} is invalid. Expected value: {what}.",
            key,
            value=value,
            rule="positive",
        )
    if integral:
        if int(value) != value:
            raise TopologyError(
                f"Value [{value!r}] for figure {key} is invalid. Expected value: a whole number of bytes.",
                key,
                value=value,
                rule="type",
                expected="int",
            )
        return int(value)
    return float(value)


def _names(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TopologyError(
            f"Value [{value!r}] for figure {key} is invalid. Expected value: a list of names, "
            'e.g. ["float32", "float16"].',
            key,
            value=value,
            rule="type",
            expected="list of str",
        )
    return tuple(value)


def figures_to_dict(figures: "Figures") -> dict:
    """The JSON form of ``(link_kinds, card_models)``: every figure that differs from the table
    (what :func:`load_figures` reads back to the same pair)."""
    links, cards = figures
    out: dict[str, dict] = {}
    for name, spec in links.items():
        base = LINK_KINDS.get(name)
        diff = {f: getattr(spec, f) for f in _LINK_FIELDS if base is None or getattr(spec, f) != getattr(base, f)}
        if diff:
            out.setdefault("links", {})[name] = diff
    for name, card in cards.items():
        base = CARD_MODELS.get(name)
        diff = {}
        for f in _CARD_FIELDS:
            value = getattr(card, f)
            if base is None or value != getattr(base, f):
                diff[f] = list(value) if isinstance(value, tuple) else value
        if diff:
            out.setdefault("cards", {})[name] = diff
    return out
