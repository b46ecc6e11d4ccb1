"""torch_npu's storage-format API on hccl-py's npu tensors: the format is metadata only.

On Ascend, ``torch_npu.npu_format_cast(t, 29)`` re-lays a tensor out in the cube unit's FRACTAL_NZ
blocks and ``torch_npu.get_npu_format(t)`` reports it. Here the bytes stay in torch's ordinary
layout (they are host memory and the kernels are torch's), and the format travels with the
tensor's storage as metadata (its views share it, as on Ascend), so programs and tests that cast
and read formats run unchanged::

    y = torch_npu.npu_format_cast(x, 29)
    torch_npu.get_npu_format(y)          # 29; get_npu_format(x) is still 2 (ND)

A tensor made by an op from a cast one starts again at its base format, as a contiguous result
does on Ascend for most ops. A view of an internal-format tensor (FRACTAL_NZ, NC1HWC0, ...) that
does not start at its storage's beginning is refused by the "hccl" backend, as on Ascend.
"""

from __future__ import annotations

import torch

from ..errors import HcclParamError
from . import device as _device

# ACL's format numbers (CANN's aclFormat), the ones torch_npu programs pass.
ACL_FORMAT = {
    "NCHW": 0,
    "NHWC": 1,
    "ND": 2,
    "NC1HWC0": 3,
    "FRACTAL_Z": 4,
    "NC1HWC0_C04": 12,
    "HWCN": 16,
    "NDHWC": 27,
    "FRACTAL_NZ": 29,
    "NCDHW": 30,
    "NDC1HWC0": 32,
    "FRACTAL_Z_3D": 33,
}
_KNOWN = frozenset(ACL_FORMAT.values())
BASE_FORMATS = frozenset({ACL_FORMAT[k] for k in ("NCHW", "NHWC", "ND", "NCDHW", "NDHWC")})  # torch's own layouts


def base_format(t: torch.Tensor) -> int:
    """The format torch_npu gives a tensor it did not cast: NCHW for 4-d tensors, else ND."""
    return ACL_FORMAT["NCHW"] if t.dim() == 4 else ACL_FORMAT["ND"]


def get_npu_format(t: torch.Tensor) -> int:
    """The tensor's ACL format number (its storage's cast one, else its base format)."""
    found = _device.installed().get_format(t) if t.device.type == "npu" else -1
    return found if found >= 0 else base_format(t)


def is_internal(t: torch.Tensor) -> bool:
    """Whether ``t``'s format is one of the cube's internal layouts (not torch's own)."""
    return t.device.type == "npu" and get_npu_format(t) not in BASE_FORMATS


def _checked(acl_format: int) -> int:
    if isinstance(acl_format, bool) or not isinstance(acl_format, int) or acl_format not in _KNOWN:
        raise HcclParamError(
            f"npu_format_cast: unknown ACL format {acl_format!r}; one of "
            f"{', '.join(f'{k}={v}' for k, v in ACL_FORMAT.items())}",
            arg="acl_format",
            value=repr(acl_format),
            rule="choices",
            choices=sorted(_KNOWN),
        )
    return acl_format


def npu_format_cast(t: torch.Tensor, acl_format: int) -> torch.Tensor:
    """A tensor of ``t``'s values in format ``acl_format`` (``t`` itself when already in it)."""
    acl_format = _checked(acl_format)
    _npu(t, "npu_format_cast")
    if get_npu_format(t) == acl_format:
        return t
    out = t.clone(memory_format=torch.contiguous_format)
    _device.installed().set_format(out, acl_format)
    return out


def npu_format_cast_(t: torch.Tensor, acl_format: int) -> torch.Tensor:
    """Cast ``t`` to ``acl_format`` in place (its storage's format) and return it."""
    _npu(t, "npu_format_cast_")
    _device.installed().set_format(t, _checked(acl_format))
    return t


def _npu(t, what: str) -> None:
    if not isinstance(t, torch.Tensor) or t.device.type != "npu":
        where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
        raise HcclParamError(
            f"{what}: expected an npu tensor, got {where} (formats are the npu's storage layouts)",
            arg="self",
            value=str(where),
            rule="device",
            expected="npu",
        )
