"""torch_npu.utils: the CANN version the simulated cards report, and how CANN versions order.

CANN versions read ``major.minor.patch`` (``9.2.0``), ``major.minor.RCn`` (``8.0.RC3``, a release
candidate, before that line's releases) or ``major.minor.Tn`` (a test build, before its release
candidates), optionally with a fourth part ``alphaNNN`` or ``betaNNN`` (before the version it
precedes).
"""

from __future__ import annotations

import re

from hccl_py.torch.device import CANN_VERSION

# The components torch_npu lets a program ask about; the simulated host has no NPU driver.
_MODULES = ("CANN", "RUNTIME", "COMPILER", "HCCL", "TOOLKIT", "OPP", "OPP_KERNEL")
_THIRD = re.compile(r"^(?:(T)|(RC))?(\d+)$", re.IGNORECASE)
_FOURTH = re.compile(r"^(alpha|beta)(\d+)$", re.IGNORECASE)


def get_cann_version(module: str = "CANN") -> str:
    """The version of a CANN component on this host (every component of the simulated CANN has its
    version; ``"DRIVER"`` is empty: there is no driver)."""
    if module == "DRIVER":
        return ""
    if module not in _MODULES:
        raise ValueError(f"get_cann_version: module {module!r} is not one of {[*_MODULES, 'DRIVER']}")
    return CANN_VERSION.split(" ", 1)[0]


def _version_key(version: str) -> tuple:
    """An ordering key of a CANN version string (see the module doc); ValueError if it is none."""
    parts = version.strip().split(".")
    third = _THIRD.match(parts[2]) if len(parts) in (3, 4) else None
    fourth = _FOURTH.match(parts[3]) if len(parts) == 4 else None
    if not (third and parts[0].isdigit() and parts[1].isdigit()) or (len(parts) == 4 and not fourth):
        raise ValueError(f"{version!r} is not a CANN version (e.g. '9.2.0', '8.0.RC3', '8.1.RC1.alpha002')")
    stage = 0 if third.group(1) else 1 if third.group(2) else 2  # test build < release candidate < release
    pre = (0 if fourth.group(1).lower() == "alpha" else 1, int(fourth.group(2))) if fourth else (2, 0)
    return int(parts[0]), int(parts[1]), stage, int(third.group(3)), pre


def _is_gte_cann_version(version: str, module: str = "CANN") -> bool:
    """Whether this host's ``module`` is ``version`` or later."""
    return _version_key(get_cann_version(module)) >= _version_key(version)
