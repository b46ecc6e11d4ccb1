"""The job secret every connection to a rendezvous store presents (zmq's PLAIN mechanism; see
store.py): ``HCCL_PY_JOB_SECRET`` (hccl-launch and ``launch.spawn`` make one per job), else this
user's secret file, ``<user dir>/secret`` (0600, made on first use): processes of one user on one
host share it, others cannot read it.

Example::

    secret = default_secret()      # HCCL_PY_JOB_SECRET, else this user's file
"""

from __future__ import annotations

import os
import secrets
import stat

from .. import env, rundir
from ..errors import HcclParamError, HcclSyscallError

MAX_SECRET_BYTES = 255  # PLAIN's limit
SECRET_FILE = "secret"


def default_secret() -> str:
    """The job secret a store and its clients use when not given one: ``HCCL_PY_JOB_SECRET``,
    else this user's secret file (:func:`user_secret`)."""
    secret = env.job_secret()
    if secret is None:
        return user_secret()
    if len(secret.encode()) > MAX_SECRET_BYTES:
        raise HcclParamError(
            f"{env.JOB_SECRET} is {len(secret.encode())} bytes; at most {MAX_SECRET_BYTES} are used "
            "by the store's handshake: set a shorter one (e.g. 32 hex digits)",
            variable=env.JOB_SECRET,
            value=len(secret.encode()),
            rule="range",
            expected=f"<= {MAX_SECRET_BYTES} bytes",
        )
    return secret


def user_secret() -> str:
    """This user's store secret: ``<user dir>/secret`` (0600), created on first use. Every
    process of this user on this host reads the same one; other users cannot."""
    path = os.path.join(rundir.user_dir(), SECRET_FILE)
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, secrets.token_hex(32).encode() + b"\n")
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic: a racing process either wins or reads the winner's
        except FileExistsError:
            pass
    except OSError as err:
        raise HcclSyscallError(
            f"cannot create the store secret {path}: {err.strerror}; set {env.JOB_SECRET} "
            f"(the same value for every rank of the job) or {env.RUN_DIR}",
            path=path,
            errno=err.errno,
            variable=env.JOB_SECRET,
        ) from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return _read_secret(path)


def _read_secret(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise HcclSyscallError(
            f"cannot read the store secret {path}: {err.strerror}; remove it (it is made again) "
            f"or set {env.JOB_SECRET}",
            path=path,
            errno=err.errno,
            variable=env.JOB_SECRET,
        ) from None
    try:
        st = os.fstat(fd)
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if (
        not stat.S_ISREG(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_mode & 0o077
        or not 32 <= len(data) <= MAX_SECRET_BYTES
    ):
        raise HcclSyscallError(
            f"the store secret {path} is not a private file of this user with 32-255 bytes "
            f"(mode {stat.S_IMODE(st.st_mode):o}, uid {st.st_uid}); remove it (it is made again)",
            path=path,
            rule="private",
        )
    return data.decode(errors="replace")
