"""The one build of hccl-py's C code: the CANN-shaped prefix of HCCL's C API.

Run at install (``setup.py`` loads this file by path, before hccl_py is importable, so it uses
the standard library only) and again by ``python -m hccl_py.native.build``. It compiles
``capi/*.c`` with the C compiler (``CC``, else ``cc``), warnings as errors, into one library that
embeds this Python, and lays out the prefix a CANN toolkit has::

    prefix/include/hccl/{hccl.h, hccl_types.h, hccl_comm.h}   (copied from include/)
    prefix/include/acl/{acl.h, acl_base.h, acl_rt.h, acl_prof.h}
    prefix/lib64/libhccl.so                                    the library
    prefix/lib64/{libhcomm,libacl_rt,libascendcl,libmsprofiler}.so -> libhccl.so

Every name links and loads the same object (CANN 9 moved setup to libhcomm and AscendCL to
libacl_rt, older programs link libascendcl; the dynamic loader keeps one copy). Without a
compiler, or a Python without its shared library, nothing is built and ``BUILD-FAILED`` in the
prefix says why (``hccl-npu --prefix`` repeats it)::

    python -m hccl_py.native.build            # rebuild the prefix in place
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = sorted((HERE / "capi").glob("*.c"))
HEADERS = HERE / "include"
LIBRARY = "libhccl.so"
ALIASES = ("libhcomm.so", "libacl_rt.so", "libascendcl.so", "libmsprofiler.so")
FAILED = "BUILD-FAILED"
STAMP = "BUILT-FROM"  # the digest of the sources the library was built from
WARNINGS = ("-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter")


def default_prefix() -> Path:
    """Where the package keeps its prefix: ``hccl_py/native/prefix``."""
    return HERE / "prefix"


def compiler() -> str | None:
    """The C compiler to build with (``CC``, else ``cc``/``gcc``), or None."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name.split()[0]):
            return name
    return None


def python_flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) that embed this Python; ValueError when it has no shared library."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        raise ValueError(
            f"this Python ({sys.executable}) was built without its shared library (--enable-shared), which "
            "the C API embeds"
        )
    libdir = sysconfig.get_config_var("LIBDIR")
    version = sysconfig.get_config_var("LDVERSION") or sysconfig.get_config_var("VERSION")
    include = sysconfig.get_paths()["include"]
    return [f"-I{include}"], [f"-L{libdir}", f"-Wl,-rpath,{libdir}", f"-lpython{version}"]


def build(prefix: Path | None = None, *, extra_flags: tuple[str, ...] = (), quiet: bool = False) -> Path | None:
    """Build the prefix at ``prefix`` (default :func:`default_prefix`); returns it, or None when
    it cannot be built (the reason in ``prefix/BUILD-FAILED`` and on stderr). ``extra_flags``:
    more compiler flags (the sanitizer test builds with ``-fsanitize=address,undefined``)."""
    prefix = Path(prefix or default_prefix())
    lib64 = prefix / "lib64"
    cc = compiler()
    try:
        if cc is None:
            raise ValueError("no C compiler (set CC, or install gcc)")
        cflags, ldflags = python_flags()
    except ValueError as err:
        return _failed(prefix, str(err), quiet)
    _lay_out_headers(prefix)
    lib64.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib64) as scratch:
        built = Path(scratch) / LIBRARY
        command = [
            *cc.split(),
            "-shared",
            "-fPIC",
            "-O2",
            "-g",
            "-std=c11",
            "-fvisibility=hidden",
            *WARNINGS,
            f"-I{HEADERS}",
            *cflags,
            *extra_flags,
            *map(str, SOURCES),
            f"-Wl,-soname,{LIBRARY}",
            "-Wl,-z,now",
            "-o",
            str(built),
            *ldflags,
            "-lpthread",
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            return _failed(prefix, f"{' '.join(command)}\n{result.stderr}", quiet)
        os.replace(built, lib64 / LIBRARY)  # a library in use is replaced, never rewritten
    for alias in ALIASES:
        link = lib64 / alias
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(LIBRARY)
    (prefix / FAILED).unlink(missing_ok=True)
    (prefix / STAMP).write_text(source_digest() + "\n")
    if not quiet:
        print(f"hccl-py: HCCL's C API built: {lib64 / LIBRARY}", file=sys.stderr)
    return prefix


def _lay_out_headers(prefix: Path) -> None:
    target = prefix / "include"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(HEADERS, target)


def _failed(prefix: Path, reason: str, quiet: bool) -> None:
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / FAILED).write_text(reason + "\n")
    if not quiet:
        print(f"hccl-py: HCCL's C API is not built: {reason.splitlines()[0]}", file=sys.stderr)
    return None


def source_digest() -> str:
    """A digest of everything the prefix is built from: the C sources, the headers, this file, the Python."""
    digest = hashlib.sha256(sys.version.encode())
    for path in sorted([*SOURCES, *HEADERS.rglob("*.h"), Path(__file__).resolve()]):
        digest.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def current(prefix: Path | None = None) -> bool:
    """Whether the prefix holds a library built from today's sources."""
    prefix = Path(prefix or default_prefix())
    stamp = prefix / STAMP
    return (prefix / "lib64" / LIBRARY).exists() and stamp.exists() and stamp.read_text().strip() == source_digest()


def ensure(prefix: Path | None = None) -> Path | None:
    """The prefix, built first when it is missing or older than its sources (a source edited
    after install); None when it cannot be built (see :func:`status`)."""
    import fcntl

    prefix = Path(prefix or default_prefix())
    if current(prefix):
        return prefix
    prefix.mkdir(parents=True, exist_ok=True)
    with open(prefix / ".build-lock", "w") as lock:  # tests on two workers, two hccl-npu at once: one builds
        fcntl.flock(lock, fcntl.LOCK_EX)
        return prefix if current(prefix) else build(prefix, quiet=True)


def status(prefix: Path | None = None) -> str | None:
    """Why the prefix is not built, or None when it is."""
    prefix = Path(prefix or default_prefix())
    failed = prefix / FAILED
    if failed.exists():
        return failed.read_text().strip()
    if not (prefix / "lib64" / LIBRARY).exists():
        return f"{prefix} holds no {LIBRARY}: run `python -m hccl_py.native.build` (or reinstall hccl-py)"
    return None


if __name__ == "__main__":
    sys.exit(0 if build() is not None else 1)
