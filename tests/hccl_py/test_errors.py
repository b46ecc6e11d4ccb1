"""Errors carry their context as fields and cross processes in one wire form."""

from __future__ import annotations

import pickle

import pytest

import hccl_py
from hccl_py.errors import HcclResult, error_class, from_wire, to_wire

CLASSES = [
    hccl_py.HcclParamError,
    hccl_py.HcclMemoryError,
    hccl_py.HcclInternalError,
    hccl_py.HcclNotSupportedError,
    hccl_py.HcclSyscallError,
    hccl_py.HcclTimeoutError,
    hccl_py.HcclConnectError,
    hccl_py.HcclRemoteError,
]


@pytest.mark.parametrize("cls", CLASSES)
def test_wire_form_keeps_class_code_message_and_fields(cls):
    err = cls("it broke", rank=1, peer=3, op="allreduce", seq=7, step=2, comm="world", ranks=[2, 3])
    back = from_wire(to_wire(err))
    assert type(back) is cls and back.code == cls.code
    assert back.message == "it broke"
    assert (back.rank, back.peer, back.op, back.seq, back.step, back.comm, back.ranks) == (
        1,
        3,
        "allreduce",
        7,
        2,
        "world",
        [2, 3],
    )
    assert error_class(int(cls.code)) is cls


@pytest.mark.parametrize("cls", CLASSES)
def test_pickling_keeps_fields(cls):
    back = pickle.loads(pickle.dumps(cls("x", peer=4)))
    assert type(back) is cls and back.peer == 4


def test_fields_that_do_not_apply_are_none_and_unknown_names_raise():
    err = hccl_py.HcclTimeoutError("late")
    assert err.peer is None and err.step is None and err.fields == {}
    assert err.arg is None and err.value is None and err.variable is None  # every documented name reads
    with pytest.raises(AttributeError):
        err.no_such_field


@pytest.mark.parametrize("data", [b"", b"\x01", b"{}", b'{"code": "x", "message": 1}', b"\xff\xfe"])
def test_unreadable_wire_data_is_a_remote_error(data):
    err = from_wire(data)
    assert isinstance(err, hccl_py.HcclRemoteError) and err.code == HcclResult.E_REMOTE


def test_numpy_numbers_in_fields_cross_as_numbers():
    import numpy as np

    back = from_wire(to_wire(hccl_py.HcclParamError("bad", value=[np.int64(3)], arg="ranks", buffer=np.zeros(2))))
    assert (back.arg, back.value) == ("ranks", [3])
    assert "buffer" not in back.fields  # an array is not sent at all


def test_long_messages_are_cut_to_fit_one_datagram():
    assert len(to_wire(hccl_py.HcclRemoteError("x" * 100_000))) < 5000
