"""The rendezvous store: semantics, timeouts that name what is missing, no leftovers."""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from hccl_py.errors import HcclConnectError, HcclMemoryError, HcclParamError, HcclTimeoutError
from hccl_py.rendezvous.store import StoreClient, StoreServer
from tests.mp import wait_until

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def store() -> Iterator[tuple[StoreServer, StoreClient]]:
    server = StoreServer().start()
    client = StoreClient(server.address, timeout_s=5)
    yield server, client
    client.close()
    server.close()


def _os_threads() -> int:
    # Native threads too (zmq's I/O threads are not in threading.enumerate()).
    return len(os.listdir("/proc/self/task"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_set_get_overwrite_check_delete(store: tuple[StoreServer, StoreClient]) -> None:
    server, client = store
    assert server.address == f"tcp://127.0.0.1:{server.port}"
    client.set("a", b"1")
    client.set("b", bytearray(b"\x00\xff"))
    assert client.get("a", timeout_s=1) == b"1"
    assert client.get("b", timeout_s=1) == b"\x00\xff"
    client.set("a", b"")
    assert client.get("a", timeout_s=1) == b""
    assert client.check(["a", "b", "c"]) == [True, True, False]
    assert client.delete("a") is True
    assert client.delete("a") is False
    assert client.check(["a"]) == [False]


def _parked(server: StoreServer, key: str) -> bool:
    """Whether a request waiting for ``key`` is parked on the server (white box: the only way
    to order a set after a get without guessing how long the get takes to arrive)."""
    return key in server._waiting


def test_get_waits_for_a_later_set(store: tuple[StoreServer, StoreClient]) -> None:
    server, client = store

    def late_set() -> None:
        wait_until(lambda: _parked(server, "late"), "the get is parked on the server")
        with StoreClient(server.address, timeout_s=5) as other:
            other.set("late", b"here")

    setter = threading.Thread(target=late_set)
    setter.start()
    assert client.get("late", timeout_s=20) == b"here"
    setter.join()


def test_get_timeout_names_key_and_timeout(store: tuple[StoreServer, StoreClient]) -> None:
    _, client = store
    with pytest.raises(HcclTimeoutError) as info:
        client.get("rank3/endpoint", timeout_s=0.3)
    assert info.value.missing_keys == ["rank3/endpoint"]
    assert (info.value.key, info.value.timeout_s, info.value.address) == ("rank3/endpoint", 0.3, client.address)
    # The socket is not wedged by the abandoned request, and its late answer is not mistaken
    # for the answer to a newer request.
    client.set("rank3/endpoint", b"old")
    client.set("x", b"new")
    assert client.get("x", timeout_s=1) == b"new"
    assert client.get("rank3/endpoint", timeout_s=1) == b"old"


def test_wait_names_exactly_the_missing_keys(store: tuple[StoreServer, StoreClient]) -> None:
    server, client = store
    client.set("k0", b"")
    client.set("k2", b"")
    with pytest.raises(HcclTimeoutError) as info:
        client.wait(["k0", "k1", "k2", "k3"], timeout_s=0.3)
    assert info.value.missing_keys == ["k1", "k3"]
    assert info.value.keys == ["k0", "k1", "k2", "k3"]  # 2 of 4 still missing

    def arrive() -> None:
        with StoreClient(server.address, timeout_s=5) as other:
            for key in ("k1", "k3"):
                wait_until(lambda: _parked(server, key), f"the wait is parked on {key}")
                other.set(key, b"")

    late = threading.Thread(target=arrive)
    late.start()
    client.wait(["k0", "k1", "k2", "k3"], timeout_s=20)  # returns once the last key arrives
    late.join()


def test_add_counts_atomically(store: tuple[StoreServer, StoreClient]) -> None:
    server, client = store
    assert client.add("n") == 1
    assert client.add("n", 5) == 6
    assert client.add("n", -2) == 4
    assert client.get("n", timeout_s=1) == b"4"

    def bump() -> None:
        with StoreClient(server.address, timeout_s=5) as mine:
            for _ in range(50):
                mine.add("shared")

    workers = [threading.Thread(target=bump) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert client.get("shared", timeout_s=1) == b"200"
    client.set("text", b"abc")
    with pytest.raises(HcclParamError) as info:
        client.add("text")
    assert (info.value.key, info.value.value, info.value.rule, info.value.expected) == ("text", "abc", "type", "int")


def test_bad_arguments_are_rejected(store: tuple[StoreServer, StoreClient]) -> None:
    _, client = store
    with pytest.raises(HcclParamError):
        client.set("k", "not bytes")  # type: ignore[arg-type]
    with pytest.raises(HcclParamError):
        client.check("single-string")  # type: ignore[arg-type]
    with pytest.raises(HcclParamError):
        StoreClient("tcp://127.0.0.1:1", timeout_s=0)


def test_zero_timeout_means_do_not_wait(store: tuple[StoreServer, StoreClient]) -> None:
    # Callers pass `deadline - now`, which can reach 0: that is "check once", not a usage error.
    _, client = store
    with pytest.raises(HcclTimeoutError) as info:
        client.get("absent", timeout_s=0)
    assert (info.value.key, info.value.missing_keys, info.value.timeout_s) == ("absent", ["absent"], 0)
    client.set("here", b"1")
    assert client.get("here", timeout_s=0) == b"1"
    client.wait(["here"], timeout_s=0.0)
    with pytest.raises(HcclTimeoutError) as info:
        client.wait(["here", "absent"], timeout_s=-1)
    assert info.value.missing_keys == ["absent"]


def test_unreachable_server_fails_within_the_timeout() -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    with StoreClient(address, timeout_s=0.5) as client:
        with pytest.raises((HcclConnectError, HcclTimeoutError)) as info:
            client.set("k", b"v")
    assert info.value.address == address
    # The message's point is what to check; that hint is what a user reads.
    assert "is hccl-launch running" in str(info.value) and "MASTER_ADDR:MASTER_PORT" in str(info.value)


def test_server_gone_during_get_is_reported_as_connection_loss() -> None:
    server = StoreServer().start()
    client = StoreClient(server.address, timeout_s=5)
    try:
        client.set("k", b"v")

        def close_once_parked() -> None:
            wait_until(lambda: _parked(server, "never"), "the get is parked on the server")
            server.close()

        closer = threading.Thread(target=close_once_parked)
        closer.start()
        # HcclConnectError, not HcclTimeoutError: the loss was noticed, not waited out (the
        # 60 s timeout is beyond the test's bound).
        with pytest.raises(HcclConnectError) as info:
            client.get("never", timeout_s=60)
        closer.join()
        assert (info.value.address, info.value.key) == (server.address, "never")
    finally:
        client.close()
        server.close()


def test_port_in_use_is_a_clear_error() -> None:
    with StoreServer() as first:
        with pytest.raises(HcclConnectError) as info:
            StoreServer(port=first.port)
        assert (info.value.errno, info.value.address) == (errno.EADDRINUSE, f"tcp://127.0.0.1:{first.port}")


def test_close_is_idempotent_and_leaves_no_threads() -> None:
    before_py = set(threading.enumerate())
    before_os = _os_threads()
    server = StoreServer().start()
    client = StoreClient(server.address, timeout_s=5)
    client.set("k", b"v")
    assert client.get("k") == b"v"
    client.close()
    client.close()
    server.close()
    server.close()
    unstarted = StoreServer()
    unstarted.close()
    assert set(threading.enumerate()) == before_py
    # Thread.join returns when the thread's Python state is released, a moment before the OS
    # thread leaves /proc/self/task (visible on a loaded machine); a thread that stays still fails
    # (fewer is another test's thread ending meanwhile).
    wait_until(lambda: _os_threads() <= before_os, f"native threads back to {before_os}")
    with pytest.raises(HcclParamError):
        client.get("k")


# -- who may use a store (issue 13): a job secret, atomic claims, the job id, bounded memory ----


def test_set_if_absent_claims_once_and_names_the_holder(store: tuple[StoreServer, StoreClient]) -> None:
    server, client = store
    assert client.set_if_absent("slot/1", b"pid 10") == (True, b"pid 10")
    with StoreClient(server.address, timeout_s=5) as other:
        assert other.set_if_absent("slot/1", b"pid 11") == (False, b"pid 10")
    assert client.get("slot/1", timeout_s=1) == b"pid 10"


def test_job_id_is_the_given_one_or_a_random_one() -> None:
    with StoreServer(job_id="job-a") as named, StoreServer() as anonymous, StoreServer() as another:
        with StoreClient(named.address, timeout_s=5) as client:
            assert client.job_id() == "job-a"
        with StoreClient(anonymous.address, timeout_s=5) as a, StoreClient(another.address, timeout_s=5) as b:
            assert a.job_id() == anonymous.job_id and b.job_id() == another.job_id
            assert a.job_id() != b.job_id()


def test_a_client_with_another_secret_is_refused_at_the_handshake() -> None:
    # The client's own timeout is far beyond the test's: only noticing the refusal passes.
    with StoreServer(secret="the-jobs-secret") as server:
        server._data["rank/0"] = b"tcp://10.0.0.1:5000"
        with StoreClient(server.address, timeout_s=120, secret="a-guess") as intruder:
            for call in (lambda: intruder.get("rank/0"), lambda: intruder.set("rank/0", b"forged")):
                with pytest.raises(HcclConnectError) as info:
                    call()
                assert info.value.code == 11
        with StoreClient(server.address, timeout_s=5, secret="the-jobs-secret") as member:
            assert member.get("rank/0", timeout_s=1) == b"tcp://10.0.0.1:5000"


def test_the_default_secret_is_hccl_py_job_secret_else_the_user_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from hccl_py import rundir
    from hccl_py.rendezvous.secret import default_secret, user_secret

    monkeypatch.delenv("HCCL_PY_JOB_SECRET", raising=False)
    secret = default_secret()
    assert secret == user_secret()
    path = os.path.join(rundir.user_dir(), "secret")
    assert os.stat(path).st_mode & 0o777 == 0o600
    monkeypatch.setenv("HCCL_PY_JOB_SECRET", "from-the-launcher")
    assert default_secret() == "from-the-launcher"
    with StoreServer() as server:  # both sides default to the variable
        with StoreClient(server.address, timeout_s=5) as client:
            client.set("k", b"v")
        with StoreClient(server.address, timeout_s=60, secret=secret) as stranger:
            with pytest.raises(HcclConnectError):
                stranger.set("k", b"w")


def _read_file(path: str) -> str:
    with open(path) as f:
        return f.read()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a second, unprivileged user (nobody)")
def test_another_user_cannot_read_the_secret_file() -> None:
    from hccl_py import rundir
    from hccl_py.rendezvous.secret import user_secret
    from tests.mp import run_as_nobody

    user_secret()
    outcome = run_as_nobody(_read_file, os.path.join(rundir.user_dir(), "secret"))
    assert outcome.get("error", "").startswith("PermissionError"), outcome


def test_a_full_store_refuses_more_with_a_memory_error(
    store: tuple[StoreServer, StoreClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hccl_py.rendezvous.store

    _, client = store
    monkeypatch.setattr(hccl_py.rendezvous.store, "MAX_STORE_BYTES", 64 * 1024)
    client.set("a", b"x" * 20_000)
    client.set("b", b"x" * 20_000)
    with pytest.raises(HcclMemoryError) as info:
        client.set("c", b"x" * 30_000)
    assert info.value.code == 3
    assert client.delete("a")
    client.set("c", b"x" * 30_000)  # room again
    with pytest.raises(HcclParamError):  # one value over the frame limit: refused before it is sent
        client.set("huge", bytes(hccl_py.rendezvous.store.MAX_FRAME_BYTES + 1))


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# A ZMTP 3.0 greeting asking for PLAIN, as a client sends it before its credentials.
_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"PLAIN".ljust(20, b"\0") + b"\x00" + bytes(31)


def test_a_frame_announced_huge_is_refused_before_it_is_stored(store: tuple[StoreServer, StoreClient]) -> None:
    """Before any credentials: a command frame announcing 8 GiB, then 256 MiB of it. The store
    drops the connection when it reads the length; its memory does not grow with the data."""
    import struct

    server, client = store
    before = _rss_mib()
    chunk = bytes(1 << 20)
    with socket.create_connection(("127.0.0.1", server.port)) as attacker:
        attacker.sendall(_GREETING + b"\x06" + struct.pack(">Q", 8 << 30))
        with pytest.raises(OSError):  # reset (or a broken pipe): the store closed the connection
            for _ in range(256):
                attacker.sendall(chunk)
    assert _rss_mib() - before < 64
    client.set("still", b"serving")
    assert client.get("still", timeout_s=1) == b"serving"


def test_many_junk_connections_leave_memory_bounded_and_the_store_serving(
    store: tuple[StoreServer, StoreClient],
) -> None:
    """2000 loopback connections that start a handshake and stall, all open at once, then
    closed: the store keeps answering, and its memory stays within a bound (~15 KiB each)."""
    server, client = store
    client.set("k", b"v")
    before = _rss_mib()
    junk = []
    try:
        for _ in range(2000):
            conn = socket.create_connection(("127.0.0.1", server.port))
            conn.sendall(_GREETING + b"\x04\x1a\x05HELLO")  # half a HELLO command, never finished
            junk.append(conn)
        assert client.get("k", timeout_s=5) == b"v"
        assert _rss_mib() - before < 128
    finally:
        for conn in junk:
            conn.close()
    for _ in range(2000):  # and connections that send garbage and go
        with socket.create_connection(("127.0.0.1", server.port)) as conn:
            conn.sendall(os.urandom(64))
    assert client.get("k", timeout_s=5) == b"v"
    assert _rss_mib() - before < 128
