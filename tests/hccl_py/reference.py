"""Deterministic per-rank inputs and the numpy reference every collective test compares with."""

from __future__ import annotations

import hashlib

import numpy as np

from hccl_py.dtypes import UFUNCS, ReduceOp, bfloat16

ALL_DTYPES = [
    np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.float16, np.float32, np.float64)
] + [bfloat16]
FLOATS = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), bfloat16}


def rank_input(case: str, rank: int, count: int, dtype: np.dtype, op: ReduceOp | None = None) -> np.ndarray:
    """The input rank ``rank`` uses in test case ``case``: any rank can recompute any other's."""
    seed = int.from_bytes(hashlib.blake2b(f"{case}/{rank}".encode(), digest_size=8).digest(), "little")
    rng = np.random.default_rng(seed)
    if dtype in FLOATS:
        if op is ReduceOp.PROD:
            values = rng.uniform(0.5, 1.5, count)  # products stay in range for every float type
        else:
            values = rng.uniform(-4.0, 4.0, count)
        return values.astype(dtype)
    info = np.iinfo(dtype)
    low, high = (max(info.min, -3), min(info.max, 3)) if op is ReduceOp.PROD else (info.min, info.max)
    return rng.integers(low, high, count, dtype=dtype, endpoint=True)


def reduce_reference(inputs: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    """Reduction of ``inputs``: integers wrap exactly as in the dtype; floats in float64."""
    dtype = inputs[0].dtype
    if dtype in FLOATS:
        stacked = np.stack([x.astype(np.float64) for x in inputs])
    else:
        stacked = np.stack(inputs)
    return UFUNCS[op].reduce(stacked, axis=0)


def tolerance(dtype: np.dtype, size: int) -> float:
    eps = {np.dtype(np.float16): 1e-3, bfloat16: 8e-3, np.dtype(np.float32): 1.2e-7, np.dtype(np.float64): 2.3e-16}[
        dtype
    ]
    return 8 * eps * max(size, 2)


def assert_matches(result: np.ndarray, expected: np.ndarray, op: ReduceOp | None, where: str) -> None:
    """Exact for integers and for max/min; within the dtype's tolerance for float sum/prod."""
    if result.dtype in FLOATS and op in (ReduceOp.SUM, ReduceOp.PROD):
        got = result.astype(np.float64)
        scale = 4.0 if op is ReduceOp.SUM else 1.0
        bound = tolerance(result.dtype, 8) * np.maximum(np.abs(expected), scale) * (4 if op is ReduceOp.SUM else 2)
        bad = np.abs(got - expected) > bound
        if bad.any():
            i = int(np.argmax(bad))
            raise AssertionError(f"{where}: element {i}: got {got.ravel()[i]!r}, expected {expected.ravel()[i]!r}")
    else:
        expected = np.asarray(expected).astype(result.dtype)
        if not np.array_equal(
            result.reshape(-1).view(np.uint8) if result.dtype == bfloat16 else result,
            expected.reshape(-1).view(np.uint8) if expected.dtype == bfloat16 else expected,
        ):
            bad = np.flatnonzero(result.ravel() != expected.ravel())
            i = int(bad[0]) if bad.size else -1
            raise AssertionError(
                f"{where}: first differing element {i}: got {result.ravel()[i]!r}, expected {expected.ravel()[i]!r}"
            )


def digest(array: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(array).view(np.uint8).tobytes(), digest_size=8).hexdigest()
