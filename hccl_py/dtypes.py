"""Supported element types, numbered as HCCL's ``HcclDataType``, and reduce operations.

bfloat16 comes from ml_dtypes, which takes most of a second to import: it is loaded the first
time a bfloat16 array (which the caller made with ml_dtypes already) or ``hccl_py.bfloat16`` is
used, so ``import hccl_py`` stays cheap.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from .errors import HcclParamError

# HcclDataType numbering (hccl_types.h), so wire headers and reports speak HCCL.
BFLOAT16_CODE = 11
DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype(np.int8): 0,
    np.dtype(np.int16): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.float16): 3,
    np.dtype(np.float32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.uint8): 7,
    np.dtype(np.float64): 10,
}  # + bfloat16: BFLOAT16_CODE, once ml_dtypes is loaded (see _bfloat16)
DTYPES_BY_CODE: dict[int, np.dtype] = {code: dt for dt, code in DTYPE_CODES.items()}
ITEMSIZE_BY_CODE: dict[int, int] = {**{code: dt.itemsize for code, dt in DTYPES_BY_CODE.items()}, BFLOAT16_CODE: 2}
NAME_BY_CODE: dict[int, str] = {**{code: dt.name for code, dt in DTYPES_BY_CODE.items()}, BFLOAT16_CODE: "bfloat16"}
SUPPORTED_DTYPE_NAMES = ", ".join(sorted(NAME_BY_CODE.values()))
ITEMSIZE_BY_NAME: dict[str, int] = {name: ITEMSIZE_BY_CODE[code] for code, name in NAME_BY_CODE.items()}
# Every spelling tools use for a dtype (hccl-sim's and nccl-tests' short names, C names, hccl_test
# logs, numpy's) -> numpy's name: the one table the command lines and log readers share.
DTYPE_SPELLINGS: dict[str, str] = {
    **{name: name for name in NAME_BY_CODE.values()},
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
    "double": "float64",
    "int": "int32",
}
# The dtype a call of itemsize-byte elements is modeled with when none is given (hccl-sim's --bytes).
_DEFAULT_DTYPES = {1: "int8", 2: "float16", 4: "float32", 8: "float64"}
SHORT_DTYPE_NAMES = ("int8", "uint8", "fp16", "bf16", "int16", "fp32", "int32", "fp64", "int64")  # hccl-sim's --dtype


def _bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, registered under its HCCL code (loads ml_dtypes once)."""
    import ml_dtypes

    dtype = np.dtype(ml_dtypes.bfloat16)
    DTYPE_CODES[dtype] = BFLOAT16_CODE
    DTYPES_BY_CODE[BFLOAT16_CODE] = dtype
    return dtype


def default_dtype(itemsize: int) -> str:
    """The dtype a call of ``itemsize``-byte elements is modeled with when none is given."""
    return _DEFAULT_DTYPES.get(itemsize, "float32")


def dtype_named(name: "str | np.dtype") -> np.dtype:
    """The numpy dtype of ``name`` in any spelling of :data:`DTYPE_SPELLINGS` (``"fp32"``,
    ``"bfloat16"``: ml_dtypes loaded then), or a dtype as it is."""
    if isinstance(name, str):
        name = DTYPE_SPELLINGS.get(name.strip().lower(), name)
        if name == "bfloat16":
            return DTYPES_BY_CODE.get(BFLOAT16_CODE) or _bfloat16()
    return np.dtype(name)


def __getattr__(name: str):
    if name == "bfloat16":  # hccl_py.dtypes.bfloat16, loaded on first use
        return DTYPES_BY_CODE.get(BFLOAT16_CODE) or _bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ReduceOp(IntEnum):
    """Reduction of a collective, numbered as HCCL's ``HcclReduceOp``.

    Strings are accepted wherever a ``ReduceOp`` is::

        comm.all_reduce(x, op=ReduceOp.MAX)
        comm.all_reduce(x, op="max")
    """

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3

    @classmethod
    def parse(cls, op: "ReduceOp | str") -> "ReduceOp":
        """``op`` as a ReduceOp: a member, its value, or its name in any case (``"max"``); HcclParamError
        otherwise::

            ReduceOp.parse("sum") is ReduceOp.SUM
        """
        try:
            return _REDUCE_OPS[op]
        except (KeyError, TypeError):
            pass
        if isinstance(op, str) and op.upper() in cls.__members__:
            return cls[op.upper()]
        raise HcclParamError(
            f"op={op!r} is not a reduce op; use one of sum, prod, max, min (or hccl_py.ReduceOp)",
            arg="op",
            value=op if isinstance(op, (str, int)) else repr(op),
            rule="choices",
            choices=[name.lower() for name in cls.__members__],
        )


_REDUCE_OPS = {**{op: op for op in ReduceOp}, **{op.name.lower(): op for op in ReduceOp}}

# What a caller does to a reduction's result after the call, which every rank must share (torch's
# ReduceOp.AVG: HCCL has no average; the sum is divided by the group size after it). The call's
# signature carries it beside the op, so AVG on one rank against SUM on another is a call mismatch.
THEN_STEPS = ("", "average")


def then_code(then: str, *, where: str) -> int:
    """The signature's code of the step ``then`` ("" none, "average"); HcclParamError otherwise."""
    try:
        return THEN_STEPS.index(then)
    except ValueError:
        raise HcclParamError(
            f"{where}: then={then!r} is not a step; use one of {THEN_STEPS}",
            arg="then",
            value=repr(then),
            rule="choices",
            choices=list(THEN_STEPS),
        ) from None


def signature_redop(op: "ReduceOp | None", then: int) -> int:
    """The signature's reduction byte: the op, and the step after it in the high bits."""
    return int(op or 0) | then << 4


def redop_label(code: int) -> str:
    """``op=...`` of a signature's reduction byte (:func:`signature_redop`) for a mismatch message."""
    then = code >> 4
    step = f" then {THEN_STEPS[then]}" if 0 < then < len(THEN_STEPS) else (f" then step#{then}" if then else "")
    op = code & 0xF
    return (ReduceOp(op).name.lower() if op in ReduceOp._value2member_map_ else f"op#{op}") + step


UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}

# As HCCL on Atlas A2: "prod" takes neither int16 nor bfp16.
_UNSUPPORTED = {ReduceOp.PROD: {"int16", "bfloat16"}}


def dtype_code(dtype: np.dtype, *, where: str) -> int:
    """HcclDataType code of ``dtype``; HcclParamError for types HCCL has no code for."""
    try:
        return DTYPE_CODES[np.dtype(dtype)]
    except (KeyError, TypeError):
        pass
    try:
        if np.dtype(dtype).name == "bfloat16" and BFLOAT16_CODE not in DTYPES_BY_CODE:
            _bfloat16()
            return DTYPE_CODES[np.dtype(dtype)]
    except (KeyError, TypeError):
        pass
    raise HcclParamError(
        f"{where}: dtype {dtype} is not supported; use one of {SUPPORTED_DTYPE_NAMES}",
        dtype=str(dtype),
        rule="choices",
        choices=SUPPORTED_DTYPE_NAMES.split(", "),
    )


def check_op_dtype(op: ReduceOp, dtype: np.dtype, *, where: str) -> None:
    """HcclParamError when HCCL's ``op`` does not take ``dtype`` (prod: neither int16 nor bfloat16)."""
    if np.dtype(dtype).name in _UNSUPPORTED.get(op, ()):
        raise HcclParamError(
            f"{where}: op={op.name.lower()} does not take dtype {dtype} (as in HCCL); cast to float32 or int32 first",
            arg="op",
            value=op.name.lower(),
            dtype=str(np.dtype(dtype)),
            rule="dtype",
        )
