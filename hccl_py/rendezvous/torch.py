"""hccl-py's rendezvous over a c10d store: the calls ``rendezvous/connect.py`` makes on its store
client (set, get, wait, check, add, set_if_absent, job_id, close), served by a
``torch.distributed.Store``.

Two uses:

- the torch backend meets through the store torch hands it (``init_process_group`` under
  torchrun, or ``env://``/``tcp://`` started by hand), so nothing listens besides torch's store;
- under torchrun, plain ``hccl_py.init()`` meets through torchrun's agent store
  (``MASTER_ADDR:MASTER_PORT``, ``TORCHELASTIC_USE_AGENT_STORE=True``) with torch's own client
  (:meth:`C10dStore.connect`): torch is there, since torchrun is torch's.

The store is the job's, so it is also what admits a rank to the job: hccl-py's store secret
(``HCCL_PY_JOB_SECRET``) guards only hccl-py's own zmq store, which is not used here. The job's id
is agreed in the store (the first rank to ask sets it: torchrun's run id when it names one).
Keys live under ``hccl_py/`` (plus torchrun's restart count), apart from torch's own::

    store = C10dStore(dist.TCPStore("127.0.0.1", 29500, 2, is_master=True), "127.0.0.1:29500")
    store.set("k", b"v"); store.get("k", 5.0)      # b"v"
"""

from __future__ import annotations

import os
import uuid
from datetime import timedelta

from .. import env
from ..errors import HcclConnectError, HcclTimeoutError

_PREFIX = "hccl_py"
_JOB_KEY = "job_id"
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # torchrun: how often the workers were restarted


class C10dStore:
    """A c10d ``Store`` (TCPStore, PrefixStore, FileStore, HashStore) behind the interface of
    :class:`hccl_py.rendezvous.store.StoreClient` that ``connect.py`` uses. ``where`` is ``host:port`` for
    messages and for choosing the TCP transport's route; ``job_id`` the id to propose for the job
    (default: the launcher's, ``env.launcher_job_id``, else a random one)."""

    def __init__(self, store, where: str, job_id: str | None = None):
        import torch.distributed as dist

        restart = os.environ.get(RESTART_COUNT, "0")
        self._store = dist.PrefixStore(f"{_PREFIX}/r{restart}", store)
        self.where = where
        self.address = f"c10d store at {where}"
        launcher = env.launcher_job_id()
        self._proposed = job_id or (launcher[0] if launcher else uuid.uuid4().hex[:12])

    @classmethod
    def connect(cls, host: str, port: int, world_size: int, timeout_s: float) -> C10dStore:
        """A client of the c10d TCPStore at ``host:port`` (torchrun's agent store)."""
        import torch.distributed as dist

        try:
            store = dist.TCPStore(
                host, port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
            )
        except RuntimeError as err:
            raise HcclConnectError(
                f"init: cannot reach torchrun's store at {host}:{port} (MASTER_ADDR:MASTER_PORT, "
                f"{env.TORCHELASTIC_USE_AGENT_STORE}=True): {err}",
                address=f"{host}:{port}",
            ) from None
        return cls(store, f"{host}:{port}")

    # -- the StoreClient calls connect.py makes ----------------------------------------------------
    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (replacing any value)."""
        self._call("set", key, lambda: self._store.set(key, bytes(value)))

    def get(self, key: str, timeout_s: float | None = None) -> bytes:
        """The value of ``key``, waiting for it up to ``timeout_s`` (None: the store's timeout)."""
        self.wait([key], timeout_s)
        return self._call("get", key, lambda: self._store.get(key))

    def check(self, keys) -> list[bool]:
        """For each key, whether it is set now (no waiting)."""
        return [self._call("check", k, lambda k=k: self._store.check([k])) for k in keys]

    def add(self, key: str, delta: int = 1) -> int:
        """Add ``delta`` to the counter ``key`` (0 if absent) atomically; the new value."""
        return int(self._call("add", key, lambda: self._store.add(key, int(delta))))

    def delete(self, key: str) -> bool:
        """Remove ``key``; whether it was there."""
        return bool(self._call("delete", key, lambda: self._store.delete_key(key)))

    def set_if_absent(self, key: str, value: bytes) -> tuple[bool, bytes]:
        """(whether this call set ``key``, the value now stored): c10d's compare_set with an
        empty expected value sets an absent key."""
        value = bytes(value)
        current = bytes(self._call("set_if_absent", key, lambda: self._store.compare_set(key, b"", value)))
        return current == value, current

    def job_id(self) -> str:
        """The job's id, agreed in the store: the first rank to ask sets the one it proposes."""
        return bytes(
            self._call("job_id", _JOB_KEY, lambda: self._store.compare_set(_JOB_KEY, b"", self._proposed.encode()))
        ).decode()

    def wait(self, keys, timeout_s: float | None = None) -> None:
        """Block until every key is set: HcclTimeoutError naming the missing ones after
        ``timeout_s`` (None: the store's timeout), HcclConnectError if the store is gone."""
        keys = list(keys)
        if not keys:
            return
        try:
            if timeout_s is None:
                self._store.wait(keys)
            else:
                self._store.wait(keys, timedelta(seconds=max(timeout_s, 0.001)))
        except RuntimeError as err:  # DistStoreError (timeout), DistNetworkError (store gone)
            if "timeout" not in str(err).lower():
                raise self._lost("wait", keys, err) from None
            missing = [k for k, ok in zip(keys, self.check(keys)) if not ok]
            raise HcclTimeoutError(
                f"store wait timed out after {timeout_s:g} s: {len(missing)} of {len(keys)} key(s) still "
                f"missing: {missing} ({self.address})",
                address=self.address,
                keys=keys,
                missing_keys=missing,
                timeout_s=timeout_s,
            ) from None

    def close(self) -> None:
        """Nothing to release: the store is torch's (a client made by :meth:`connect` closes when dropped)."""

    # -- machinery ------------------------------------------------------------------------------------
    def _call(self, what: str, key: str, fn):
        try:
            return fn()
        except RuntimeError as err:
            raise self._lost(what, [key], err) from None

    def _lost(self, what: str, keys: list[str], err: Exception) -> HcclConnectError:
        return HcclConnectError(
            f"store {what}({keys[0] if len(keys) == 1 else keys!r}) on the {self.address} failed: "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
            address=self.address,
            keys=keys,
        )
