"""hccl-py's C code and its one build: the CANN-shaped prefix of HCCL's C API (``include/`` of
headers written here, ``capi/`` the library's source, ``build.py`` the build, run at install).

    from hccl_py import native
    native.prefix()          # Path to the prefix, built first if its sources changed; None if it cannot be
"""

from __future__ import annotations

from pathlib import Path

from .build import LIBRARY, default_prefix, ensure, status


def prefix() -> Path | None:
    """The prefix (``include/``, ``lib64/``), built when missing or stale; None when it cannot be
    built (:func:`why_not` says why)."""
    return ensure(default_prefix())


def why_not() -> str | None:
    """Why the prefix is not built (no C compiler, a static Python), or None."""
    return status(default_prefix())


def library() -> Path | None:
    """``lib64/libhccl.so`` of the prefix, or None."""
    found = prefix()
    return found / "lib64" / LIBRARY if found is not None else None


__all__ = ["library", "prefix", "why_not"]
