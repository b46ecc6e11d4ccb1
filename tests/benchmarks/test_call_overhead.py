"""The in-process per-call benchmark: its loopback peers must make the runtime do real work."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.call_overhead import loopback_comm, main, measure


@pytest.mark.parametrize("size, algo", [(2, "rd"), (4, "oneshot"), (4, "rd"), (8, "rd")])
def test_mirrored_peers_give_n_times_the_input(size, algo):
    comm = loopback_comm(size)
    x = np.arange(10, dtype=np.float32)
    comm.all_reduce(x, algo=algo)
    assert np.array_equal(x, size * np.arange(10, dtype=np.float32))
    assert comm.clock > 0  # the modeled clock advanced as on a real rank


def test_a_ring_cannot_be_mirrored_and_times_out():
    from hccl_py.errors import HcclTimeoutError

    with pytest.raises(HcclTimeoutError) as info:
        loopback_comm(4).all_reduce(np.ones(8, np.float32), algo="ring")
    # rank 0 waits in the ring's first step for its left neighbour, which the mirror cannot play
    assert (info.value.op, info.value.seq, info.value.step, info.value.ranks) == ("allreduce", 1, 1, [3])


def test_an_algorithm_the_mirror_cannot_serve_is_refused():
    with pytest.raises(ValueError, match="cannot serve algo='ring'"):
        measure(2, 8, algo="ring", calls=10, repeats=1)


def test_unmodeled_comm_keeps_the_clock_at_zero():
    comm = loopback_comm(2, modeled=False)
    comm.all_reduce(np.ones(4, np.float32), algo="rd")
    assert comm.clock == 0.0


def test_measure_and_cli(capsys):
    result = measure(2, 8, calls=50, repeats=1)
    assert result["modeled"] > 0 and result["unmodeled"] > 0
    main(["-n", "2", "--calls", "20", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "bookkeeping" in out and out.count("\n") >= 3
