"""Point-to-point calls from a rank to itself, as NCCL and Ascend's HCCL allow in a batch: the
k-th send to itself is its k-th receive from itself (:class:`SelfLoop`), whichever is posted
first; a receive posted first is a Work done when its send comes (:class:`SelfRecvWork`)."""

from __future__ import annotations

import collections
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.futures import Future

from ..errors import HcclParamError, HcclTimeoutError
from .tensors import check
from .work import DONE, backend_error


class SelfRecvWork(dist.Work):
    """A receive from this rank itself posted before its send: done when the send comes."""

    def __init__(self, what: str, tensor: torch.Tensor, timeout_s: float | None):
        super().__init__()
        self._what, self._tensor, self._timeout_s = what, tensor, timeout_s
        self._done = threading.Event()
        self._future = Future()

    def deliver(self, data: torch.Tensor) -> None:
        """The send has come: copy its data into the receive's tensor and complete."""
        with torch.no_grad():
            self._tensor.copy_(data.reshape(self._tensor.shape))
        self._done.set()
        self._future.set_result([self._tensor])

    def wait(self, timeout: timedelta | None = None) -> bool:
        limit = timeout.total_seconds() if timeout is not None else self._timeout_s
        if not self._done.wait(limit):
            raise backend_error(
                HcclTimeoutError(
                    f"{self._what}: this rank never sent to itself within {limit} s", op="recv", peer=-1, rule="timeout"
                ),
                self._what,
            )
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set()

    def exception(self):
        return None

    def result(self) -> list:
        return [self._tensor]

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> Future:
        return self._future


class SelfLoop:
    """Point-to-point calls from a rank to itself, as NCCL and Ascend's HCCL allow in a batch: the
    k-th send to itself is its k-th receive from itself, in either order of posting."""

    def __init__(self, comm):
        self._comm = comm
        self._sent: collections.deque[torch.Tensor] = collections.deque()
        self._waiting: collections.deque[SelfRecvWork] = collections.deque()

    def send(self, t: torch.Tensor, what: str):
        """Send ``t`` to this rank: a waiting receive gets it, else it waits for one (a copy)."""
        check(t, what)
        data = t.detach().clone(memory_format=torch.contiguous_format)
        if self._waiting:
            self._match(self._waiting[0]._tensor, data, what)  # a mismatch leaves the receive waiting
            work = self._waiting.popleft()
            work.deliver(data)
        else:
            self._sent.append(data)
        return DONE

    def recv(self, t: torch.Tensor, what: str):
        """Receive into ``t`` from this rank: a waiting send's data, else done when one comes."""
        check(t, what)
        work = SelfRecvWork(what, t, self._comm.timeout_s)
        if self._sent:
            self._match(t, self._sent[0], what)
            work.deliver(self._sent.popleft())
        else:
            self._waiting.append(work)
        return work

    @staticmethod
    def _match(into: torch.Tensor, data: torch.Tensor, what: str) -> None:
        if into.numel() != data.numel() or into.dtype != data.dtype:
            raise HcclParamError(
                f"{what}: this rank sent itself {data.numel()} x {data.dtype} but receives "
                f"{into.numel()} x {into.dtype}",
                arg="tensor",
                rule="match",
                value=[into.numel(), str(into.dtype)],
                expected=[data.numel(), str(data.dtype)],
            )
