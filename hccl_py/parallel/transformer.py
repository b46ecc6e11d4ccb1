"""A transformer encoder classifier in numpy (BERT-style, pre-LayerNorm), every kernel on the card.

Blocks: ``embed`` (token + learned position embeddings), ``layers.0`` .. ``layers.{L-1}``
(LayerNorm -> multi-head self-attention -> residual; LayerNorm -> GELU MLP -> residual), ``head``
(final LayerNorm, mean over the sequence, linear classifier). Input: token ids ``(batch, seq_len)``
int64; output: logits ``(batch, classes)``.

Weight keys of the ``.npz`` format (``x @ weight + bias``, weights stored ``(in, out)``)::

    embed.tokens (vocab, d)            embed.positions (seq_len, d)
    layers.{i}.ln1.gamma (d)           layers.{i}.ln1.beta (d)
    layers.{i}.attn.qkv.weight (d, 3d) layers.{i}.attn.qkv.bias (3d)     # q, k, v concatenated; heads
    layers.{i}.attn.out.weight (d, d)  layers.{i}.attn.out.bias (d)      # are d/heads consecutive columns
    layers.{i}.ln2.gamma (d)           layers.{i}.ln2.beta (d)
    layers.{i}.mlp.fc1.weight (d, f)   layers.{i}.mlp.fc1.bias (f)       # f = mlp_ratio * d
    layers.{i}.mlp.fc2.weight (f, d)   layers.{i}.mlp.fc2.bias (d)
    head.ln.gamma (d)                  head.ln.beta (d)
    head.classifier.weight (d, classes) head.classifier.bias (classes)

Example::

    model = TransformerEncoder(TransformerConfig(layers=8, d_model=256, heads=4, seq_len=128), seed=0)
    logits = model.load(comm.device).forward(model.sample_inputs(16))     # (16, 10)
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
class TransformerConfig:
    """Sizes of the encoder. Defaults: 8 layers, d_model 256, 4 heads, seq 128, MLP 4x."""

    layers: int = 8
    d_model: int = 256
    heads: int = 4
    seq_len: int = 128
    vocab: int = 1000
    mlp_ratio: int = 4
    classes: int = 10

    def __post_init__(self) -> None:
        for name in ("layers", "d_model", "heads", "seq_len", "vocab", "mlp_ratio", "classes"):
            if getattr(self, name) < 1:
                raise HcclParamError(f"TransformerConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.heads:
            raise HcclParamError(f"TransformerConfig: d_model={self.d_model} is not divisible by heads={self.heads}")


def self_attention(ops: Ops, x: np.ndarray, qkv_weight: np.ndarray, qkv_bias: np.ndarray, heads: int) -> np.ndarray:
    """Multi-head self-attention of ``x`` ``(b, s, d)`` up to the output projection: the context
    ``(b, s, heads * dh)``. ``qkv_weight`` ``(d, 3 * heads * dh)`` holds q, k and v side by side,
    each head ``dh`` consecutive columns (a tensor-parallel card passes its own heads' columns)."""
    b, s, _ = x.shape
    dh = qkv_weight.shape[1] // (3 * heads)
    qkv = ops.linear(x, qkv_weight, qkv_bias)
    qkv = qkv.reshape(b, s, 3, heads, dh).transpose(2, 0, 3, 1, 4)  # (3, b, heads, s, dh): views, no kernel
    q, k, v = qkv[0], qkv[1], qkv[2]
    probs = ops.softmax(ops.matmul(q, k.swapaxes(-1, -2)), scale=1 / math.sqrt(dh))
    return ops.matmul(probs, v).transpose(0, 2, 1, 3).reshape(b, s, heads * dh)


class Embedding(Block):
    """``embed``: token embeddings plus learned position embeddings."""

    def __init__(self, cfg: TransformerConfig):
        self.prefix = "embed"
        self.params = (
            ParamSpec("tokens", (cfg.vocab, cfg.d_model)),
            ParamSpec("positions", (cfg.seq_len, cfg.d_model), scale=0.1),
        )

    def forward(self, ops: Ops, p: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        return ops.embedding(p["tokens"], x, p["positions"])


def attention_params(d: int) -> tuple[ParamSpec, ...]:
    """The pre-LayerNorm self-attention sublayer's parameters (``ln1``, ``attn``) at width ``d``,
    shared by the encoder layer and the MoE layer."""
    return (
        ParamSpec("ln1.gamma", (d,), "ones"),
        ParamSpec("ln1.beta", (d,), "zeros"),
        ParamSpec("attn.qkv.weight", (d, 3 * d), scale=1 / math.sqrt(d)),
        ParamSpec("attn.qkv.bias", (3 * d,), scale=0.02),
        ParamSpec("attn.out.weight", (d, d), scale=1 / math.sqrt(d)),
        ParamSpec("attn.out.bias", (d,), scale=0.02),
    )


def attention_residual(ops: Ops, p: Mapping[str, np.ndarray], x: np.ndarray, heads: int) -> np.ndarray:
    """``x + attention(LayerNorm(x))``: the self-attention sublayer with its residual."""
    context = self_attention(
        ops, ops.layer_norm(x, p["ln1.gamma"], p["ln1.beta"]), p["attn.qkv.weight"], p["attn.qkv.bias"], heads
    )
    return ops.add(x, ops.linear(context, p["attn.out.weight"], p["attn.out.bias"]))


class EncoderLayer(Block):
    """``layers.{index}``: pre-LayerNorm self-attention and GELU MLP, each with a residual."""

    def __init__(self, cfg: TransformerConfig, index: int):
        d, f = cfg.d_model, cfg.mlp_ratio * cfg.d_model
        self.prefix = f"layers.{index}"
        self.heads = cfg.heads
        self.params = (
            *attention_params(d),
            ParamSpec("ln2.gamma", (d,), "ones"),
            ParamSpec("ln2.beta", (d,), "zeros"),
            ParamSpec("mlp.fc1.weight", (d, f), scale=1 / math.sqrt(d)),
            ParamSpec("mlp.fc1.bias", (f,), scale=0.02),
            ParamSpec("mlp.fc2.weight", (f, d), scale=1 / math.sqrt(f)),
            ParamSpec("mlp.fc2.bias", (d,), scale=0.02),
        )

    def forward(self, ops: Ops, p: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        x = attention_residual(ops, p, x, self.heads)
        hidden = ops.gelu(
            ops.linear(ops.layer_norm(x, p["ln2.gamma"], p["ln2.beta"]), p["mlp.fc1.weight"], p["mlp.fc1.bias"])
        )
        return ops.add(x, ops.linear(hidden, p["mlp.fc2.weight"], p["mlp.fc2.bias"]))


class ClassifierHead(Block):
    """``head``: final LayerNorm, mean over the sequence, linear classifier to logits."""

    def __init__(self, cfg: TransformerConfig):
        d = cfg.d_model
        self.prefix = "head"
        self.params = (
            ParamSpec("ln.gamma", (d,), "ones"),
            ParamSpec("ln.beta", (d,), "zeros"),
            ParamSpec("classifier.weight", (d, cfg.classes), scale=1 / math.sqrt(d)),
            ParamSpec("classifier.bias", (cfg.classes,), scale=0.02),
        )

    def forward(self, ops: Ops, p: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        pooled = ops.mean(ops.layer_norm(x, p["ln.gamma"], p["ln.beta"]), axis=1)
        return ops.linear(pooled, p["classifier.weight"], p["classifier.bias"])


_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}


class TransformerEncoder(Model):
    """The encoder classifier; ``weights`` an ``.npz`` path (keys in the module doc) or a mapping,
    else deterministic from ``seed``."""

    name = "transformer"

    def __init__(
        self,
        config: TransformerConfig = TransformerConfig(),
        *,
        seed: int = 0,
        weights: "str | Path | Mapping[str, np.ndarray] | None" = None,
        dtype=np.float32,
    ):
        self.config = config
        blocks = [Embedding(config), *(EncoderLayer(config, i) for i in range(config.layers)), ClassifierHead(config)]
        super().__init__(blocks, seed=seed, weights=weights, dtype=dtype)

    def input_spec(self, batch: int) -> tuple[tuple[int, ...], np.dtype]:
        return (batch, self.config.seq_len), np.dtype(np.int64)

    def sample_inputs(self, batch: int, seed: int = 1234) -> np.ndarray:
        """Deterministic token ids ``(batch, seq_len)``: the same batch on every rank."""
        return np.random.default_rng(seed).integers(0, self.config.vocab, (batch, self.config.seq_len), dtype=np.int64)

    def describe(self) -> str:
        c = self.config
        return (
            f"transformer encoder: {c.layers} layers, d_model {c.d_model}, {c.heads} heads, seq {c.seq_len}, "
            f"{self.param_bytes() / 2**20:.1f} MiB {_SHORT.get(self.dtype.name, self.dtype.name)} weights"
        )
