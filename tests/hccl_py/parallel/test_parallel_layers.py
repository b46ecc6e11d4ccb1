"""The model pieces in one process: every card kernel and whole layers against independent
float64 numpy formulas, roofline costs, dry runs, weights from .npz, and HBM exhaustion."""

from __future__ import annotations

import dataclasses
import gc
import math
import re

import numpy as np
import pytest

from hccl_py import HcclMemoryError, HcclParamError
from hccl_py.modeled.card import Device
from hccl_py.parallel import MLPClassifier, MLPConfig, TransformerConfig, TransformerEncoder
from topology import CARD_MODELS

CARD = CARD_MODELS["ascend910"]
RNG = np.random.default_rng(7)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# -- independent references (float64, written out longhand) ----------------------------------------
def ref_layer_norm(x, g, b, eps=1e-5):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def ref_softmax(z, scale=1.0):
    z = z.astype(np.float64) * scale
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ref_gelu(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def ref_encoder_layer(x, P, prefix, heads):
    p = {k[len(prefix) + 1 :]: v.astype(np.float64) for k, v in P.items() if k.startswith(prefix + ".")}
    batch, seq, d = x.shape
    dh = d // heads
    h = ref_layer_norm(x, p["ln1.gamma"], p["ln1.beta"])
    qkv = h @ p["attn.qkv.weight"] + p["attn.qkv.bias"]
    q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
    context = np.zeros((batch, seq, d))
    for b in range(batch):
        for j in range(heads):
            cols = slice(j * dh, (j + 1) * dh)
            scores = q[b][:, cols] @ k[b][:, cols].T / math.sqrt(dh)
            context[b][:, cols] = ref_softmax(scores) @ v[b][:, cols]
    x = x + context @ p["attn.out.weight"] + p["attn.out.bias"]
    hidden = ref_gelu(ref_layer_norm(x, p["ln2.gamma"], p["ln2.beta"]) @ p["mlp.fc1.weight"] + p["mlp.fc1.bias"])
    return x + hidden @ p["mlp.fc2.weight"] + p["mlp.fc2.bias"]


def ref_transformer(tokens, P, cfg):
    x = P["embed.tokens"].astype(np.float64)[tokens] + P["embed.positions"][: tokens.shape[1]]
    for i in range(cfg.layers):
        x = ref_encoder_layer(x, P, f"layers.{i}", cfg.heads)
    pooled = ref_layer_norm(x, P["head.ln.gamma"], P["head.ln.beta"]).mean(axis=1)
    return pooled @ P["head.classifier.weight"] + P["head.classifier.bias"]


# -- kernels -------------------------------------------------------------------------------------
def test_kernels_match_independent_formulas():
    dev = Device(CARD)
    x, w, b = _f32(3, 5, 8), _f32(8, 6), _f32(6)
    np.testing.assert_allclose(dev.linear(x, w, b), x.astype(np.float64) @ w + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dev.linear(x, w), x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dev.softmax(x, scale=0.5), ref_softmax(x, 0.5), rtol=1e-5, atol=1e-6)
    g, beta = _f32(8), _f32(8)
    np.testing.assert_allclose(dev.layer_norm(x, g, beta), ref_layer_norm(x, g, beta), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dev.gelu(x), ref_gelu(x), rtol=1e-5, atol=1e-6)
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(dev.gelu(x), 0.5 * x * (1 + erf(x / math.sqrt(2))), atol=2e-3)  # tanh form ~ exact GELU
    table, pos, ids = _f32(11, 4), _f32(6, 4), RNG.integers(0, 11, (2, 5))
    np.testing.assert_allclose(dev.embedding(table, ids, pos), table[ids] + pos[:5], rtol=1e-6)
    np.testing.assert_allclose(dev.mean(x, axis=1), x.astype(np.float64).mean(1), rtol=1e-5, atol=1e-6)


def test_kernels_cost_the_roofline():
    dev = Device(CARD)
    x, w, b = _f32(64, 256), _f32(256, 512), _f32(512)
    before = dev.clock
    out = dev.linear(x, w, b)
    flops = 2 * 64 * 256 * 512 + out.size
    nbytes = x.nbytes + w.nbytes + b.nbytes + out.nbytes
    expected = max(flops / CARD.peak_fp16_flops, nbytes / CARD.hbm_bandwidth_Bps) + CARD.launch_overhead_s
    assert dev.clock - before == pytest.approx(expected, rel=1e-12)
    assert dev.time.compute_s == pytest.approx(expected, rel=1e-12)
    slow = Device(CARD, slow_factor=3.0)
    slow.linear(x, w, b)
    assert slow.clock == pytest.approx(3 * expected, rel=1e-12)


def test_dry_card_advances_the_clock_alike_without_arithmetic():
    real, dry = Device(CARD), Device(CARD, dry=True)
    x, w, b, g = _f32(4, 16, 32), _f32(32, 32), _f32(32), _f32(32)
    for dev in (real, dry):
        y = dev.linear(x, w, b)
        y = dev.gelu(dev.layer_norm(y, g, b))
        s = dev.softmax(dev.matmul(y, y.swapaxes(-1, -2)), scale=0.1)
        z = dev.elementwise(np.add, s, s)
        m = dev.mean(z, axis=1)
        assert (y.shape, s.shape, z.shape, m.shape) == ((4, 16, 32), (4, 16, 16), (4, 16, 16), (4, 16))
    assert dry.clock == real.clock and dry.time == real.time


# -- whole models ----------------------------------------------------------------------------------
SMALL = TransformerConfig(layers=2, d_model=32, heads=4, seq_len=12, vocab=50, classes=5)


def test_transformer_matches_an_independent_implementation():
    model = TransformerEncoder(SMALL, seed=3)
    tokens = model.sample_inputs(3)
    out = model.load(Device(CARD)).forward(tokens)
    expected = ref_transformer(tokens, model.weights(), SMALL)
    assert out.shape == (3, 5) and out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_mlp_matches_the_formula():
    model = MLPClassifier(MLPConfig(in_features=20, hidden=(16, 8), classes=4), seed=1)
    x = model.sample_inputs(6)
    P = {k: v.astype(np.float64) for k, v in model.weights().items()}
    h = ref_gelu(ref_gelu(x @ P["layers.0.weight"] + P["layers.0.bias"]) @ P["layers.1.weight"] + P["layers.1.bias"])
    expected = h @ P["layers.2.weight"] + P["layers.2.bias"]
    np.testing.assert_allclose(model.load(Device(CARD)).forward(x), expected, rtol=1e-4, atol=1e-5)


def test_pieces_and_block_ranges_compose_to_the_whole():
    model = TransformerEncoder(SMALL)
    x = model.sample_inputs(7)
    whole = model.load(Device(CARD)).forward(x)
    np.testing.assert_allclose(model.load(Device(CARD)).forward(x, splits=[3, 3, 1]), whole, rtol=1e-5, atol=1e-5)
    front, back = model.load(Device(CARD), range(0, 2)), model.load(Device(CARD), range(2, 4))
    np.testing.assert_allclose(back.run_blocks(front.run_blocks(x)), whole, rtol=1e-5, atol=1e-5)


def test_weights_are_deterministic_per_tensor_and_round_trip_through_npz(tmp_path):
    a, b = TransformerEncoder(SMALL, seed=5).weights(), TransformerEncoder(SMALL, seed=5).weights()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    deeper = TransformerEncoder(dataclasses.replace(SMALL, layers=3), seed=5).weights()
    assert np.array_equal(
        deeper["layers.1.mlp.fc1.weight"], a["layers.1.mlp.fc1.weight"]
    )  # keyed by name, not position
    path = tmp_path / "w.npz"
    TransformerEncoder(SMALL, seed=5).save_npz(path)
    loaded = TransformerEncoder(SMALL, weights=path)
    x = loaded.sample_inputs(2)
    np.testing.assert_array_equal(
        loaded.load(Device(CARD)).forward(x), TransformerEncoder(SMALL, seed=5).load(Device(CARD)).forward(x)
    )


def test_bad_npz_names_the_key(tmp_path):
    weights = TransformerEncoder(SMALL).weights()
    weights.pop("layers.1.ln2.beta")
    np.savez(tmp_path / "missing.npz", **weights)
    with pytest.raises(HcclParamError) as info:
        TransformerEncoder(SMALL, weights=tmp_path / "missing.npz")
    assert (info.value.missing_keys, info.value.unexpected_keys) == (["layers.1.ln2.beta"], [])
    weights = TransformerEncoder(SMALL).weights()
    weights["head.classifier.bias"] = np.zeros(7, np.float32)
    np.savez(tmp_path / "shape.npz", **weights)
    model = TransformerEncoder(SMALL, weights=tmp_path / "shape.npz")
    with pytest.raises(HcclParamError) as info:
        model.load(Device(CARD))
    assert (info.value.key, info.value.value, info.value.rule) == ("head.classifier.bias", [7], "shape")
    assert info.value.expected == list(model.param_shapes()["head.classifier.bias"])


def test_model_too_big_for_the_card_raises_its_memory_error():
    tiny = dataclasses.replace(CARD, name="tiny", hbm_bytes=4 << 20)  # 4 MiB of HBM
    model = TransformerEncoder(TransformerConfig(layers=4, d_model=256, heads=4, seq_len=16))  # ~12 MiB of weights
    dev = Device(tiny)
    with pytest.raises(HcclMemoryError) as err:
        model.load(dev)
    assert err.value.code == 3
    assert re.fullmatch(r"weight layers\.\d+\..+", err.value.allocation)  # names the tensor
    assert err.value.requested > err.value.free >= 0 and err.value.capacity == 4 << 20
    del err
    gc.collect()
    assert dev.used_bytes == 0  # what was placed before the failure is released
    stage = model.load(dev, range(1, 2))  # one encoder layer (a pipeline stage's share) fits
    assert dev.used_bytes >= model.param_bytes(range(1, 2))
    del stage
    assert dev.used_bytes == 0


def test_activations_count_against_hbm():
    small = TransformerEncoder(SMALL)
    dev = Device(dataclasses.replace(CARD, name="tiny", hbm_bytes=1 << 20))
    shard = small.load(dev)
    shard.forward(small.sample_inputs(2))
    assert dev.peak_bytes > small.param_bytes()
    with pytest.raises(HcclMemoryError) as info:
        shard.forward(small.sample_inputs(512))  # the attention scores alone are 1.2 MB
    assert info.value.allocation == "activation" and info.value.requested > info.value.free


def test_estimates_equal_the_real_runs_modeled_time():
    model = TransformerEncoder(SMALL)
    dev = Device(CARD)
    model.load(dev).forward(model.sample_inputs(5))
    costs, specs = model.estimate(CARD, 5)
    assert sum(costs) == pytest.approx(dev.clock, rel=1e-12)
    assert specs[0] == ((5, 12), np.dtype(np.int64)) and specs[-1] == ((5, 5), np.dtype(np.float32))
