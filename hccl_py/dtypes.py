"""Supported element types, numbered as HCCL's ``HcclDataType``, and reduce operations."""

from __future__ import annotations

from enum import IntEnum

import ml_dtypes
import numpy as np

from .errors import HcclParamError

bfloat16 = np.dtype(ml_dtypes.bfloat16)

# HcclDataType numbering (hccl_types.h), so wire headers and reports speak HCCL.
DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype(np.int8): 0,
    np.dtype(np.int16): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.float16): 3,
    np.dtype(np.float32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.uint8): 7,
    np.dtype(np.float64): 10,
    bfloat16: 11,
}
DTYPES_BY_CODE: dict[int, np.dtype] = {code: dt for dt, code in DTYPE_CODES.items()}
SUPPORTED_DTYPE_NAMES = ", ".join(sorted(str(dt) for dt in DTYPE_CODES))


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
        try:
            return _REDUCE_OPS[op]
        except (KeyError, TypeError):
            pass
        if isinstance(op, str) and op.upper() in cls.__members__:
            return cls[op.upper()]
        raise HcclParamError(f"op={op!r} is not a reduce op; use one of sum, prod, max, min (or hccl_py.ReduceOp)",
                             arg="op", value=op if isinstance(op, (str, int)) else repr(op), rule="choices",
                             choices=[name.lower() for name in cls.__members__])


_REDUCE_OPS = {**{op: op for op in ReduceOp}, **{op.name.lower(): op for op in ReduceOp}}


UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}

# As HCCL on Atlas A2: "prod" takes neither int16 nor bfp16.
_UNSUPPORTED = {ReduceOp.PROD: {np.dtype(np.int16), bfloat16}}


def dtype_code(dtype: np.dtype, *, where: str) -> int:
    """HcclDataType code of ``dtype``; HcclParamError for types HCCL has no code for."""
    try:
        return DTYPE_CODES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise HcclParamError(f"{where}: dtype {dtype} is not supported; use one of {SUPPORTED_DTYPE_NAMES}", dtype=str(dtype),
                             rule="choices", choices=SUPPORTED_DTYPE_NAMES.split(", ")) from None


def check_op_dtype(op: ReduceOp, dtype: np.dtype, *, where: str) -> None:
    if np.dtype(dtype) in _UNSUPPORTED.get(op, ()):
        raise HcclParamError(f"{where}: op={op.name.lower()} does not take dtype {dtype} (as in HCCL); cast to float32 or int32 first",
                             arg="op", value=op.name.lower(), dtype=str(np.dtype(dtype)), rule="dtype")
