"""Byte sizes as people write them: ``8``, ``64K``, ``256M``, ``1G`` (powers of 1024, as
nccl-tests and HCCL Test read them; ``KB``, ``KiB`` and a fraction such as ``1.5M`` too). The
one parser every command uses (hccl-bench, hccl-sim, the partition search)::

    parse_size("256M")    # 268435456
    format_size(1536 << 10)   # '1.5M'
"""

from __future__ import annotations

import re

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int, minimum: int = 1) -> int:
    """Bytes in ``text``; ValueError (saying what is accepted) for anything else, for a fraction of
    a byte, and below ``minimum``."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(str(text))
        if not match:
            raise ValueError(f"{text!r} is not a size; use e.g. 8, 64K, 64M or 1G")
        number, suffix = match.groups()
        exact = float(number) * _SUFFIX[suffix.upper()]
        if exact != int(exact):
            raise ValueError(f"{text!r} is not a whole number of bytes")
        value = int(exact)
    if value < minimum:
        raise ValueError(f"size {text!r} must be at least {minimum} byte{'s' if minimum != 1 else ''}")
    return value


def format_size(nbytes: int) -> str:
    """``8`` -> ``"8B"``, ``65536`` -> ``"64K"``, ``1572864`` -> ``"1.5M"`` (labels, messages);
    a whole number of decimal gigabytes as a source states it: ``10**9`` -> ``"1GB"``."""
    if nbytes >= 10**9 and nbytes % 10**9 == 0 and nbytes % (1 << 30):
        return f"{nbytes // 10**9}GB"
    for suffix in ("G", "M", "K"):
        unit = _SUFFIX[suffix]
        if nbytes >= unit:
            return f"{nbytes / unit:g}{suffix}"
    return f"{nbytes}B"
