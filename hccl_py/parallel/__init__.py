"""Distributed inference on simulated cards: data-parallel, pipeline-parallel, tensor-parallel,
expert-parallel and hybrid drivers over hccl-py communicators, and numpy models (an MLP, a
transformer encoder, a mixture-of-experts encoder) whose every kernel runs on the card.

    import hccl_py
    from hccl_py.parallel import DataParallel, PipelineParallel, TransformerEncoder, hybrid_groups

    comm = hccl_py.init()
    model = TransformerEncoder()                                  # 8 layers, d_model 256, seq 128
    x = model.sample_inputs(64)
    y = DataParallel(comm, model, policy="even").forward(x)       # every rank the whole model
    y = PipelineParallel(comm, model, microbatches=8).forward(x)  # one stage per rank
    pp_comm, dp_comm = hybrid_groups(comm, stages=2)              # 2 stages x (size/2) replicas
    y = DataParallel(dp_comm, PipelineParallel(pp_comm, model)).forward(x)
    y = TensorParallel(comm, model, overlap=True).forward(x)      # heads and MLP split over the cards
    tp_comm, dp_comm = tp_dp_groups(comm, tp=2)                   # tp groups x data-parallel replicas
    y = DataParallel(dp_comm, TensorParallel(tp_comm, model)).forward(x)
    moe = MoETransformer(MoEConfig(experts=8, top_k=2, router_skew=1.2))
    y = ExpertParallel(comm, moe).forward(moe.sample_inputs(64))  # experts spread, all_to_all_v

Run ``hccl-launch -n 4 examples/infer.py`` for the report these pieces add up to.
"""

from .balance import balanced_split, split_from_counts, stage_times
from .blas import limit_blas_threads
from .data_parallel import DataParallel
from .expert_parallel import ExpertParallel, ExpertParallelRun
from .gather import all_gather_objects
from .groups import hybrid_groups, hybrid_partitions, tp_dp_groups
from .mlp import MLPClassifier, MLPConfig
from .model import Block, Model, ModelShard, Ops, ParamSpec
from .moe import LayerRouting, MoEConfig, MoETransformer
from .overlap import Issuer
from .pipeline_parallel import PipelineParallel, PipelineRun, ideal_bubble
from .report import Measure, RankReport, format_rank_table, makespan_s
from .sharding import POLICIES, ShardPlan, even_plan, proportional_plan, work_stealing_plan
from .tensor_parallel import TensorParallel, TensorParallelRun
from .timeline import Segment, Timeline, chrome_trace, write_chrome_trace
from .transformer import TransformerConfig, TransformerEncoder

__all__ = [
    "POLICIES",
    "Block",
    "DataParallel",
    "ExpertParallel",
    "ExpertParallelRun",
    "Issuer",
    "LayerRouting",
    "MLPClassifier",
    "MLPConfig",
    "Measure",
    "MoEConfig",
    "MoETransformer",
    "Model",
    "ModelShard",
    "Ops",
    "ParamSpec",
    "PipelineParallel",
    "PipelineRun",
    "RankReport",
    "Segment",
    "ShardPlan",
    "TensorParallel",
    "TensorParallelRun",
    "Timeline",
    "TransformerConfig",
    "TransformerEncoder",
    "all_gather_objects",
    "balanced_split",
    "chrome_trace",
    "even_plan",
    "format_rank_table",
    "hybrid_groups",
    "hybrid_partitions",
    "ideal_bubble",
    "limit_blas_threads",
    "makespan_s",
    "proportional_plan",
    "split_from_counts",
    "stage_times",
    "tp_dp_groups",
    "work_stealing_plan",
    "write_chrome_trace",
]
