"""Rendezvous key-value store over pyzmq (the role torch's ``TCPStore`` plays).

One :class:`StoreServer` per job (hosted by hccl-launch, by ``launch.spawn``, or by rank 0 when
started without a launcher) and one :class:`StoreClient` per rank. Ranks publish their
endpoints with ``set`` and find their peers' with ``get``/``wait``, which block on the server
until the key exists: the server parks the request and answers it when a ``set`` arrives, so
nothing polls.

Example::

    server = StoreServer()            # binds 127.0.0.1 on a free port
    server.start()
    client = StoreClient(server.address, timeout_s=5)
    client.set("rank0/addr", b"tcp://127.0.0.1:5000")
    client.get("rank0/addr", timeout_s=1)      # b"tcp://127.0.0.1:5000"
    client.add("arrived")                      # 1
    client.close(); server.close()

Wire format (multipart zmq messages). Client -> server: ``[req_id, op, *args]``; server ->
client: ``[req_id, status, *payload]`` with status ``b"\\x00"`` (ok) or ``b"\\x01"`` (error;
payload is the error in its wire form, ``errors.to_wire``: class, message and fields). The client is a DEALER so a request that
timed out does not wedge the socket (a REQ socket would be stuck waiting for that reply): late
replies carry an old ``req_id`` and are dropped.

Security. Every connection must present the job's secret (zmq's PLAIN mechanism, checked by a
ZAP handler the serving thread answers), so a peer without it is dropped at the handshake and
never reaches a key; the client notices the refusal at once (HcclConnectError), not at its
timeout. The secret is ``HCCL_PY_JOB_SECRET`` (hccl-launch and ``launch.spawn`` make one per
job) or else this user's secret file (``<user dir>/secret``, 0600, made on first use; see
``secret.py``): processes of one user on one host share it, others cannot read it.
PLAIN sends the secret in clear: across hosts it guards against other users, not against
someone who can read the network. Memory is bounded: frames over ``MAX_FRAME_BYTES`` close the
connection (``ZMQ_MAXMSGSIZE``; checked before anything is allocated, also during the
handshake), a handshake must finish within ``HANDSHAKE_S``, and keys, values and parked
requests together stay under ``MAX_STORE_BYTES`` (beyond it a request fails with
:class:`HcclMemoryError`).

Each store also has a job id (``job_id()``): the launcher's, or a random one; ranks check
that the store they reach belongs to their job.
"""

from __future__ import annotations

import hmac
import struct
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType

import zmq

from .. import env
from ..errors import (
    HcclConnectError,
    HcclError,
    HcclMemoryError,
    HcclParamError,
    HcclTimeoutError,
    from_wire,
    to_wire,
)
from .secret import MAX_SECRET_BYTES, default_secret

__all__ = ["StoreServer", "StoreClient", "store_address"]

# Ops are single bytes: cheap to send and to compare.
_SET = b"S"
_GET = b"G"
_CHECK = b"C"
_ADD = b"A"
_DELETE = b"D"
_WAIT = b"W"
_CANCEL = b"X"  # client gave up on a parked GET/WAIT; no reply
_SET_NX = b"N"  # set if absent: [b"1", value] when set, [b"0", current value] when the key existed
_JOB = b"J"  # the store's job id

_OK = b"\x00"
_ERR = b"\x01"

_REQ_ID = struct.Struct("<Q")

_LIVENESS_CHECK_S = 0.5

_HINT = "is hccl-launch running / is MASTER_ADDR:MASTER_PORT right?"

MAX_FRAME_BYTES = 16 << 20  # one key or value; rendezvous values are < 1 KiB (a rank's endpoints)
MAX_STORE_BYTES = 256 << 20  # keys + values + parked requests, each charged _ENTRY_BYTES more
_ENTRY_BYTES = 128  # what Python spends around one key or parked request, roughly
HANDSHAKE_S = 10.0  # a connection that has not authenticated by then is closed
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks a context's ZAP handler
_ZAP_DOMAIN = b"hccl_py"
_PLAIN_USER = b"hccl_py"
_REFUSED = {zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL}


class _StoreFull(Exception):
    """A request would take the store past MAX_STORE_BYTES: (message, bytes requested)."""


def store_address(host: str, port: int | str) -> str:
    """The zmq endpoint of a store at ``host:port``, e.g. ``store_address("127.0.0.1", 29500)``;
    an IPv6 address in brackets (zmq reads ``tcp://::1:5`` as an interface name), ``port`` ``"*"``
    for any free one."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port if port == '*' else int(port)}"


# --------------------------------------------------------------------------------------- server


@dataclass(eq=False)
class _Waiter:
    """A parked GET or WAIT: answered once every key in ``missing`` exists."""

    identity: bytes
    req_id: bytes
    op: bytes
    keys: tuple[str, ...]
    missing: set[str] = field(default_factory=set)
    cost: int = 0  # bytes charged against MAX_STORE_BYTES while parked


class StoreServer:
    """Key-value store served by a zmq ROUTER socket from one daemon thread.

    The socket is bound in the constructor (so :attr:`port` is known before :meth:`start`);
    requests that arrive before ``start()`` wait in zmq's queue. ``job_id`` names the job the
    store serves (default: a fresh random id); ``secret`` is what every client must present
    (default: :func:`default_secret`).

    Example::

        with StoreServer(port=0) as server:     # start() is called by __enter__
            print(server.address)               # tcp://127.0.0.1:41234
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, job_id: str | None = None, secret: str | None = None):
        self.host = host
        self.job_id = job_id or uuid.uuid4().hex[:12]
        self._secret = (secret if secret is not None else default_secret()).encode()
        self._ctx = zmq.Context(io_threads=1)
        # The ZAP handler is bound before the ROUTER listens: no handshake can happen without it.
        self._zap = self._ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(_ZAP_ENDPOINT)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.PLAIN_SERVER, 1)
        self._router.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN)
        self._router.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        self._router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self._router.setsockopt(zmq.HANDSHAKE_IVL, int(HANDSHAKE_S * 1000))
        if ":" in host:  # an IPv6 address
            self._router.setsockopt(zmq.IPV6, 1)
        try:
            if port == 0:
                self._router.bind(store_address(host, "*"))
            else:
                self._router.bind(store_address(host, port))
        except zmq.ZMQError as err:
            self._router.close(0)
            self._zap.close(0)
            self._ctx.term()
            raise HcclConnectError(
                f"store cannot bind tcp://{host}:{port}: {err.strerror}"
                + (
                    " (another job or store already uses this port: give each job its own port, hccl-launch "
                    "--master-port or MASTER_PORT, or 0 for a free one)"
                    if err.errno == zmq.EADDRINUSE
                    else ""
                ),
                address=f"tcp://{host}:{port}",
                errno=err.errno,
            ) from None
        endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port: int = int(endpoint.rsplit(":", 1)[1])
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lifecycle = threading.Lock()
        # State below is touched only by the serving thread.
        self._data: dict[str, bytes] = {}
        self._waiting: dict[str, list[_Waiter]] = {}
        self._by_request: dict[tuple[bytes, bytes], _Waiter] = {}
        self._used = 0  # bytes charged against MAX_STORE_BYTES

    @property
    def address(self) -> str:
        """``tcp://host:port`` that clients connect to."""
        return store_address(self.host, self.port)

    @property
    def secret(self) -> str:
        """The job secret clients must present (for the host to hand to its ranks)."""
        return self._secret.decode()

    def start(self) -> StoreServer:
        """Serve requests from a daemon thread; returns ``self``."""
        with self._lifecycle:
            if self._closed:
                raise HcclParamError("StoreServer.start() after close()")
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=f"hccl-store:{self.port}", daemon=True)
                self._thread.start()
        return self

    def close(self) -> None:
        """Stop the serving thread and close the sockets. Idempotent."""
        with self._lifecycle:
            if self._closed:
                return
            self._closed = True
            if self._thread is None:
                self._router.close(0)
                self._zap.close(0)
            # term() makes the serving thread's blocking poll raise ContextTerminated; the thread
            # then closes the sockets, which lets term() return. No wake-up socket, no polling.
            self._ctx.term()
            if self._thread is not None:
                self._thread.join()

    def __enter__(self) -> StoreServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- serving thread --------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._zap, zmq.POLLIN)
        try:
            while True:
                for sock, _ in poller.poll():
                    if sock is self._zap:
                        self._authenticate(self._zap.recv_multipart())
                    else:
                        self._handle(self._router.recv_multipart())
        except zmq.ContextTerminated:
            pass  # close() was called
        finally:
            self._router.close(0)
            self._zap.close(0)

    def _authenticate(self, frames: list[bytes]) -> None:
        """A ZAP request (RFC 27) for a new connection: PLAIN with this job's secret, or refused."""
        ok = (
            len(frames) >= 8
            and frames[0] == b"1.0"
            and frames[5] == b"PLAIN"
            and hmac.compare_digest(frames[7], self._secret)
        )
        request_id = frames[1] if len(frames) > 1 else b""
        self._zap.send_multipart(
            [b"1.0", request_id, b"200" if ok else b"400", b"OK" if ok else b"not this job's secret", b"", b""]
        )

    def _reply(self, identity: bytes, req_id: bytes, *payload: bytes) -> None:
        self._router.send_multipart([identity, req_id, _OK, *payload])

    def _error(self, identity: bytes, req_id: bytes, error: HcclError) -> None:
        self._router.send_multipart([identity, req_id, _ERR, to_wire(error)])

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) < 3:
            return  # not our protocol; nothing sensible to answer
        identity, req_id, op, args = frames[0], frames[1], frames[2], frames[3:]
        try:
            if op == _SET and len(args) == 2:
                self._put(args[0].decode(), args[1])
                self._reply(identity, req_id)
            elif op == _SET_NX and len(args) == 2:
                key = args[0].decode()
                if key in self._data:
                    self._reply(identity, req_id, b"0", self._data[key])
                else:
                    self._put(key, args[1])
                    self._reply(identity, req_id, b"1", args[1])
            elif op == _GET and len(args) == 1:
                key = args[0].decode()
                if key in self._data:
                    self._reply(identity, req_id, self._data[key])
                else:
                    self._park(_Waiter(identity, req_id, _GET, (key,), {key}))
            elif op == _WAIT:
                keys = tuple(a.decode() for a in args)
                missing = {k for k in keys if k not in self._data}
                if missing:
                    self._park(_Waiter(identity, req_id, _WAIT, keys, missing))
                else:
                    self._reply(identity, req_id)
            elif op == _CHECK:
                self._reply(identity, req_id, *[b"1" if a.decode() in self._data else b"0" for a in args])
            elif op == _ADD and len(args) == 2:
                key = args[0].decode()
                try:
                    current = int(self._data.get(key, b"0"))
                except ValueError:
                    self._error(
                        identity,
                        req_id,
                        HcclParamError(
                            f"store add({key!r}): current value {self._data[key]!r} is not an integer",
                            key=key,
                            value=self._data[key].decode(errors="replace"),
                            rule="type",
                            expected="int",
                        ),
                    )
                    return
                value = current + int(args[1])
                self._put(key, str(value).encode())
                self._reply(identity, req_id, str(value).encode())
            elif op == _DELETE and len(args) == 1:
                key = args[0].decode()
                old = self._data.pop(key, None)
                if old is not None:
                    self._used -= _entry_bytes(key, old)
                self._reply(identity, req_id, b"1" if old is not None else b"0")
            elif op == _JOB and not args:
                self._reply(identity, req_id, self.job_id.encode())
            elif op == _CANCEL:
                self._unpark(self._by_request.get((identity, req_id)))
            else:
                self._error(
                    identity, req_id, HcclParamError(f"store: unknown request {op!r} with {len(args)} argument(s)")
                )
        except _StoreFull as full:
            self._error(identity, req_id, HcclMemoryError(full.args[0], requested=full.args[1]))
        except (UnicodeDecodeError, ValueError) as err:
            self._error(identity, req_id, HcclParamError(f"store: malformed request {op!r}: {err}"))
        except zmq.ContextTerminated:
            raise
        except Exception as err:  # a bug here must not kill the thread and hang every client
            self._error(
                identity, req_id, HcclParamError(f"store: internal error on {op!r}: {type(err).__name__}: {err}")
            )

    def _charge(self, delta: int, what: str) -> None:
        if delta > 0 and self._used + delta > MAX_STORE_BYTES:
            raise _StoreFull(
                f"store {what}: the store is full ({self._used >> 20} MiB of {MAX_STORE_BYTES >> 20} MiB in "
                f"{len(self._data)} keys and {len(self._by_request)} waiting requests); it holds rendezvous "
                "data, not payloads: delete keys no longer needed",
                delta,
            )
        self._used += delta

    def _put(self, key: str, value: bytes) -> None:
        old = self._data.get(key)
        self._charge(_entry_bytes(key, value) - (0 if old is None else _entry_bytes(key, old)), f"set({key!r})")
        self._data[key] = value
        waiters = self._waiting.pop(key, None)
        if not waiters:
            return
        for waiter in waiters:
            waiter.missing.discard(key)
            if waiter.missing:
                continue
            self._unpark(waiter)
            if waiter.op == _GET:
                self._reply(waiter.identity, waiter.req_id, value)
            else:
                self._reply(waiter.identity, waiter.req_id)

    def _park(self, waiter: _Waiter) -> None:
        cost = _ENTRY_BYTES + len(waiter.identity) + sum(len(k) + _ENTRY_BYTES for k in waiter.keys)
        self._charge(cost, f"wait for {len(waiter.keys)} key(s)")
        waiter.cost = cost
        self._by_request[(waiter.identity, waiter.req_id)] = waiter
        for key in waiter.missing:
            self._waiting.setdefault(key, []).append(waiter)

    def _unpark(self, waiter: _Waiter | None) -> None:
        if waiter is None:
            return
        if self._by_request.pop((waiter.identity, waiter.req_id), None) is not None:
            self._used -= waiter.cost
        for key in waiter.missing:
            parked = self._waiting.get(key)
            if parked is not None and waiter in parked:
                parked.remove(waiter)
                if not parked:
                    del self._waiting[key]


# --------------------------------------------------------------------------------------- client


class StoreClient:
    """Client of a :class:`StoreServer`; every call is bounded by a timeout.

    ``timeout_s`` is the default bound for calls that do not pass their own; it defaults to
    ``HCCL_CONNECT_TIMEOUT``. A client may be shared by threads, but calls are serialised (a
    blocking ``get`` holds it): give each thread that waits on keys its own client.

    ``secret`` is the job secret the store requires (default: :func:`default_secret`); a store
    that refuses it makes the first call raise :class:`HcclConnectError` at once.

    Example::

        client = StoreClient("tcp://127.0.0.1:29500", timeout_s=10)
        client.set("rank1/ready", b"1")
        client.wait(["rank0/ready", "rank1/ready"])   # raises HcclTimeoutError naming the missing
        client.close()
    """

    def __init__(self, address: str, timeout_s: float | None = None, *, secret: str | None = None):
        self.address = address
        self.timeout_s = float(timeout_s) if timeout_s is not None else env.connect_timeout_s()
        if self.timeout_s <= 0:
            raise HcclParamError(
                f"StoreClient timeout_s={timeout_s!r} must be > 0",
                arg="timeout_s",
                value=timeout_s,
                rule="range",
                expected="> 0",
            )
        password = (secret if secret is not None else default_secret()).encode()
        if not password or len(password) > MAX_SECRET_BYTES:
            raise HcclParamError(
                f"StoreClient: the job secret must be 1-{MAX_SECRET_BYTES} bytes, got {len(password)}",
                arg="secret",
                value=len(password),
                rule="range",
                expected=f"1..{MAX_SECRET_BYTES} bytes",
            )
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)  # close() never waits for undelivered messages
        if "[" in address:  # IPv6 only for an IPv6 address: "localhost" must not resolve to ::1 and miss an IPv4 store
            self._sock.setsockopt(zmq.IPV6, 1)
        # IMMEDIATE: queue only on completed connections, so "not writable" means "server not
        # reachable" and we can say so instead of reporting a misleading key timeout.
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        self._sock.setsockopt(zmq.PLAIN_USERNAME, _PLAIN_USER)
        self._sock.setsockopt(zmq.PLAIN_PASSWORD, password)
        # Handshake outcomes: a refusal shows here at once (the socket itself would only stay
        # unwritable while zmq retries, until the timeout).
        self._monitor = self._sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        )
        try:
            self._sock.connect(address)
        except zmq.ZMQError as err:
            self._close_sockets()
            raise HcclConnectError(
                f"store address {address!r} is not valid: {err.strerror}; {_HINT}", address=address, errno=err.errno
            ) from None
        self._next_id = 0
        self._lock = threading.Lock()
        self._closed = False
        self._refused: str | None = None  # why the store refused our handshake, once it has

    @classmethod
    def from_env(cls, timeout_s: float | None = None) -> StoreClient:
        """Connect to the job's store: ``HCCL_PY_STORE_ADDR``/``HCCL_PY_STORE_PORT`` (set by
        hccl-launch and ``launch.spawn``), else ``MASTER_ADDR``/``MASTER_PORT``.

        Example: ``client = StoreClient.from_env()``.
        """
        host, port, _ = env.store_address()
        if port is None:
            raise HcclParamError(
                f"{env.STORE_PORT} and {env.MASTER_PORT} are not set; start the job with hccl-launch "
                "or set MASTER_ADDR/MASTER_PORT to the rendezvous store's host and port",
                variable=env.MASTER_PORT,
                rule="required",
            )
        return cls(store_address(host, port), timeout_s)

    # -- public calls ------------------------------------------------------------------------

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (overwrites) and wake every ``get``/``wait`` on it."""
        self._request(_SET, [_key(key), _value(key, value)], None, f"set({key!r})")

    def get(self, key: str, timeout_s: float | None = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout_s`` for some client to set it.

        Raises :class:`HcclTimeoutError` naming the key and the timeout. ``timeout_s <= 0``
        means "do not wait" (a deadline that already passed), not an error.
        """
        if timeout_s is not None and timeout_s <= 0:
            self._expect_present([key], f"get({key!r})")
            timeout_s = None  # present: the answer is immediate; bound the round trip as usual
        return self._request(_GET, [_key(key)], timeout_s, f"get({key!r})", keys=(key,))[0]

    def check(self, keys: Sequence[str]) -> list[bool]:
        """For each key, whether it exists now (never waits for keys)."""
        keys = _key_list(keys)
        reply = self._request(_CHECK, [_key(k) for k in keys], None, f"check({keys!r})")
        return [flag == b"1" for flag in reply]

    def add(self, key: str, delta: int = 1) -> int:
        """Atomically add ``delta`` to the integer under ``key`` (missing = 0); the new value."""
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise HcclParamError(
                f"store add({key!r}, delta={delta!r}): delta must be an int",
                key=key,
                arg="delta",
                value=repr(delta),
                rule="type",
                expected="int",
            )
        return int(self._request(_ADD, [_key(key), str(delta).encode()], None, f"add({key!r})")[0])

    def set_if_absent(self, key: str, value: bytes) -> tuple[bool, bytes]:
        """Atomically store ``value`` under ``key`` unless the key exists: (whether this call set
        it, the value now stored). How a rank claims its slot: the second claimant learns who
        holds it."""
        flag, current = self._request(_SET_NX, [_key(key), _value(key, value)], None, f"set_if_absent({key!r})")
        return flag == b"1", current

    def job_id(self) -> str:
        """The id of the job this store serves (the launcher's, or the store's own random one)."""
        return self._request(_JOB, [], None, "job_id()")[0].decode(errors="replace")

    def delete(self, key: str) -> bool:
        """Remove ``key``; whether it existed."""
        return self._request(_DELETE, [_key(key)], None, f"delete({key!r})")[0] == b"1"

    def wait(self, keys: Sequence[str], timeout_s: float | None = None) -> None:
        """Block until every key exists.

        On expiry raises :class:`HcclTimeoutError` whose message (and ``missing_keys``
        attribute) lists exactly the keys still missing.
        """
        keys = _key_list(keys)
        if not keys:
            return
        if timeout_s is not None and timeout_s <= 0:
            self._expect_present(keys, f"wait({keys!r})")
            return
        self._request(_WAIT, [_key(k) for k in keys], timeout_s, f"wait({keys!r})", keys=tuple(keys))

    def _expect_present(self, keys: list[str], what: str) -> None:
        # A timeout of 0 (a deadline already passed) means "do not wait": one CHECK decides.
        missing = [k for k, present in zip(keys, self.check(keys)) if not present]
        if missing:
            raise HcclTimeoutError(
                f"store {what} timed out (timeout 0 s: no waiting): key(s) {missing} not set (store {self.address})",
                address=self.address,
                keys=keys,
                missing_keys=missing,
                timeout_s=0,
                **({"key": keys[0]} if len(keys) == 1 else {}),
            )

    def close(self) -> None:
        """Close the socket and the zmq context (no lingering, no threads left). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close_sockets()

    def _close_sockets(self) -> None:
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close(0)
        self._sock.close(0)
        self._ctx.term()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- machinery -------------------------------------------------------------------------

    def _request(
        self, op: bytes, args: list[bytes], timeout_s: float | None, what: str, keys: tuple[str, ...] | None = None
    ) -> list[bytes]:
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if timeout <= 0:
            raise HcclParamError(
                f"store {what}: timeout_s={timeout_s!r} must be > 0",
                arg="timeout_s",
                value=timeout_s,
                rule="range",
                expected="> 0",
            )
        with self._lock:
            if self._closed:
                raise HcclParamError(f"store {what} on a closed StoreClient", address=self.address, state="closed")
            deadline = time.monotonic() + timeout
            if self._refused is not None:
                self._check_refused(what)
            self._next_id += 1
            req_id = _REQ_ID.pack(self._next_id)
            try:
                self._sock.send_multipart([req_id, op, *args], zmq.NOBLOCK)
            except zmq.Again:
                # Not writable = no completed connection (IMMEDIATE): the server is not there
                # (yet), or it refused our handshake. Wait for the connection only on this slow path.
                if not self._wait_writable(deadline, what):
                    raise HcclConnectError(
                        f"store {what}: could not reach the rendezvous store at {self.address} "
                        f"within {timeout:g} s; {_HINT}",
                        address=self.address,
                        timeout_s=timeout,
                    ) from None
                self._sock.send_multipart([req_id, op, *args], zmq.NOBLOCK)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timed_out(req_id, what, timeout, keys)
                # Wake up now and then during long waits to notice a store that went away (its
                # host crashed): the parked request died with it, so fail now, not at the timeout.
                if not self._sock.poll(_ms(min(remaining, _LIVENESS_CHECK_S)), zmq.POLLIN):
                    if not self._sock.poll(0, zmq.POLLOUT):
                        raise self._timed_out(req_id, what, timeout, keys)
                    continue
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
                if len(frames) < 2 or frames[0] != req_id:
                    continue  # reply to a request that already timed out
                if frames[1] == _ERR:
                    raise (
                        from_wire(frames[2])
                        if len(frames) > 2
                        else HcclParamError(f"store {what} failed", address=self.address)
                    )
                return frames[2:]

    def _wait_writable(self, deadline: float, what: str) -> bool:
        """Wait until the connection is up (True) or the deadline passes (False); a handshake
        the store refused raises HcclConnectError at once."""
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLOUT)
        poller.register(self._monitor, zmq.POLLIN)
        while (remaining := deadline - time.monotonic()) > 0:
            ready = dict(poller.poll(_ms(remaining)))
            if self._monitor in ready:
                self._check_refused(what)
            if self._sock in ready:
                return True
        return False

    def _check_refused(self, what: str) -> None:
        """Raise HcclConnectError if the store refused our handshake (zmq does not reconnect
        after that, so every later call fails the same way)."""
        while self._refused is None and self._monitor.poll(0, zmq.POLLIN):
            # Imported here: zmq.utils.monitor loads asyncio (~20 ms a rank), and only a refusal gets here.
            from zmq.utils.monitor import recv_monitor_message

            event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._refused = (
                    f"the store at {self.address} refused this process's job secret: it belongs to another job, or "
                    f"this rank has another {env.JOB_SECRET} (or another user's secret file) than the store's; give "
                    f"every rank of the job the same {env.JOB_SECRET}, or check MASTER_ADDR:MASTER_PORT"
                )
            elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                self._refused = (
                    f"{self.address} does not speak this hccl-py version's store protocol (another program on "
                    "that port, or another hccl-py version); check MASTER_ADDR:MASTER_PORT"
                )
        if self._refused is not None:
            raise HcclConnectError(f"store {what}: {self._refused}", address=self.address)

    def _timed_out(self, req_id: bytes, what: str, timeout: float, keys: tuple[str, ...] | None) -> Exception:
        try:
            self._check_refused(what)
        except HcclConnectError as refused:
            return refused
        if not self._sock.poll(0, zmq.POLLOUT):
            return HcclConnectError(
                f"store {what}: lost the connection to the rendezvous store at {self.address} "
                f"while waiting for the answer; {_HINT}",
                address=self.address,
                **({"key": keys[0]} if keys and len(keys) == 1 else {"keys": list(keys)} if keys else {}),
            )
        if keys is None:
            # SET/CHECK/ADD/DELETE are answered at once; silence means the server is wedged or gone.
            return HcclTimeoutError(
                f"store {what}: no answer from the rendezvous store at {self.address} within {timeout:g} s; {_HINT}",
                address=self.address,
                timeout_s=timeout,
            )
        # Withdraw the parked request so the server does not answer it (and keep no state) later.
        try:
            self._sock.send_multipart([req_id, _CANCEL], zmq.NOBLOCK)
        except zmq.Again:
            pass
        missing = self._still_missing(keys) if len(keys) > 1 else list(keys)
        # missing_keys: for callers that act on them
        if len(keys) == 1:
            return HcclTimeoutError(
                f"store {what} timed out after {timeout:g} s: no rank set key {keys[0]!r} (store {self.address})",
                address=self.address,
                key=keys[0],
                keys=list(keys),
                missing_keys=missing,
                timeout_s=timeout,
            )
        return HcclTimeoutError(
            f"store wait timed out after {timeout:g} s: {len(missing)} of {len(keys)} key(s) "
            f"still missing: {missing} (store {self.address})",
            address=self.address,
            keys=list(keys),
            missing_keys=missing,
            timeout_s=timeout,
        )

    def _still_missing(self, keys: tuple[str, ...]) -> list[str]:
        """Ask once (briefly) which keys are still missing; all of them if the server is silent."""
        self._next_id += 1
        req_id = _REQ_ID.pack(self._next_id)
        try:
            self._sock.send_multipart([req_id, _CHECK, *[_key(k) for k in keys]], zmq.NOBLOCK)
        except zmq.Again:
            return list(keys)
        deadline = time.monotonic() + 1.0
        while (remaining := deadline - time.monotonic()) > 0 and self._sock.poll(_ms(remaining), zmq.POLLIN):
            frames = self._sock.recv_multipart(zmq.NOBLOCK)
            if frames[0] == req_id and frames[1] == _OK:
                return [k for k, flag in zip(keys, frames[2:]) if flag != b"1"]
        return list(keys)


def _entry_bytes(key: str, value: bytes) -> int:
    return len(key) + len(value) + _ENTRY_BYTES


def _ms(seconds: float) -> int:
    # zmq poll takes integer milliseconds; round up so a tiny remainder still waits.
    return max(1, int(seconds * 1000 + 0.999))


def _key(key: str) -> bytes:
    if not isinstance(key, str):
        raise HcclParamError(
            f"store keys are str, got {type(key).__name__}: {key!r}",
            arg="key",
            value=repr(key),
            rule="type",
            expected="str",
        )
    data = key.encode()
    if len(data) > MAX_FRAME_BYTES:
        raise HcclParamError(
            f"store key of {len(data)} bytes is longer than {MAX_FRAME_BYTES >> 20} MiB",
            arg="key",
            value=len(data),
            rule="range",
            expected=f"<= {MAX_FRAME_BYTES} bytes",
        )
    return data


def _key_list(keys: Iterable[str]) -> list[str]:
    if isinstance(keys, str):
        raise HcclParamError(
            f"store expects a list of keys, got the single string {keys!r}",
            arg="keys",
            value=keys,
            rule="type",
            expected="list of str",
        )
    return list(keys)


def _value(key: str, value: bytes) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise HcclParamError(
            f"store set({key!r}): values are bytes, got {type(value).__name__}; encode it first",
            key=key,
            arg="value",
            rule="type",
            expected="bytes",
        )
    value = bytes(value)
    if len(value) > MAX_FRAME_BYTES:
        raise HcclParamError(
            f"store set({key!r}): {len(value)} bytes is more than the store takes in one value "
            f"({MAX_FRAME_BYTES >> 20} MiB); the store is for rendezvous data, send payloads with a collective",
            key=key,
            arg="value",
            value=len(value),
            rule="range",
            expected=f"<= {MAX_FRAME_BYTES} bytes",
        )
    return value
