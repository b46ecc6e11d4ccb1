"""The two structures HCCL's C API reads from the caller: ``HcclRootInfo`` (where the ranks of a
new communicator meet) and ``HcclCommConfig`` (a communicator's settings, read by its size and
version first).

The root info is 4108 bytes; hccl-py writes a NUL-terminated string at offset 0, so a program
that compares it with a string (hccl_test checks it is not ``"invalid"``) or sends it between
processes as bytes (vLLM's ``torch.distributed.broadcast``) works unchanged::

    hccl-py-rootinfo/1 127.0.0.1:40123 job=5f0c... secret=9ab1...

``HcclCommConfig`` starts with a 24-byte header: ``size`` (uint64, the caller's struct size),
``magicWord`` (uint32, 0xf0f0f0f0) and ``version`` (uint32); each version adds fields at fixed
offsets (version 6, sglang's, is 312 bytes; version 10 is 2240; 11 adds one field). A field the
caller's version does not have, or left at its "not set" value, keeps the environment's setting.
"""

from __future__ import annotations

import ctypes
import secrets
import uuid
from dataclasses import dataclass

from ..errors import HcclParamError
from .abi import read_bytes

ROOT_INFO_BYTES = 4108
_ROOT_PREFIX = "hccl-py-rootinfo/1"

CONFIG_MAGIC = 0xF0F0F0F0
CONFIG_VERSION = 11  # the newest version this library reads
NOT_SET = 0xFFFFFFFF
# field: (offset, size, kind, the version that added it)
_FIELDS = {
    "buffer_mb": (24, 4, "u32", 1),
    "deterministic": (28, 4, "u32", 1),
    "name": (32, 128, "text", 2),
    "udi": (160, 128, "text", 3),
    "op_expansion_mode": (288, 4, "u32", 4),
    "traffic_class": (292, 4, "u32", 5),
    "service_level": (296, 4, "u32", 5),
    "world_rank": (300, 4, "u32", 6),
    "job_id": (304, 8, "u64", 6),
    "zero_copy": (312, 1, "u8", 7),
    "exec_timeout_s": (316, 4, "i32", 8),
    "algo": (320, 1600, "text", 8),
    "retry_enable": (1920, 50, "text", 8),
    "retry_params": (1970, 128, "text", 8),
    "buffer_name": (2098, 128, "text", 9),
    "qos": (2228, 4, "u32", 10),
    "sym_window_gb": (2232, 8, "u64", 10),
    "sq_depth": (2240, 4, "u32", 11),
}
_KINDS = {"u8": ctypes.c_uint8, "u32": ctypes.c_uint32, "i32": ctypes.c_int32, "u64": ctypes.c_uint64}
DETERMINISTIC = {0: "false", 1: "true", 2: "strict"}


@dataclass(frozen=True)
class RootInfo:
    """Where a communicator's ranks meet: a store at ``host:port`` of job ``job_id``, ``secret``."""

    host: str
    port: int
    job_id: str
    secret: str

    @classmethod
    def new(cls, host: str, port: int) -> "RootInfo":
        """The root info of a store just started at ``host:port`` (its job id and secret fresh)."""
        return cls(host, port, uuid.uuid4().hex, secrets.token_hex(16))

    def to_bytes(self) -> bytes:
        """The 4108 bytes of ``HcclRootInfo``: the string, NUL, zeros."""
        text = f"{_ROOT_PREFIX} {self.host}:{self.port} job={self.job_id} secret={self.secret}".encode()
        return text + bytes(ROOT_INFO_BYTES - len(text))

    @classmethod
    def read(cls, address: int) -> "RootInfo":
        """The root info at ``address``; HcclParamError for bytes no HcclGetRootInfo wrote."""
        raw = read_bytes(address, ROOT_INFO_BYTES, "rootInfo").split(b"\0", 1)[0].decode("ascii", "replace")
        parts = raw.split(" ")
        try:
            if parts[0] != _ROOT_PREFIX or len(parts) != 4:
                raise ValueError
            host, port = parts[1].rsplit(":", 1)
            job_id, secret = parts[2].removeprefix("job="), parts[3].removeprefix("secret=")
            return cls(host, int(port), job_id, secret)
        except ValueError:
            shown = raw[:60] + ("..." if len(raw) > 60 else "")
            raise HcclParamError(
                f"rootInfo {shown!r} is no root info of HcclGetRootInfo: pass the bytes the root rank's "
                "HcclGetRootInfo wrote, all 4108 of them",
                arg="rootInfo",
                rule="format",
            ) from None


@dataclass(frozen=True)
class CommConfig:
    """The settings an ``HcclCommConfig`` sets (None: not set, the environment's stands)."""

    version: int
    buffer_bytes: int | None = None
    deterministic: str | None = None
    name: str | None = None
    exec_timeout_s: float | None = None  # 0: no limit
    algo: str | None = None

    @classmethod
    def read(cls, address: int) -> "CommConfig | None":
        """The config at ``address`` (None for NULL): its size and magic word checked first, then
        the fields its version has."""
        if not address:
            return None
        size = ctypes.c_uint64.from_address(address).value
        magic = ctypes.c_uint32.from_address(address + 8).value
        version = ctypes.c_uint32.from_address(address + 12).value
        if magic != CONFIG_MAGIC:
            raise HcclParamError(
                f"HcclCommConfig's magic word is {magic:#x}, not {CONFIG_MAGIC:#x}: call HcclCommConfigInit "
                "on the config before setting its fields",
                arg="config",
                rule="magic",
                value=magic,
            )
        if version == 0:
            raise HcclParamError("HcclCommConfig's version is 0: call HcclCommConfigInit", arg="config", rule="version")
        if size < 32:  # the header and version 1's two fields
            raise HcclParamError(
                f"HcclCommConfig says it is {size} bytes, less than its header and first fields (32): call "
                "HcclCommConfigInit on the config",
                arg="config",
                rule="size",
                value=size,
            )
        # The fields of the caller's version that its struct holds (an early version 10 ends before
        # hcclSymWinMaxMemSizePerRank); a version past this library's keeps the fields it knows.
        known = {name: f for name, f in _FIELDS.items() if f[3] <= min(version, CONFIG_VERSION) and f[0] + f[1] <= size}
        got = {name: _field(address, offset, width, kind) for name, (offset, width, kind, _) in known.items()}
        return cls(
            version=version,
            buffer_bytes=_buffer_bytes(got.get("buffer_mb", NOT_SET)),
            deterministic=_deterministic(got.get("deterministic", NOT_SET)),
            name=got.get("name") or None,
            exec_timeout_s=_timeout(got.get("exec_timeout_s", -1)),
            algo=got.get("algo") or None,
        )


def _field(address: int, offset: int, width: int, kind: str):
    if kind == "text":
        return ctypes.string_at(address + offset, width).split(b"\0", 1)[0].decode("utf-8", "replace")
    return _KINDS[kind].from_address(address + offset).value


def _buffer_bytes(mb: int) -> int | None:
    if mb == NOT_SET:
        return None
    if not 1 <= mb <= 65536:
        raise HcclParamError(
            f"HcclCommConfig.hcclBufferSize={mb} MB: give 1..65536 MB (HCCL_BUFFSIZE's range)",
            arg="hcclBufferSize",
            value=mb,
            rule="range",
        )
    return mb << 20


def _deterministic(value: int) -> str | None:
    if value == NOT_SET:
        return None
    if value not in DETERMINISTIC:
        raise HcclParamError(
            f"HcclCommConfig.hcclDeterministic={value}: give 0 (off), 1 (on) or 2 (strict)",
            arg="hcclDeterministic",
            value=value,
            rule="choices",
        )
    return DETERMINISTIC[value]


def _timeout(seconds: int) -> float | None:
    if seconds < 0:  # not set
        return None
    return float(seconds)
