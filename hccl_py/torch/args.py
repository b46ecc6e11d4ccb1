"""The process group's arguments in hccl-py's terms: torch's reduce ops as hccl-py's (AVG as SUM,
then divided; bool as a logical or/and), and the checks every collective's tensors and split
sizes pass before a byte moves (a bad one is an HcclParamError naming the argument)::

    reduce_op(dist.ReduceOp.AVG, torch.float32, "all_reduce")   # (ReduceOp.SUM, True)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..dtypes import ReduceOp
from ..errors import HcclNotSupportedError, HcclParamError
from . import device as _device
from .tensors import check, refusal

_RedOp = dist.ReduceOp.RedOpType
_ReduceOpT = dist.ReduceOp
# An op's code (SUM 0, AVG 1, PRODUCT 2, MIN 3, MAX 4, ..., PREMUL_SUM 8) is what torch's ReduceOp
# and its RedOpType hash to: one hash and one int lookup is the cheapest way to read it (reading
# .op and comparing pybind enums costs about a microsecond). Only those two types are read that way
# (:func:`op_code`); the import checks the rule holds for this torch, else ops are read by int(.op).
_NAMES = {int(kind): name for name, kind in _RedOp.__members__.items()}
_PREMUL_SUM = int(_RedOp.PREMUL_SUM)
_HASH_IS_CODE = all(hash(kind) == int(kind) for kind in _RedOp.__members__.values()) and all(
    hash(_ReduceOpT(kind)) == int(kind) for name, kind in _RedOp.__members__.items() if name != "PREMUL_SUM"
)
OPS = {
    int(_RedOp.SUM): (ReduceOp.SUM, False),
    int(_RedOp.PRODUCT): (ReduceOp.PROD, False),
    int(_RedOp.MIN): (ReduceOp.MIN, False),
    int(_RedOp.MAX): (ReduceOp.MAX, False),
    int(_RedOp.AVG): (ReduceOp.SUM, True),
}  # AVG: SUM, then divided by the group size
# bool travels as uint8: "sum" and "max" are a logical or, "product" and "min" a logical and.
_BOOL_OPS = {
    int(_RedOp.SUM): (ReduceOp.MAX, False),
    int(_RedOp.MAX): (ReduceOp.MAX, False),
    int(_RedOp.PRODUCT): (ReduceOp.MIN, False),
    int(_RedOp.MIN): (ReduceOp.MIN, False),
}
FAST_OP_TYPE = _ReduceOpT if _HASH_IS_CODE else None  # opts.reduceOp read by hash on the short path


def op_code(red_op) -> int | None:
    """The op code of torch's ``ReduceOp`` (``dist.ReduceOp.SUM``, ``ReduceOp.RedOpType.SUM``, a
    ``ReduceOp`` instance such as ``opts.reduceOp`` or a premul_sum); None for anything else."""
    kind = type(red_op)
    if _HASH_IS_CODE and (kind is _ReduceOpT or kind is _RedOp):
        return hash(red_op)
    if isinstance(red_op, _ReduceOpT):
        return int(red_op.op)
    if isinstance(red_op, _RedOp):
        return int(red_op)
    return None


def reduce_op(red_op, dtype: torch.dtype, what: str) -> tuple[ReduceOp, bool | float]:
    """(hccl-py's op, what to do to the result: False nothing, True divide by the group size (AVG),
    a float multiply by it (PREMUL_SUM: the sum of factor * x is factor times the sum, equal up to
    rounding; floating types only, as NCCL's and HCCL's)) for torch's ReduceOp."""
    code = op_code(red_op)
    if code == _PREMUL_SUM and dtype.is_floating_point:
        ext = _device.installed()
        if ext is not None:
            return ReduceOp.SUM, float(ext.premul_factor(red_op))
    found = (_BOOL_OPS if dtype is torch.bool else OPS).get(code)
    if found is None:
        name = f"ReduceOp.{_NAMES[code]}" if code in _NAMES else repr(red_op)
        raise HcclNotSupportedError(
            f"{what}: {name} is not supported by hccl-py (SUM, PRODUCT, MIN, MAX"
            f"{' on bool' if dtype is torch.bool else ', AVG'}; PREMUL_SUM on floating "
            "types with the npu device)",
            arg="op",
            value=name,
            rule="choices",
        )
    return found


def divide(t: torch.Tensor, n: int) -> None:
    """AVG: the sum divided by the group size, in place (integers truncate, as NCCL's ncclAvg)."""
    with torch.no_grad():
        if t.is_floating_point():
            t.div_(n)
        else:
            torch.div(t, n, rounding_mode="trunc", out=t)


def one_tensor(tensors: list, what: str) -> torch.Tensor:
    """The one tensor of torch's list argument (one device per process); HcclParamError else."""
    if len(tensors) != 1:
        raise HcclParamError(
            f"{what}: takes one tensor per call (one device per process), got {len(tensors)}",
            arg="tensors",
            value=len(tensors),
            rule="length",
            expected=1,
        )
    return tensors[0]


def split_sizes(splits, numel0: int, n: int, rows: int, what: str, side: str) -> list[int]:
    """Element counts per rank of an all_to_all_single side: split sizes (rows along dim 0) times
    the elements of a row; equal blocks when none are given. Refused with torch's own text (c10d's
    ``checkSplitSizes``, what gloo, NCCL and Ascend's backend say) and hccl-py's fields."""
    if not splits:
        if rows % n:
            raise refusal(
                "Tensor's dim 0 does not divide equally across group size",
                None,
                what,
                f"{side} has {rows} rows along dim 0 and the group {n} ranks; give {side}_split_sizes",
                arg=f"{side}_split_sizes",
                value=rows,
                rule="divisible",
                expected=n,
            )
        return [rows // n * numel0] * n
    splits = [int(s) for s in splits]
    if len(splits) != n:
        raise refusal(
            "Number of tensor splits not equal to group size",
            None,
            what,
            f"{side}_split_sizes {splits}: {len(splits)} sizes for {n} ranks",
            arg=f"{side}_split_sizes",
            value=splits,
            rule="count",
            expected=n,
        )
    if sum(splits) != rows:
        raise refusal(
            "Split sizes doesn't match total dim 0 size",
            None,
            what,
            f"{side}_split_sizes {splits} sum to {sum(splits)}; {side} has {rows} rows along dim 0",
            arg=f"{side}_split_sizes",
            value=splits,
            rule="sum",
            expected=rows,
        )
    return [s * numel0 for s in splits]


def one_dtype(tensors: list, what: str, arg: str) -> None:
    """A coalesced call's list holds one dtype (as torch's Python API and gloo ask)."""
    dtypes = [str(t.dtype) for t in tensors]
    if len(set(dtypes)) > 1:
        raise HcclParamError(
            f"{what}: {arg} holds tensors of several dtypes {dtypes}; give them one dtype",
            arg=arg,
            value=dtypes,
            expected=dtypes[0],
            rule="dtype",
        )


def check_pair(t: torch.Tensor, like: torch.Tensor, numel: int, what: str, name: str, like_name: str) -> None:
    """A tensor of a coalesced call matches the one it pairs with: ``like``'s dtype, ``numel`` elements."""
    arg = name.split("[")[0]
    if t.dtype != like.dtype:
        raise HcclParamError(
            f"{what}: {name} is {t.dtype}; {like_name} is {like.dtype}",
            arg=arg,
            value=str(t.dtype),
            expected=str(like.dtype),
            rule="dtype",
        )
    if t.numel() != numel:
        raise HcclParamError(
            f"{what}: {name} has {t.numel()} elements; expected {numel} ({like_name} has {like.numel()})",
            arg=arg,
            value=t.numel(),
            expected=numel,
            rule="size",
        )


def check_pairs(sized: list, like: list, numel, what: str, names: tuple[str, str]) -> list:
    """The pairs (sized[i], like[i]) of a coalesced call with one tensor per side per call, each
    checked: one per ``like``, ``numel(like[i])`` elements of ``like[i]``'s dtype. ``names``: the
    two arguments as torch names them."""
    if len(sized) != len(like):
        raise HcclParamError(
            f"{what}: {len(sized)} {names[0]} for {len(like)} {names[1]}; give one each",
            arg=names[0],
            value=len(sized),
            expected=len(like),
            rule="length",
        )
    for i, (t, x) in enumerate(zip(sized, like)):
        check_pair(t, x, numel(x), what, f"{names[0]}[{i}]", f"{names[1]}[{i}]")
    return list(zip(sized, like))


def check_list(tensors: list, like: torch.Tensor, size: int, what: str, arg: str, outputs: bool = False) -> None:
    """``tensors`` (one per rank of ``size``) of ``like``'s dtype and element count; ``outputs``: each is
    written with ``copy_`` from a block of ``like``'s shape, so that block must broadcast into
    it as it is (inputs travel flattened, any shape)."""
    if len(tensors) != size:
        raise HcclParamError(
            f"{what}: {arg} has {len(tensors)} tensors; the group has {size} ranks",
            arg=arg,
            value=len(tensors),
            rule="length",
            expected=size,
        )
    for t in tensors:
        check(t, what)
        if t.dtype != like.dtype or t.numel() != like.numel():
            raise HcclParamError(
                f"{what}: {arg} holds a {t.dtype} tensor of {t.numel()} elements; expected "
                f"{like.dtype} of {like.numel()}",
                arg=arg,
                value=[str(t.dtype), t.numel()],
                expected=[str(like.dtype), like.numel()],
            )
        if not outputs:
            continue
        try:
            fits = torch.broadcast_shapes(t.shape, like.shape) == t.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise HcclParamError(
                f"{what}: {arg} holds a tensor of shape {tuple(t.shape)}, which a block of the "
                f"input's shape {tuple(like.shape)} does not fill; give it that shape",
                arg=arg,
                value=list(t.shape),
                expected=list(like.shape),
                rule="shape",
            )


def check_numel(t: torch.Tensor, numel: int, what: str, arg: str) -> None:
    """``t`` holds ``numel`` elements (``arg`` names it in the HcclParamError otherwise)."""
    if t.numel() != numel:
        raise HcclParamError(
            f"{what}: {arg} has {t.numel()} elements; expected {numel}", arg=arg, value=t.numel(), expected=numel
        )
