"""A multilayer-perceptron classifier in numpy, every kernel on the card.

Blocks ``layers.0`` .. ``layers.{n}``: ``linear -> GELU`` for each hidden width, then a plain
``linear`` to the classes. Input ``(batch, in_features)`` float32; output logits ``(batch, classes)``.
Weight keys of the ``.npz`` format: ``layers.{i}.weight`` ``(in, out)`` and ``layers.{i}.bias``
``(out,)``.

Example::

    model = MLPClassifier(MLPConfig(in_features=784, hidden=(1024, 1024), classes=10))
    logits = model.load(comm.device).forward(model.sample_inputs(32))     # (32, 10)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ..errors import HcclParamError
from .model import Block, Model, Ops, ParamSpec


@dataclass(frozen=True)
class MLPConfig:
    """Widths of the classifier. Defaults: 784 -> 1024 x 4 -> 10."""

    in_features: int = 784
    hidden: tuple[int, ...] = (1024, 1024, 1024, 1024)
    classes: int = 10

    def __post_init__(self) -> None:
        widths = (self.in_features, *self.hidden, self.classes)
        if any(int(w) < 1 for w in widths):
            raise HcclParamError(f"MLPConfig: every width must be >= 1, got {widths}")
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))


class Dense(Block):
    """Layer ``index`` of the MLP: ``x @ weight + bias``, then GELU unless it is the last layer."""

    def __init__(self, index: int, n_in: int, n_out: int, activation: bool):
        self.prefix = f"layers.{index}"
        self.activation = activation
        self.params = (
            ParamSpec("weight", (n_in, n_out), scale=1 / math.sqrt(n_in)),
            ParamSpec("bias", (n_out,), scale=0.02),
        )

    def forward(self, ops: Ops, p: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        y = ops.linear(x, p["weight"], p["bias"])
        return ops.gelu(y) if self.activation else y


class MLPClassifier(Model):
    """The MLP; ``weights`` an ``.npz`` path or a mapping, else deterministic from ``seed``."""

    name = "mlp"

    def __init__(
        self,
        config: MLPConfig = MLPConfig(),
        *,
        seed: int = 0,
        weights: "str | Path | Mapping[str, np.ndarray] | None" = None,
        dtype=np.float32,
    ):
        self.config = config
        widths = (config.in_features, *config.hidden, config.classes)
        blocks = [Dense(i, widths[i], widths[i + 1], activation=i < len(widths) - 2) for i in range(len(widths) - 1)]
        super().__init__(blocks, seed=seed, weights=weights, dtype=dtype)

    def input_spec(self, batch: int) -> tuple[tuple[int, ...], np.dtype]:
        return (batch, self.config.in_features), self.dtype

    def sample_inputs(self, batch: int, seed: int = 1234) -> np.ndarray:
        """Deterministic features ``(batch, in_features)``, standard normal."""
        return (
            np.random.default_rng(seed).standard_normal((batch, self.config.in_features), np.float32).astype(self.dtype)
        )

    def describe(self) -> str:
        c = self.config
        widths = " -> ".join(str(w) for w in (c.in_features, *c.hidden, c.classes))
        return f"MLP classifier {widths}, {self.param_bytes() / 2**20:.1f} MiB fp32 weights"
