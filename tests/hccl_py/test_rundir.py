"""Where ranks' sockets live (hccl_py/rundir.py): private directories, stale files, clean-up."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import time

import pytest

from hccl_py import rundir
from hccl_py.errors import HcclConnectError, HcclSyscallError

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def run_dir(tmp_path, monkeypatch: pytest.MonkeyPatch) -> str:
    base = tmp_path / "run"
    base.mkdir(mode=0o700)
    monkeypatch.setenv("HCCL_PY_RUN_DIR", str(base))
    return str(base)


def _dgram() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)


def test_job_directories_are_private_and_sockets_removed_on_unbind(run_dir: str) -> None:
    sock = _dgram()
    path, inode = rundir.bind(sock, "job-a", "g1.0.123")
    assert path == os.path.join(run_dir, "job-a", "g1.0.123")
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert rundir.listening(path)
    sock.close()
    rundir.unbind(path, inode)
    assert not os.path.exists(os.path.dirname(path))  # the last socket out removes the job directory


def test_default_base_is_private_and_owned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HCCL_PY_RUN_DIR", raising=False)
    xdg = tempfile.mkdtemp(prefix="xdg-")  # short: a long XDG_RUNTIME_DIR falls back to /tmp
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
        assert rundir.user_dir() == os.path.join(xdg, "hccl_py")
        assert stat.S_IMODE(os.stat(os.path.join(xdg, "hccl_py")).st_mode) == 0o700
    finally:
        shutil.rmtree(xdg)
    for unusable in ("/nonexistent/for/sure", "/tmp/" + "x" * 80):
        monkeypatch.setenv("XDG_RUNTIME_DIR", unusable)
        assert rundir._default_base() == f"/tmp/hccl_py-{os.geteuid()}"


def test_unsafe_run_directories_are_refused(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "real"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    monkeypatch.setenv("HCCL_PY_RUN_DIR", str(link))
    with pytest.raises(HcclSyscallError) as info:
        rundir.user_dir()
    assert info.value.code == 8
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("HCCL_PY_RUN_DIR", str(shared))
    with pytest.raises(HcclSyscallError):
        rundir.user_dir()
    if os.geteuid() == 0:  # a directory another user owns (root can make one)
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        monkeypatch.setenv("HCCL_PY_RUN_DIR", str(foreign))
        with pytest.raises(HcclSyscallError):
            rundir.user_dir()


def test_a_job_directory_someone_else_made_is_refused(run_dir: str) -> None:
    os.mkdir(os.path.join(run_dir, "job-b"), 0o755)  # not private: mended, it is ours
    rundir.job_dir("job-b", create=True)
    assert stat.S_IMODE(os.stat(os.path.join(run_dir, "job-b")).st_mode) == 0o700
    os.symlink("/tmp", os.path.join(run_dir, "job-c"))
    with pytest.raises(HcclSyscallError):
        rundir.job_dir("job-c", create=True)


def test_odd_job_ids_get_a_hashed_directory_name() -> None:
    assert rundir.job_dir_name("3f2a9c0d1b2e") == "3f2a9c0d1b2e"
    for odd in ("../../etc", "a/b", "x" * 40, ".hidden", ""):
        name = rundir.job_dir_name(odd)
        assert name.startswith("h-") and "/" not in name and len(name) == 18


def test_a_stale_socket_file_is_replaced_and_a_live_one_is_an_error(run_dir: str) -> None:
    dead = _dgram()
    path, _ = rundir.bind(dead, "job-d", "g1.0.1")
    dead.close()  # a killed process leaves its file
    assert not rundir.listening(path)
    again = _dgram()
    assert rundir.bind(again, "job-d", "g1.0.1")[0] == path
    twin = _dgram()
    with pytest.raises(HcclConnectError) as info:
        rundir.bind(twin, "job-d", "g1.0.1")
    assert info.value.code == 11
    again.close()
    twin.close()


def test_too_long_a_socket_path_says_to_shorten_the_run_directory(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 90)
    deep.mkdir(mode=0o700)
    monkeypatch.setenv("HCCL_PY_RUN_DIR", str(deep))
    with pytest.raises(HcclSyscallError) as info:
        rundir.bind(_dgram(), "job-e", "g1.0.1")
    assert (info.value.variable, info.value.rule) == ("HCCL_PY_RUN_DIR", "range")  # the fix: a shorter HCCL_PY_RUN_DIR
    assert info.value.path.startswith(str(deep)) and len(info.value.path.encode()) > rundir.UNIX_PATH_MAX


def test_remove_job_keeps_live_sockets_and_removes_dead_ones(run_dir: str) -> None:
    live, dead = _dgram(), _dgram()
    live_path, live_inode = rundir.bind(live, "job-f", "g1.0.1")
    dead_path, _ = rundir.bind(dead, "job-f", "g1.1.2")
    dead.close()
    rundir.remove_job("job-f")  # another launcher's rank still runs: only the dead one goes
    assert os.path.exists(live_path) and not os.path.exists(dead_path)
    live.close()
    rundir.remove_job("job-f")
    assert not os.path.exists(os.path.join(run_dir, "job-f"))
    rundir.remove_job("never-was")  # nothing to do, no error


def test_sweep_removes_only_old_dead_jobs(run_dir: str) -> None:
    socks = {}
    for job in ("dead-old", "dead-new", "live-old", "mine"):
        socks[job] = _dgram()
        rundir.bind(socks[job], job, "g1.0.1")
    for job in ("dead-old", "dead-new", "mine"):
        socks[job].close()
    empty = os.path.join(run_dir, "empty-old")
    os.mkdir(empty, 0o700)
    other = os.path.join(run_dir, "not-sockets")
    os.mkdir(other, 0o700)
    open(os.path.join(other, "notes.txt"), "w").close()
    past = time.time() - 3600
    for job in ("dead-old", "live-old", "mine", "empty-old", "not-sockets"):
        os.utime(os.path.join(run_dir, job), (past, past))
    removed = rundir.sweep_stale(keep="mine")
    assert removed == [os.path.join(run_dir, "dead-old")] or sorted(removed) == sorted(
        [os.path.join(run_dir, "dead-old"), empty]
    )
    left = set(os.listdir(run_dir))
    assert (
        {"dead-new", "live-old", "mine", "not-sockets"} <= left and "dead-old" not in left and "empty-old" not in left
    )
    socks["live-old"].close()


# -- private directories for what hccl-py loads from disk (the npu extension's build cache) --------------
def test_a_private_directory_is_made_private_and_an_unsafe_one_refused(tmp_path) -> None:
    made = rundir.private_dir(str(tmp_path / "cache"), variable="HCCL_PY_CACHE", keeps="compiled code")
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o700
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(HcclSyscallError, match="writable by other users") as err:
        rundir.private_dir(str(open_to_all), variable="HCCL_PY_CACHE", keeps="compiled code")
    assert err.value.fields["variable"] == "HCCL_PY_CACHE" and err.value.fields["rule"] == "private"
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(HcclSyscallError, match="symlink"):
        rundir.private_dir(str(tmp_path / "link"), variable="HCCL_PY_CACHE", keeps="compiled code")
    shared = tmp_path / "shared"  # another user could rename the cache out of it and put theirs there
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(HcclSyscallError, match="put a directory of theirs in its place"):
        rundir.private_dir(str(shared / "cache"), variable="HCCL_PY_CACHE", keeps="compiled code")
    shared.chmod(0o1777)  # sticky, as /tmp: nobody else can rename what is ours
    assert rundir.private_dir(str(shared / "cache"), variable="HCCL_PY_CACHE", keeps="compiled code")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_of_another_user_is_refused(tmp_path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 12345, 12345)
    with pytest.raises(HcclSyscallError, match="belongs to uid 12345"):
        rundir.private_dir(str(theirs), variable="HCCL_PY_CACHE", keeps="compiled code")
