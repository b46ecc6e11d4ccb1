"""Distributed inference on simulated cards: data-parallel, pipeline-parallel and hybrid drivers
over hccl-py communicators, and two numpy models whose every kernel runs on the card.

    import hccl_py
    from hccl_py.parallel import DataParallel, PipelineParallel, TransformerEncoder, hybrid_groups

    comm = hccl_py.init()
    model = TransformerEncoder()                                  # 8 layers, d_model 256, seq 128
    x = model.sample_inputs(64)
    y = DataParallel(comm, model, policy="even").forward(x)       # every rank the whole model
    y = PipelineParallel(comm, model, microbatches=8).forward(x)  # one stage per rank
    pp_comm, dp_comm = hybrid_groups(comm, stages=2)              # 2 stages x (size/2) replicas
    y = DataParallel(dp_comm, PipelineParallel(pp_comm, model)).forward(x)

Run ``hccl-launch -n 4 examples/infer.py`` for the report these pieces add up to.
"""

from .balance import balanced_split, split_from_counts, stage_times
from .blas import limit_blas_threads
from .data_parallel import DataParallel
from .gather import all_gather_objects
from .groups import hybrid_groups, hybrid_partitions
from .mlp import MLPClassifier, MLPConfig
from .model import Block, Model, ModelShard, Ops, ParamSpec
from .pipeline_parallel import PipelineParallel, PipelineRun, ideal_bubble
from .report import Measure, RankReport, format_rank_table, makespan_s
from .sharding import POLICIES, ShardPlan, even_plan, proportional_plan, work_stealing_plan
from .timeline import Segment, Timeline, chrome_trace, write_chrome_trace
from .transformer import TransformerConfig, TransformerEncoder

__all__ = [
    "POLICIES", "Block", "DataParallel", "MLPClassifier", "MLPConfig", "Measure", "Model", "ModelShard", "Ops",
    "ParamSpec", "PipelineParallel", "PipelineRun", "RankReport", "Segment", "ShardPlan", "Timeline",
    "TransformerConfig", "TransformerEncoder", "all_gather_objects", "balanced_split", "chrome_trace", "even_plan",
    "format_rank_table", "hybrid_groups", "hybrid_partitions", "ideal_bubble", "limit_blas_threads", "makespan_s",
    "proportional_plan", "split_from_counts", "stage_times", "work_stealing_plan", "write_chrome_trace",
]
