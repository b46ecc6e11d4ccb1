"""Settings of one hccl-bench invocation: a frozen dataclass, parsed once from the command line.

Nothing in benchmarks/ reads settings from globals; the config travels to every rank (pickled for
launch.spawn, as JSON for the mpiexec and gloo workers)::

    cfg = BenchConfig(collective="allreduce", nranks=2, minbytes=8, maxbytes=parse_size("1M"))
    BenchConfig.from_json(cfg.to_json()) == cfg      # True
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["BenchConfig", "DType", "DTYPES", "OPS", "PEERS", "parse_dtype"]

# The same bfloat16 hccl_py uses (not imported from it: the peers' workers never load hccl_py).
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
PEERS = ("mpi", "gloo", "torch-hccl", "unmodeled")  # implementations --vs accepts; "hccl" (hccl-py) always runs
OPS = ("sum", "prod", "max", "min")


@dataclass(frozen=True)
class DType:
    """An element type as the benchmark names it: CLI name, nccl-tests column name, numpy dtype."""

    name: str  # canonical CLI name: fp32
    label: str  # as nccl-tests prints it in the "type" column: float
    np_name: str  # numpy dtype name (bfloat16 via ml_dtypes)

    @property
    def np(self) -> np.dtype:
        """The numpy dtype (``ml_dtypes.bfloat16`` for bf16)."""
        return BFLOAT16 if self.np_name == "bfloat16" else np.dtype(self.np_name)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.np.itemsize


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("int8", "int8", "int8"),
        DType("uint8", "uint8", "uint8"),
        DType("int16", "int16", "int16"),
        DType("int32", "int32", "int32"),
        DType("int64", "int64", "int64"),
        DType("fp16", "half", "float16"),
        DType("bf16", "bfloat16", "bfloat16"),
        DType("fp32", "float", "float32"),
        DType("fp64", "double", "float64"),
    )
}
_DTYPE_ALIASES = {
    "char": "int8",
    "int": "int32",
    "half": "fp16",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float": "fp32",
    "float32": "fp32",
    "double": "fp64",
    "float64": "fp64",
}


def parse_dtype(text: str) -> DType:
    """``fp32``/``float``/``float32`` -> the fp32 DType; ValueError naming the choices otherwise."""
    key = text.strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(
            f"unknown data type {text!r}; use one of {', '.join(DTYPES)} (aliases: {', '.join(_DTYPE_ALIASES)})"
        )
    return DTYPES[key]


@dataclass(frozen=True)
class BenchConfig:
    """Everything one invocation measures and how (flags as nccl-tests / hccl_test)."""

    collective: str = "allreduce"
    nranks: int = 2  # -n
    minbytes: int = 8  # -b
    maxbytes: int = 64 << 20  # -e
    stepfactor: int = 2  # -f
    warmup: int = 5  # -w
    iters: int = 20  # -i
    dtype: str = "fp32"  # -d (canonical DTYPES key)
    op: str = "sum"  # -o
    root: int = 0  # -r
    check: bool = True  # -c
    algo: str = "auto"  # --algo (hccl-py only; the peers choose their own algorithms)
    peers: tuple[str, ...] = ()  # --vs
    repeats: int = 3  # --repeats: whole sweeps per implementation; the median per size is reported
    mem_budget: int = 256 << 20  # bytes of per-iteration buffers per rank and size (see harness)
    timeout_s: float = 900.0  # one implementation's one sweep; a hung run is stopped after it

    def __post_init__(self) -> None:
        problems = []
        if self.nranks < 1:
            problems.append(f"-n must be >= 1 (got {self.nranks})")
        if self.minbytes < 1 or self.maxbytes < self.minbytes:
            problems.append(f"need 1 <= -b <= -e (got -b {self.minbytes}, -e {self.maxbytes})")
        if self.stepfactor < 1 or (self.stepfactor == 1 and self.minbytes != self.maxbytes):
            problems.append(f"-f must be >= 2 (or 1 with -b == -e), got {self.stepfactor}")
        if self.warmup < 0 or self.iters < 1:
            problems.append(f"need -w >= 0 and -i >= 1 (got -w {self.warmup}, -i {self.iters})")
        if self.dtype not in DTYPES:
            problems.append(f"unknown dtype {self.dtype!r}")
        if self.op not in OPS:
            problems.append(f"-o must be one of {', '.join(OPS)} (got {self.op!r})")
        if not 0 <= self.root < self.nranks:
            problems.append(f"-r {self.root} is not a rank of {self.nranks}")
        if self.repeats < 1:
            problems.append(f"--repeats must be >= 1 (got {self.repeats})")
        unknown = [p for p in self.peers if p not in PEERS]
        if unknown:
            problems.append(f"--vs takes {', '.join(PEERS)} (got {', '.join(unknown)})")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def dt(self) -> DType:
        """The :class:`DType` of ``dtype``."""
        return DTYPES[self.dtype]

    def replace(self, **changes: Any) -> "BenchConfig":
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        """The config as JSON text, as the mpiexec and gloo workers read it."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "BenchConfig":
        """The config :meth:`to_json` wrote (validated again)."""
        data = json.loads(text)
        data["peers"] = tuple(data.get("peers", ()))
        return cls(**data)
