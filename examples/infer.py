"""Distributed inference on simulated Ascend cards: data-, pipeline-, tensor- or expert-parallel.

    hccl-launch -n 4 examples/infer.py                                      # dp, transformer, batch 64
    hccl-launch -n 4 examples/infer.py --mode pp --microbatches 8 --plot pp.png
    hccl-launch -n 4 --topology ascend910b-8p examples/infer.py --mode hybrid --stages 2
    hccl-launch -n 4 examples/infer.py --policy work-stealing --straggler 2:3  # rank 2 three times slower
    hccl-launch -n 4 examples/infer.py --mode tp --overlap                  # heads and MLP over 4 cards
    hccl-launch -n 4 examples/infer.py --mode tp --tp 2                     # 2 tp groups x 2 dp replicas
    hccl-launch -n 4 examples/infer.py --mode ep --router-skew 1.2 --capacity-factor 1.25 --overlap

Every rank builds the same model (deterministic weights, or --weights FILE.npz) and reads the same
batch; the chosen driver from ``hccl_py.parallel`` runs it over the cards. Rank 0 then runs the
whole batch on one fresh card of its own model (the single-card reference: the correctness check
and the 1-card modeled time) and prints one report: correctness, modeled throughput, speedup and
efficiency, wall time (labelled), per-rank compute / communication / waiting time and HBM peak,
the pipeline bubble, the experts' load (tokens per expert and per card, dropped and padded), and
the communication groups. It writes a Chrome trace of the modeled
timelines (--trace-dir, default traces/infer-<mode>) and with --plot a timeline picture.
Exit status 1 if the parallel output differs from the reference.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

import hccl_py
from hccl_py.modeled.card import Device
from hccl_py.parallel import (
    POLICIES,
    DataParallel,
    ExpertParallel,
    Measure,
    MLPClassifier,
    MLPConfig,
    MoEConfig,
    MoETransformer,
    PipelineParallel,
    TensorParallel,
    Timeline,
    TransformerConfig,
    TransformerEncoder,
    all_gather_objects,
    format_rank_table,
    hybrid_groups,
    hybrid_partitions,
    ideal_bubble,
    makespan_s,
    tp_dp_groups,
    write_chrome_trace,
)

_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

ATOL = RTOL = 1e-4  # fp32: shards see other batch shapes than the reference, so BLAS may round differently


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module doc), checked: ``--straggler`` parsed into (rank, factor) pairs."""
    p = argparse.ArgumentParser(
        prog="infer.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--mode",
        choices=("dp", "pp", "hybrid", "tp", "ep"),
        default="dp",
        help="data-, pipeline-, both- (hybrid), tensor- or expert-parallel",
    )
    p.add_argument("--model", choices=("transformer", "mlp"), default="transformer")
    p.add_argument("--batch", type=int, default=64, help="global batch (samples)")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per pipeline (pp, hybrid)")
    p.add_argument("--stages", type=int, default=2, help="pipeline stages per replica (hybrid)")
    p.add_argument("--split", default="balanced", help="pipeline cut: balanced, or blocks per stage, e.g. 3,3,2,2")
    p.add_argument("--policy", choices=POLICIES, default="even", help="data-parallel sharding (dp, hybrid)")
    p.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="samples per work-stealing chunk (default: the size whose modeled replay finishes first)",
    )
    p.add_argument(
        "--tp", type=int, default=None, help="cards per tensor-parallel group (tp; default all: no data parallelism)"
    )
    p.add_argument(
        "--overlap",
        action="store_true",
        help="tp, ep: issue the collectives asynchronously, overlapped with the next micro-batch's compute",
    )
    p.add_argument(
        "--chunks", type=int, default=2, help="micro-batches a card's batch is cut into with --overlap (tp, ep)"
    )
    p.add_argument("--experts", type=int, default=8, help="experts per MoE layer (ep)")
    p.add_argument("--top-k", type=int, default=2, help="experts per token (ep)")
    p.add_argument("--expert-hidden", type=int, default=512, help="hidden units of each expert (ep)")
    p.add_argument("--shared-hidden", type=int, default=512, help="hidden units of the shared expert, 0: none (ep)")
    p.add_argument(
        "--router-skew",
        type=float,
        default=0.0,
        help="Zipf exponent of expert popularity (ep): 0 uniform, 1.2 a few hot experts",
    )
    p.add_argument(
        "--capacity-factor",
        type=float,
        default=None,
        help="tokens per expert <= cf x tokens x top-k / experts, beyond dropped, below padded (ep; default dropless)",
    )
    p.add_argument("--layers", type=int, default=8, help="transformer layers")
    p.add_argument("--d-model", type=int, default=256, help="transformer width")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--seq", type=int, default=128, help="sequence length")
    p.add_argument("--hidden", default="1024,1024,1024,1024", help="MLP hidden widths")
    p.add_argument(
        "--weights", type=Path, default=None, help=".npz weights (keys: see hccl_py/parallel/transformer.py, mlp.py)"
    )
    p.add_argument("--seed", type=int, default=0, help="weights seed (without --weights); inputs use seed+1")
    p.add_argument(
        "--straggler",
        action="append",
        default=[],
        metavar="RANK:FACTOR",
        help="make RANK's compute FACTOR times slower (repeatable)",
    )
    p.add_argument(
        "--dry", action="store_true", help="modeled time only: kernels skip the arithmetic (no correctness check)"
    )
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png", help="write a per-rank timeline picture")
    p.add_argument(
        "--trace-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="directory for the Chrome trace infer_trace.json (default traces/infer-<mode>)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.batch < 1 or args.microbatches < 1 or args.chunks < 1:
        p.error("--batch, --microbatches and --chunks must be >= 1")
    if args.mode in ("tp", "ep") and args.model != "transformer":
        p.error(f"--mode {args.mode} splits a transformer (attention heads, experts): use --model transformer")
    if args.router_skew < 0 or (args.capacity_factor is not None and args.capacity_factor <= 0):
        p.error("--router-skew must be >= 0 and --capacity-factor > 0")
    try:
        args.straggler = [
            (int(who), float(factor or 2.0)) for who, _, factor in (s.partition(":") for s in args.straggler)
        ]
    except ValueError:
        p.error(f"--straggler takes RANK:FACTOR, e.g. 2:3, got {args.straggler}")
    if any(factor <= 0 for _, factor in args.straggler):
        p.error("--straggler FACTOR must be > 0")
    return args


def build_model(args):
    """The model ``args`` ask for: the MoE encoder for ``--mode ep``, else the transformer or the MLP."""
    if args.mode == "ep":
        cfg = MoEConfig(
            layers=args.layers,
            d_model=args.d_model,
            heads=args.heads,
            seq_len=args.seq,
            experts=args.experts,
            top_k=args.top_k,
            expert_hidden=args.expert_hidden,
            shared_hidden=args.shared_hidden,
            router_skew=args.router_skew,
            capacity_factor=args.capacity_factor,
        )
        return MoETransformer(cfg, seed=args.seed, weights=args.weights)
    if args.model == "transformer":
        cfg = TransformerConfig(layers=args.layers, d_model=args.d_model, heads=args.heads, seq_len=args.seq)
        return TransformerEncoder(cfg, seed=args.seed, weights=args.weights)
    hidden = tuple(int(h) for h in args.hidden.split(",") if h.strip())
    return MLPClassifier(MLPConfig(hidden=hidden), seed=args.seed, weights=args.weights)


class _Lines:
    """tqdm's redraws as whole lines, for a stream that is read line by line (hccl-launch's)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(total: int, enabled: bool):
    """A tqdm bar that shows up only if the run takes longer than 2 s; None if unavailable."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    if sys.stderr.isatty():
        return tqdm(total=total, unit="sample", delay=2.0, desc="parallel run", leave=False)
    return tqdm(
        total=total,
        unit="sample",
        delay=2.0,
        desc="parallel run",
        mininterval=2.0,
        file=_Lines(sys.stderr),
        ascii=True,
        leave=False,
    )


def describe_groups(comm, mode: str, stages: int) -> list[str]:
    """The report's lines on communication groups: who talks to whom with which calls, and the modeled
    bandwidth of each hop along a pipeline or tensor-parallel group (``stages``: pipeline stages, or
    the tensor-parallel size for tp)."""
    topo = comm.topology

    def hops(group):
        parts = []
        for a, b in zip(group, group[1:]):
            route = topo.route(a, b)
            parts.append(f"{a}->{b} {route.bandwidth_Bps / 1e9:.1f} GB/s")
        return ", ".join(parts)

    world = list(range(comm.size))
    if mode == "tp":
        if stages == comm.size:
            return [
                f"tensor-parallel {world} (world): all_reduce after attention and after the MLP, every layer ({hops(world)})"
            ]
        groups, replicas = hybrid_partitions(comm.size, stages)
        return [
            f"tensor-parallel {groups}: all_reduce after attention and after the MLP, every layer "
            f"({'; '.join(hops(g) for g in groups)})",
            f"data-parallel {replicas}: output all_gather (one group per tensor-parallel rank)",
        ]
    if mode == "ep":
        return [
            f"expert-parallel {world} (world): per layer all_gather routing counts, all_to_all_v dispatch and combine; "
            "output all_gather"
        ]
    if mode == "dp":
        return [f"data-parallel {world} (world): cost all_gather, output all_gather"]
    if mode == "pp":
        return [f"pipeline {world} (world): send/recv stage to stage ({hops(world)}), output broadcast"]
    pipelines, replicas = hybrid_partitions(comm.size, stages)
    return [
        f"pipelines {pipelines}: send/recv stage to stage ({'; '.join(hops(g) for g in pipelines)})",
        f"data-parallel {replicas}: cost all_gather, output all_gather (one group per stage)",
    ]


def main(argv=None) -> int:
    """One rank of the example: run the batch in parallel, check it on rank 0 and report; exit status 0,
    1 if the output differs from the one-card reference, 2 for a bad ``--tp``."""
    args = parse_args(argv)
    comm = hccl_py.init()
    rank, size = comm.rank, comm.size
    for who, factor in args.straggler:
        if who == rank:
            comm.device.slow_factor = factor
    comm.device.dry = args.dry
    model = build_model(args)
    x = model.sample_inputs(args.batch, seed=args.seed + 1)
    timeline = Timeline(comm.device)

    pipeline = tensor = experts = None
    tp_size = args.tp or size
    if args.mode == "tp" and (tp_size < 1 or size % tp_size):
        if rank == 0:
            print(f"infer.py: --tp {tp_size} does not divide the {size} ranks", file=sys.stderr)
        return 2
    if args.mode == "tp" and tp_size == size:
        driver = tensor = TensorParallel(comm, model, overlap=args.overlap, chunks=_chunks(args), timeline=timeline)
        role = f"tp rank {rank}"
    elif args.mode == "tp":
        tp_comm, dp_comm = tp_dp_groups(comm, tp_size)
        tensor = TensorParallel(tp_comm, model, overlap=args.overlap, chunks=_chunks(args), timeline=timeline)
        driver = DataParallel(dp_comm, tensor, policy=args.policy, chunk=args.chunk, timeline=timeline)
        role = f"tp rank {tp_comm.rank}, replica {dp_comm.rank}"
    elif args.mode == "ep":
        driver = experts = ExpertParallel(comm, model, overlap=args.overlap, chunks=_chunks(args), timeline=timeline)
        mine = experts.experts_of[rank]
        role = f"experts {mine[0]}-{mine[-1]}" if len(mine) > 1 else f"expert {mine[0]}"
    elif args.mode == "dp":
        driver = DataParallel(comm, model, policy=args.policy, chunk=args.chunk, timeline=timeline)
        role = f"replica {rank}"
    elif args.mode == "pp":
        driver = pipeline = PipelineParallel(
            comm, model, microbatches=args.microbatches, split=args.split, timeline=timeline
        )
        role = f"stage {rank}"
    else:
        pp_comm, dp_comm = hybrid_groups(comm, args.stages)
        pipeline = PipelineParallel(pp_comm, model, microbatches=args.microbatches, split=args.split, timeline=timeline)
        driver = DataParallel(dp_comm, pipeline, policy=args.policy, chunk=args.chunk, timeline=timeline)
        role = f"stage {pp_comm.rank}, replica {dp_comm.rank}"

    def my_share() -> int:
        if isinstance(driver, DataParallel):
            return driver.plan.counts[driver.comm.rank]
        if experts is not None:
            return experts.shares(args.batch)[rank]
        return args.batch

    bar = progress_bar(2 * args.batch, enabled=rank == 0 and not args.no_progress)

    done = [0.0]

    def on_piece(n: int) -> None:  # rank 0's pieces, scaled to the global batch
        if bar is not None:
            before = int(done[0])
            done[0] += n * args.batch / max(1, my_share())
            bar.update(int(done[0]) - before)

    comm.barrier()  # a common start: clocks and wall
    with Measure(comm.device) as measured:
        y = driver.forward(x, on_piece=on_piece)
    report = measured.report(rank, role, my_share(), timeline.segments)
    ran = pipeline is not None and pipeline.last is not None
    bubble = (pipeline.last.bubble_fraction, pipeline.last.microbatches) if ran else None
    gathered = all_gather_objects(comm, (report, bubble, pipeline.stage_blocks(pipeline.stage) if pipeline else None))
    if rank != 0:
        return 0

    # -- the single-card reference, on a fresh card of rank 0's model ------------------------------
    if bar is not None:
        bar.set_description("1-card reference")
    ref_card = Device(comm.device.model, rank=0, dry=args.dry)
    wall = time.perf_counter()
    reference = model.load(ref_card).forward(x)
    ref_wall = time.perf_counter() - wall
    if bar is not None:
        bar.update(args.batch)
        bar.close()

    reports = [g[0] for g in gathered]
    parallel_s = makespan_s(reports)
    one_card_s = ref_card.clock
    speedup = one_card_s / parallel_s if parallel_s > 0 else float("nan")
    card = comm.device.model.name
    err = float(np.max(np.abs(y.astype(np.float64) - reference))) if not args.dry else float("nan")
    ok = args.dry or bool(np.allclose(y, reference, atol=ATOL, rtol=RTOL))

    shape = {
        "dp": f"{size} data-parallel replicas",
        "pp": f"{size} pipeline stages",
        "hybrid": f"{size // args.stages} data-parallel replicas x {args.stages} pipeline stages",
        "tp": (
            f"{size} tensor-parallel cards"
            if tp_size == size
            else f"{size // tp_size} data-parallel replicas x {tp_size} tensor-parallel cards"
        ),
        "ep": f"{args.experts} experts over {size} cards",
    }[args.mode]
    if args.overlap and args.mode in ("tp", "ep"):
        shape += ", overlapped"
    print(
        f"== hccl-py distributed inference: {args.mode} ({shape}) on {size} x {card}, topology {comm.topology.name} =="
    )
    print(f"model        {model.describe()}")
    pieces = f"batch {args.batch}"
    if isinstance(driver, DataParallel):
        plan = driver.plan
        pieces += f", policy {args.policy}: samples per replica {list(plan.counts)}"
        if plan.policy == "work-stealing":
            pieces += f", chunk {plan.chunk}, chunks stolen {list(plan.steals)}"
    if pipeline is not None:
        ws = args.mode == "hybrid" and args.policy == "work-stealing"
        pieces += ", each chunk one micro-batch" if ws else f", {args.microbatches} micro-batches per pipeline"
    if tensor is not None:
        run = tensor.last
        per = run.elements // max(1, run.all_reduces) * model.dtype.itemsize
        pieces += (
            f"; heads per card {list(tensor.heads_per_card)}, MLP hidden per card {list(tensor.hidden_per_card)}; "
            f"{run.all_reduces} all_reduces of {_bytes(per)} per card"
            + (f" ({run.chunks} micro-batches, asynchronous)" if args.overlap else "")
        )
    if experts is not None:
        pieces += (
            f" ({', '.join(str(n) for n in experts.shares(args.batch))} sequences per card; attention data-parallel); "
            f"top-{args.top_k} of {args.experts} experts, experts per card "
            + str([list(e) for e in experts.experts_of])
            + (f"; {experts.chunks} micro-batches, dispatch and combine asynchronous" if args.overlap else "")
        )
    print(f"work         {pieces}")
    if experts is not None:
        for line in describe_experts(model, experts.last, args):
            print(line)
    for line in describe_groups(comm, args.mode, tp_size if args.mode == "tp" else args.stages):
        print(f"groups       {line}")
    if pipeline is not None:
        stages = {}
        for rep, _, blocks in gathered:
            stages.setdefault(rep.role.split(",")[0], blocks)
        print("stages       " + " | ".join(f"{name}: {_span(blocks)}" for name, blocks in stages.items()))
    if args.dry:
        print("correctness  not checked (--dry: kernels skipped the arithmetic)")
    else:
        same = ""
        if experts is not None:
            same = (
                "; routing equal to 1 card's"
                if [r.kept for r in model.routing()] == [r.kept for r in experts.last.layers]
                else "; routing differs from 1 card's"
            )
        print(
            f"correctness  max |parallel - 1 card| = {err:.3e}  ({'OK' if ok else 'MISMATCH'}, atol {ATOL:g} rtol {RTOL:g}){same}"
        )
    print(
        f"modeled      parallel {parallel_s * 1e3:.3f} ms -> {args.batch / parallel_s:,.0f} samples/s;  "
        f"1 card {one_card_s * 1e3:.3f} ms -> {args.batch / one_card_s:,.0f} samples/s"
    )
    print(
        f"             speedup {speedup:.2f}x over 1 card, parallel efficiency {100 * speedup / size:.1f}% on {size} cards"
    )
    if pipeline is not None:
        runs = [b for _, b, _ in gathered if b is not None]
        mean = sum(b for b, _ in runs) / len(runs)
        m = runs[0][1]  # micro-batches the pipelines ran (work-stealing chunks, or fewer if the batch is small)
        print(
            f"pipeline     bubble {100 * mean:.1f}% of the pipeline span idle per stage, {m} micro-batch{'es' if m != 1 else ''} "
            f"(equal stages, no transfers: (p-1)/(m+p-1) = {100 * ideal_bubble(pipeline.stages, m):.1f}%)"
        )
    print(
        f"wall clock   parallel run {max(r.wall_s for r in reports):.2f} s, 1-card reference {ref_wall:.2f} s "
        f"(this host, {_cores} cores shared by {size} ranks; not modeled)"
    )
    overlapped = args.overlap and args.mode in ("tp", "ep")
    if overlapped:
        comm_ms = sum(r.comm_s for r in reports) / len(reports) * 1e3
        exposed_ms = sum(r.exposed_s for r in reports) / len(reports) * 1e3
        print(
            f"overlap      per card (mean): communication {comm_ms:.3f} ms on the communication stream, {exposed_ms:.3f} ms "
            f"of it exposed (compute stood still at wait); micro-batches cost extra kernel launches and weight reads "
            f"(compare compute ms without --overlap)"
        )
    if experts is not None and size > 1:
        loads = experts.last.per_card(experts.last.processed)
        hot = max(range(size), key=lambda r: loads[r])
        print(
            f"waiting      per card {[round(r.wait_s * 1e3, 3) for r in reports]} ms (modeled); most expert rows on card {hot} "
            f"({loads[hot]}): the others wait for it in the all_to_all_v"
        )
    print("per rank (modeled):")
    print("  " + format_rank_table(reports, exposed=overlapped).replace("\n", "\n  "))

    labels = [f"rank {r.rank} ({r.role})" for r in reports]
    trace_dir = args.trace_dir or Path("traces") / f"infer-{args.mode}"
    trace = write_chrome_trace(trace_dir / "infer_trace.json", [r.segments for r in reports], labels)
    print(f"trace        {trace} (Chrome trace, modeled + wall tracks; open in https://ui.perfetto.dev)")
    if args.plot is not None:
        from hccl_py.parallel.plot import plot_timelines

        title = (
            f"{args.mode} on {size} x {card} ({comm.topology.name}): {model.name}, batch {args.batch}"
            + (f", {args.microbatches} micro-batches" if pipeline is not None else "")
            + f" — {parallel_s * 1e3:.2f} ms modeled, {speedup:.2f}x over 1 card"
        )
        plot_timelines(
            args.plot, [r.segments for r in reports], labels, title=title, origin_s=min(r.start_s for r in reports)
        )
        print(f"plot         {args.plot}")
    return 0 if ok else 1


def _bytes(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _chunks(args) -> int:
    return args.chunks if args.overlap else 1


def describe_experts(model, run, args) -> list[str]:
    """The report's lines on the experts' load: tokens per expert and per card, drops, padding."""
    layers = len(run.layers)
    lines = [
        f"router       skew {args.router_skew:g} (Zipf prior over popularity order {list(model.popularity)}: "
        f"{', '.join(f'{100 * v:.0f}%' for v in model.prior()[list(model.popularity)])})",
        f"experts      tokens per expert {list(run.processed)} (summed over {layers} layers)",
    ]
    cards = run.per_card(run.processed)
    even = sum(cards) / len(cards)
    lines.append(f"cards        tokens per card {list(cards)}: max / mean {max(cards) / even if even else 0:.2f}")
    routed, dropped, padded = sum(run.routed), sum(run.dropped), sum(run.padded)
    if args.capacity_factor is None:
        lines.append("capacity     dropless (no --capacity-factor): every expert takes what it is routed")
    else:
        rows = sum(run.processed) + padded
        lines.append(
            f"capacity     factor {args.capacity_factor:g} -> {run.capacity[0]} rows per expert per layer: dropped {dropped} "
            f"of {routed} assignments ({100 * dropped / max(1, routed):.1f}%), padded {padded} rows "
            f"({100 * padded / max(1, rows):.1f}% of the expert rows computed)"
        )
    return lines


def _span(blocks: list[str]) -> str:
    """'embed, layers.0-2' for a run of block names."""
    out, run = [], []
    for name in blocks:
        if name.startswith("layers.") and run and int(name.split(".")[1]) == int(run[-1].split(".")[1]) + 1:
            run.append(name)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1].split('.')[1]}")
        run = [name] if name.startswith("layers.") else []
        if not run:
            out.append(name)
    if run:
        out.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1].split('.')[1]}")
    return ", ".join(out)


if __name__ == "__main__":
    sys.exit(main())
