"""The collective semantics of peers' own test suites, re-stated case by case against hccl-py.

Two suites are followed, each case checked on every rank against values computed in closed form
from the rank and the world size (never from what another rank produced):

* mpi4py's ``test_cco_buf`` (``TestCCOBuf``): Barrier; Bcast from every root; Reduce to every
  root with SUM/PROD/MAX/MIN; Allreduce; Allgather; Reduce_scatter_block; and their in-place
  forms (``MPI.IN_PLACE``: the send buffer *is* the receive buffer, or this rank's block of it).
* torch's distributed collective tests (``distributed_test.py``: ``test_all_reduce_*``,
  ``test_broadcast``, ``test_reduce_*``, ``test_all_gather``, ``test_reduce_scatter``, the
  ``_group`` variants on sub-groups such as ``[1, 2]``): a master value on one rank and a worker
  value on the others (``_test_all_reduce_helper``), every source and destination rank.

Every case runs with every algorithm the collective has, plus ``auto``, on every dtype, with
counts 0, 1, size-1, size, size+1, an odd count and (``large_cases``) one above HCCL_BUFFSIZE;
the reduction ops rotate over those cases (``rotated``) rather than multiply them.
NCCL's in-place forms (``recvbuff = sendbuff + rank * recvcount``) and every other overlap of an
output with the input are swept offset by offset (``overlap_cases``). Allreduce results must be
bit-identical on every rank, NaN payloads and signed zeros included (``bitwise_cases``).

A case is ``run(comm) -> digest | None``: it raises AssertionError naming itself when a rank's
result is wrong; the digest (when the result must agree across ranks) is compared by the test.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

from hccl_py.algorithms.registry import algos_for
from hccl_py.dtypes import UFUNCS, ReduceOp, bfloat16

DTYPES = [
    np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.float16, np.float32, np.float64)
] + [bfloat16]
FLOATS = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), bfloat16}
OPS = (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN)
NO_PROD = {np.dtype(np.int16), bfloat16}  # as HCCL on Atlas A2


class Case(NamedTuple):
    name: str
    run: Callable  # (comm) -> digest str | None


def counts(size: int) -> list[int]:
    """0, 1, size-1, size, size+1 and an odd count, without repeats."""
    return list(dict.fromkeys([0, 1, max(size - 1, 2), size, size + 1, 37]))


def algos(collective: str) -> tuple[str, ...]:
    return (*algos_for(collective), "auto")


def ops_for(dtype: np.dtype) -> tuple[ReduceOp, ...]:
    return tuple(op for op in OPS if not (op is ReduceOp.PROD and dtype in NO_PROD))


def rotated(first, second, shift: int) -> Iterator[tuple]:
    """``max(len(first), len(second))`` pairs that take every value of both, the second rotated by
    ``shift``: with the shift stepping per algorithm, dtype and world size, every (algorithm,
    dtype, op) and (algorithm, count, op) is still met, at a quarter to a third of the whole
    product's cases (the reduction op is applied element by element, whatever the algorithm's
    data movement), and each world size meets other combinations of all four."""
    first, second = list(first), list(second)
    for i in range(max(len(first), len(second))):
        yield first[i % len(first)], second[(i + shift) % len(second)]


def digest(array: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(array).view(np.uint8).tobytes(), digest_size=8).hexdigest()


# -- values from rank and size ---------------------------------------------------------------------
def value(rank: int, count: int, dtype: np.dtype, op: ReduceOp | None = None, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s small-integer input (exact in every dtype, also summed or multiplied over 8
    ranks): products take -1, 1, 2 (1, 2 unsigned); everything else -3..3 (0..6 unsigned)."""
    i = np.arange(count, dtype=np.int64)
    mix = rank * 3 + i * 5 + salt
    if op is ReduceOp.PROD:
        raw = np.array([1, 2, -1] if dtype.kind != "u" else [1, 2, 1], np.int64)[mix % 3]
    else:
        raw = mix % 7 - (3 if dtype.kind != "u" else 0)
    return raw.astype(dtype)


def reduced(
    size: int, count: int, dtype: np.dtype, op: ReduceOp, ranks: range | None = None, salt: int = 0
) -> np.ndarray:
    """The reduction of every rank's ``value``: integers wrap as the dtype does; float results are
    small integers, so exact."""
    ranks = range(size) if ranks is None else ranks
    stack = np.stack([value(r, count, dtype, op, salt).astype(np.float64 if dtype in FLOATS else dtype) for r in ranks])
    return UFUNCS[op].reduce(stack, axis=0).astype(dtype)


def garbage(rank: int, count: int, dtype: np.dtype) -> np.ndarray:
    """What a buffer holds before a collective overwrites it: rank-dependent, never the answer."""
    return ((np.arange(count) * 7 + rank * 13 + 101) % 127).astype(dtype)


def expect(got: np.ndarray, want: np.ndarray, where: str) -> None:
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{where}: got shape {got.shape} {got.dtype}, expected {want.shape} {want.dtype}")
    g = got.astype(np.float64) if got.dtype == bfloat16 else got
    w = want.astype(np.float64) if want.dtype == bfloat16 else want
    if not np.array_equal(g, w):
        bad = int(np.flatnonzero(g.ravel() != w.ravel())[0])
        raise AssertionError(f"{where}: element {bad}: got {g.ravel()[bad]!r}, expected {w.ravel()[bad]!r}")


# -- the cases ---------------------------------------------------------------------------------------
def basic_cases(size: int, dtypes=DTYPES) -> Iterator[Case]:
    """mpi4py's and torch's collective cases, every algorithm, dtype, root and count; the reduction
    ops rotate (``rotated``), so every algorithm meets every op on every dtype."""
    yield Case("barrier", lambda comm: comm.barrier())
    for d, dtype in enumerate(dtypes):
        for algo in algos("broadcast"):
            for root in range(size):
                n = counts(size)[root % len(counts(size))]
                yield Case(f"bcast/{algo}/{dtype}/root{root}/n{n}", _bcast(algo, dtype, root, n))
        for algo in algos("allgather"):
            for n in counts(size):
                yield Case(f"allgather/{algo}/{dtype}/n{n}", _allgather(algo, dtype, n))
        ops = ops_for(dtype)
        for a, algo in enumerate(algos("allreduce")):
            for n, op in rotated(counts(size), ops, shift=a + d + size):
                yield Case(f"allreduce/{algo}/{dtype}/{op.name}/n{n}", _allreduce(algo, dtype, op, n))
        for a, algo in enumerate(algos("reduce")):
            for root, op in rotated(range(size), ops, shift=a + d + size):
                n = counts(size)[(root + op) % len(counts(size))]
                yield Case(f"reduce/{algo}/{dtype}/{op.name}/root{root}/n{n}", _reduce(algo, dtype, op, root, n))
        for a, algo in enumerate(algos("reduce_scatter")):
            for n, op in rotated(counts(size), ops, shift=a + d + size):
                yield Case(f"reduce_scatter/{algo}/{dtype}/{op.name}/n{n}", _reduce_scatter(algo, dtype, op, n))
        for algo in algos("allgather"):  # MPI_IN_PLACE / NCCL in-place: this rank's block of the output is the input
            yield Case(f"allgather-inplace/{algo}/{dtype}", _allgather_in_place(algo, dtype, 5))
        for algo in algos("reduce_scatter"):
            yield Case(f"reduce_scatter-inplace/{algo}/{dtype}", _reduce_scatter_in_place(algo, dtype, ReduceOp.SUM, 5))
    yield Case("torch/all_reduce master-worker", _master_worker())
    yield Case("send-recv ring", _ring_send_recv())


def overlap_cases(size: int, count: int = 3) -> Iterator[Case]:
    """Every offset at which ``out=`` can overlap the input (issue: ring reduce_scatter used OUT
    as scratch while later steps still read IN): either right, or rejected up front."""
    for algo in algos("reduce_scatter"):
        for offset in range(size * count - count + 1):
            yield Case(f"reduce_scatter-overlap/{algo}/off{offset}", _reduce_scatter_overlap(algo, offset, count))
    for algo in algos("allgather"):
        for offset in range(size * count - count + 1):
            yield Case(f"allgather-overlap/{algo}/off{offset}", _allgather_overlap(algo, offset, count))


def bitwise_cases(size: int) -> Iterator[Case]:
    """Allreduce of NaNs with distinct payloads, +0/-0 and +-inf: bit-identical on every rank."""
    for dtype in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), bfloat16):
        for op in ops_for(dtype):
            for algo in algos("allreduce"):
                for n in (1, 7, 4099):
                    yield Case(f"bitwise/{algo}/{dtype}/{op.name}/n{n}", _bitwise(algo, dtype, op, n))


LARGE_KINDS = ((np.dtype(np.float32), ReduceOp.SUM), (np.dtype(np.int64), ReduceOp.MAX))


def large_cases(size: int, count: int, kinds=LARGE_KINDS) -> Iterator[Case]:
    """One count above HCCL_BUFFSIZE (the test sets it to 1 MB): messages go in many slices."""
    for dtype, op in kinds:
        for algo in algos("allreduce"):
            yield Case(f"large/allreduce/{algo}/{dtype}", _allreduce(algo, dtype, op, count))
        for algo in algos("reduce_scatter"):
            yield Case(f"large/reduce_scatter/{algo}/{dtype}", _reduce_scatter(algo, dtype, op, count // size))
        for algo in algos("allgather"):
            yield Case(f"large/allgather/{algo}/{dtype}", _allgather(algo, dtype, count // size))
        for algo in algos("broadcast"):
            yield Case(f"large/bcast/{algo}/{dtype}", _bcast(algo, dtype, size - 1, count))
        for algo in algos("reduce"):
            yield Case(f"large/reduce/{algo}/{dtype}", _reduce(algo, dtype, op, size // 2, count))


# -- one case each ---------------------------------------------------------------------------------------
def _bcast(algo, dtype, root, n):
    def run(comm):
        x = value(root, n, dtype, salt=11) if comm.rank == root else garbage(comm.rank, n, dtype)
        assert comm.broadcast(x, root=root, algo=algo) is x
        expect(x, value(root, n, dtype, salt=11), f"bcast root={root} on rank {comm.rank}")
        return digest(x)

    return run


def _allgather(algo, dtype, n):
    def run(comm):
        x = value(comm.rank, n, dtype)
        kept = x.copy()
        out = comm.all_gather(x, algo=algo)
        expect(out, np.stack([value(r, n, dtype) for r in range(comm.size)]), f"allgather on rank {comm.rank}")
        expect(x, kept, f"allgather input on rank {comm.rank}")
        return digest(out)

    return run


def _allreduce(algo, dtype, op, n):
    def run(comm):
        x = value(comm.rank, n, dtype, op)
        assert comm.all_reduce(x, op=op, algo=algo) is x
        expect(x, reduced(comm.size, n, dtype, op), f"allreduce on rank {comm.rank}")
        return digest(x)

    return run


def _reduce(algo, dtype, op, root, n):
    def run(comm):
        x = value(comm.rank, n, dtype, op)
        mine = x.copy()
        comm.reduce(x, root=root, op=op, algo=algo)
        if comm.rank == root:
            expect(x, reduced(comm.size, n, dtype, op), f"reduce root={root} on root")
        else:
            expect(x, mine, f"reduce root={root}: rank {comm.rank}'s buffer must stay untouched")

    return run


def _reduce_scatter(algo, dtype, op, n):
    def run(comm):
        y = value(comm.rank, n * comm.size, dtype, op)
        kept = y.copy()
        part = comm.reduce_scatter(y, op=op, algo=algo)
        full = reduced(comm.size, n * comm.size, dtype, op)
        expect(part.reshape(-1), full[comm.rank * n : (comm.rank + 1) * n], f"reduce_scatter on rank {comm.rank}")
        expect(y, kept, f"reduce_scatter input on rank {comm.rank}")

    return run


def _allgather_in_place(algo, dtype, n):
    def run(comm):
        out = garbage(comm.rank, n * comm.size, dtype).reshape(comm.size, n)
        out[comm.rank] = value(comm.rank, n, dtype)
        got = comm.all_gather(out[comm.rank], out=out, algo=algo)
        expect(got, np.stack([value(r, n, dtype) for r in range(comm.size)]), f"in-place allgather on rank {comm.rank}")
        return digest(got)

    return run


def _reduce_scatter_in_place(algo, dtype, op, n):
    def run(comm):
        y = value(comm.rank, n * comm.size, dtype, op)
        mine = y[comm.rank * n : (comm.rank + 1) * n]
        comm.reduce_scatter(y, op=op, out=mine, algo=algo)
        full = reduced(comm.size, n * comm.size, dtype, op)
        expect(mine, full[comm.rank * n : (comm.rank + 1) * n], f"in-place reduce_scatter on rank {comm.rank}")

    return run


def _reduce_scatter_overlap(algo, offset, n):
    dtype = np.dtype(np.int32)

    def run(comm):
        y = value(comm.rank, n * comm.size, dtype)
        comm.reduce_scatter(y, out=y[offset : offset + n], algo=algo)
        full = reduced(comm.size, n * comm.size, dtype, ReduceOp.SUM)
        expect(
            y[offset : offset + n],
            full[comm.rank * n : (comm.rank + 1) * n],
            f"reduce_scatter out=y[{offset}:] on rank {comm.rank}",
        )

    return run


def _allgather_overlap(algo, offset, n):
    dtype = np.dtype(np.int32)

    def run(comm):
        out = garbage(comm.rank, n * comm.size, dtype)
        out[offset : offset + n] = value(comm.rank, n, dtype)
        got = comm.all_gather(out[offset : offset + n], out=out, algo=algo)
        expect(
            got.reshape(-1),
            np.concatenate([value(r, n, dtype) for r in range(comm.size)]),
            f"allgather x=out[{offset}:] on rank {comm.rank}",
        )
        return digest(got)

    return run


def _special(rank: int, n: int, dtype: np.dtype) -> np.ndarray:
    """NaNs with rank-specific payloads, +0, -0, +inf, -inf and ordinary numbers, mixed."""
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
    exponent = {
        np.dtype(np.float16): 0x7C00,
        bfloat16: 0x7F80,
        np.dtype(np.float32): 0x7F800000,
        np.dtype(np.float64): 0x7FF0000000000000,
    }[dtype]
    quiet = {
        np.dtype(np.float16): 0x0200,
        bfloat16: 0x0040,
        np.dtype(np.float32): 0x00400000,
        np.dtype(np.float64): 0x0008000000000000,
    }[dtype]
    i = np.arange(n)
    nan = (np.full(n, exponent | quiet, bits) | ((i * 31 + rank * 7 + 1) % (quiet - 1)).astype(bits)).view(dtype)
    kinds = (i + rank) % 6
    normal = ((i % 5) - 2 + 0.5 * rank).astype(dtype)
    out = np.where(kinds == 0, nan, normal)
    out = np.where(kinds == 1, np.array(0.0, dtype), out)
    out = np.where(kinds == 2, np.array(-0.0, dtype), out)
    out = np.where(kinds == 3, np.array(np.inf if rank % 2 else -np.inf, dtype), out)
    return out.astype(dtype)


def _bitwise(algo, dtype, op, n):
    def run(comm):
        x = _special(comm.rank, n, dtype)
        with np.errstate(all="ignore"):
            comm.all_reduce(x, op=op, algo=algo)
        return digest(x)

    return run


def _master_worker():
    """torch's ``_test_all_reduce_helper``: master value 2 on rank 0, worker value 10 elsewhere."""

    def run(comm):
        x = np.full(4, 2.0 if comm.rank == 0 else 10.0, np.float32)
        comm.all_reduce(x)
        expect(x, np.full(4, 2.0 + 10.0 * (comm.size - 1), np.float32), f"master-worker sum on rank {comm.rank}")
        x = np.full(4, 2.0 if comm.rank == 0 else 10.0, np.float32)
        comm.all_reduce(x, op="max")
        expect(x, np.full(4, 10.0 if comm.size > 1 else 2.0, np.float32), f"master-worker max on rank {comm.rank}")
        return digest(x)

    return run


def _ring_send_recv():
    def run(comm):
        if comm.size == 1:
            return None
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        got = np.empty(6, np.int64)
        if comm.rank % 2 == 0:
            comm.send(np.full(6, comm.rank, np.int64), dst=right)
            comm.recv(got, src=left)
        else:
            comm.recv(got, src=left)
            comm.send(np.full(6, comm.rank, np.int64), dst=right)
        expect(got, np.full(6, left, np.int64), f"recv from {left} on rank {comm.rank}")

    return run


# -- HCCL's other operators and the out= forms ---------------------------------------------------------
def operator_cases(size: int, dtypes=DTYPES) -> Iterator[Case]:
    """AlltoAll, AlltoAllV, AlltoAllVC, Scatter, Gather (mpi4py's testAlltoall, testScatter,
    testGather, their v-variants; torch's test_all_to_all*, test_scatter, test_gather), every
    algorithm, every root, and the out= forms of the in-place collectives."""
    for dtype in dtypes:
        for algo in algos("alltoall"):
            for n in counts(size)[:4]:
                yield Case(f"alltoall/{algo}/{dtype}/n{n}", _alltoall(algo, dtype, n))
        for algo in algos("alltoallv"):
            yield Case(f"alltoallv/{algo}/{dtype}", _alltoallv(algo, dtype, gaps=False))
            yield Case(f"alltoallv-gaps/{algo}/{dtype}", _alltoallv(algo, dtype, gaps=True))
            yield Case(f"alltoallvc/{algo}/{dtype}", _alltoallvc(algo, dtype))
        for algo in algos("scatter"):
            for root in range(size):
                yield Case(f"scatter/{algo}/{dtype}/root{root}", _scatter(algo, dtype, root, 3 + root % 2))
        for algo in algos("gather"):
            for root in range(size):
                yield Case(f"gather/{algo}/{dtype}/root{root}", _gather(algo, dtype, root, 2 + root % 3))
        for root in range(size):
            yield Case(f"allreduce-out/{dtype}", _allreduce_out(dtype, ReduceOp.MAX))
            yield Case(f"bcast-out/{dtype}/root{root}", _bcast_out(dtype, root))
            yield Case(f"reduce-out/{dtype}/root{root}", _reduce_out(dtype, ReduceOp.SUM, root))


def out_overlap_cases(size: int, count: int = 4) -> Iterator[Case]:
    """``out=`` overlapping the input at every offset, for the collectives new to ``out=``."""
    for offset in range(-count + 1, count):
        yield Case(f"allreduce-out-overlap/off{offset}", _allreduce_out_overlap(offset, count))
    for algo in algos("alltoall"):
        yield Case(f"alltoall-in-place/{algo}", _alltoall_in_place(algo))
    # Overlap at every offset, for every algorithm, of the rooted and block collectives too (their
    # input and out= share one buffer; the root in the middle so either side can be hit).
    for offset in range(-count + 1, count):
        for algo in algos("broadcast"):
            yield Case(f"broadcast-out-overlap/{algo}/off{offset}", _broadcast_out_overlap(algo, offset, count))
        for algo in algos("reduce"):
            yield Case(f"reduce-out-overlap/{algo}/off{offset}", _reduce_out_overlap(algo, offset, count))
    for offset in range(size * count - count + 1):
        for algo in algos("scatter"):
            yield Case(f"scatter-out-overlap/{algo}/off{offset}", _scatter_out_overlap(algo, offset, count))
        for algo in algos("gather"):
            yield Case(f"gather-out-overlap/{algo}/off{offset}", _gather_out_overlap(algo, offset, count))
    for offset in (-count, -1, 1, count):
        for algo in algos("alltoall"):
            yield Case(f"alltoall-out-overlap/{algo}/off{offset}", _alltoall_out_overlap(algo, offset, count))
        for algo in algos("alltoallv"):
            yield Case(f"alltoallv-send-recv-overlap/{algo}/off{offset}", _alltoallv_overlap(algo, offset))


def _matrix(size: int, salt: int) -> list[list[int]]:
    """Counts from rank i to rank j: small, some zero, from the ranks and the size."""
    return [[(i * 3 + j * 5 + salt) % 4 for j in range(size)] for i in range(size)]


def _alltoall(algo, dtype, n):
    def run(comm):
        size, r = comm.size, comm.rank
        x = (
            np.concatenate([value(r * size + j, n, dtype, salt=7) for j in range(size)]).reshape(size, n)
            if n
            else np.empty((size, 0), dtype)
        )
        got = comm.all_to_all(x, algo=algo)
        want = (
            np.stack([value(i * size + r, n, dtype, salt=7) for i in range(size)]) if n else np.empty((size, 0), dtype)
        )
        expect(got, want, f"alltoall on rank {r}")

    return run


def _alltoallv(algo, dtype, gaps: bool):
    def run(comm):
        size, r = comm.size, comm.rank
        m = _matrix(size, 1)
        sends, recvs = m[r], [m[i][r] for i in range(size)]
        pad = 2 if gaps else 0
        # reversed block order with gaps: displacements need not follow rank order
        sdispl, offset = [0] * size, 0
        for j in reversed(range(size)):
            sdispl[j], offset = offset, offset + sends[j] + pad
        send = garbage(r, offset, dtype)
        for j in range(size):
            send[sdispl[j] : sdispl[j] + sends[j]] = value(r * size + j, sends[j], dtype, salt=3)
        rdispl, offset = [0] * size, pad
        for i in range(size):
            rdispl[i], offset = offset, offset + recvs[i] + pad
        recv = garbage(r + 50, offset, dtype)
        before = recv.copy()
        assert comm.all_to_all_v(send, sends, sdispl, recv, recvs, rdispl, algo=algo) is recv
        for i in range(size):
            expect(
                recv[rdispl[i] : rdispl[i] + recvs[i]],
                value(i * size + r, recvs[i], dtype, salt=3),
                f"alltoallv block {i} on rank {r}",
            )
        gap = np.ones(recv.size, bool)
        for i in range(size):
            gap[rdispl[i] : rdispl[i] + recvs[i]] = False
        expect(recv[gap], before[gap], f"alltoallv left the gaps alone on rank {r}")

    return run


def _alltoallvc(algo, dtype):
    def run(comm):
        size, r = comm.size, comm.rank
        m = _matrix(size, 2)
        send = np.concatenate([value(r * size + j, m[r][j], dtype, salt=4) for j in range(size)])
        recv = garbage(r, sum(m[i][r] for i in range(size)), dtype)
        comm.all_to_all_vc(send, m, recv, algo=algo)
        want = np.concatenate([value(i * size + r, m[i][r], dtype, salt=4) for i in range(size)])
        expect(recv, want, f"alltoallvc on rank {r}")

    return run


def _scatter(algo, dtype, root, n):
    def run(comm):
        size, r = comm.size, comm.rank
        table = np.concatenate([value(j, n, dtype, salt=root) for j in range(size)]).reshape(size, n)
        if r == root:
            got = comm.scatter(table, root=root, algo=algo)
        else:
            got = comm.scatter(None, root=root, out=garbage(r, n, dtype), algo=algo)
        expect(got.reshape(-1), value(r, n, dtype, salt=root), f"scatter root={root} on rank {r}")

    return run


def _gather(algo, dtype, root, n):
    def run(comm):
        size, r = comm.size, comm.rank
        got = comm.gather(value(r, n, dtype, salt=9), root=root, algo=algo)
        if r == root:
            expect(got, np.stack([value(i, n, dtype, salt=9) for i in range(size)]), f"gather root={root}")
            return None
        assert got is None, f"gather returned {got!r} on non-root rank {r}"

    return run


def _allreduce_out(dtype, op):
    def run(comm):
        x = value(comm.rank, 6, dtype, op)
        kept = x.copy()
        out = garbage(comm.rank, 6, dtype)
        assert comm.all_reduce(x, op=op, out=out) is out
        expect(out, reduced(comm.size, 6, dtype, op), f"allreduce out= on rank {comm.rank}")
        expect(x, kept, f"allreduce out= left x alone on rank {comm.rank}")
        return digest(out)

    return run


def _bcast_out(dtype, root):
    def run(comm):
        x = value(root, 5, dtype, salt=2) if comm.rank == root else garbage(comm.rank, 5, dtype)
        kept = x.copy()
        out = garbage(comm.rank + 1, 5, dtype)
        assert comm.broadcast(x, root=root, out=out) is out
        expect(out, value(root, 5, dtype, salt=2), f"bcast out= root={root} on rank {comm.rank}")
        expect(x, kept, f"bcast out= left x alone on rank {comm.rank}")

    return run


def _reduce_out(dtype, op, root):
    def run(comm):
        x = value(comm.rank, 5, dtype, op)
        kept = x.copy()
        out = garbage(comm.rank, 5, dtype)
        untouched = out.copy()
        comm.reduce(x, root=root, op=op, out=out)
        expect(x, kept, f"reduce out= left x alone on rank {comm.rank}")
        if comm.rank == root:
            expect(out, reduced(comm.size, 5, dtype, op), f"reduce out= root={root}")
        else:
            expect(out, untouched, f"reduce out= root={root}: rank {comm.rank}'s out must stay untouched")

    return run


def _allreduce_out_overlap(offset, n):
    dtype = np.dtype(np.int32)

    def run(comm):
        buf = garbage(comm.rank, 3 * n, dtype)
        x = buf[n : 2 * n]
        x[:] = value(comm.rank, n, dtype)
        out = buf[n + offset : 2 * n + offset]
        comm.all_reduce(x, out=out)
        expect(
            out,
            reduced(comm.size, n, dtype, ReduceOp.SUM),
            f"allreduce out overlapping x by {offset} on rank {comm.rank}",
        )

    return run


def _alltoall_in_place(algo):
    dtype = np.dtype(np.int64)

    def run(comm):
        size, r = comm.size, comm.rank
        x = np.concatenate([value(r * size + j, 3, dtype, salt=5) for j in range(size)]).reshape(size, 3)
        assert comm.all_to_all(x, out=x, algo=algo) is x
        expect(
            x, np.stack([value(i * size + r, 3, dtype, salt=5) for i in range(size)]), f"in-place alltoall on rank {r}"
        )

    return run


def _broadcast_out_overlap(algo, offset, n):
    dtype = np.dtype(np.int32)

    def run(comm):
        root = comm.size // 2
        buf = garbage(comm.rank, 3 * n, dtype)
        x, out = buf[n : 2 * n], buf[n + offset : 2 * n + offset]
        if comm.rank == root:
            x[:] = value(root, n, dtype, salt=2)
        comm.broadcast(x, root=root, out=out, algo=algo)
        expect(out, value(root, n, dtype, salt=2), f"broadcast out overlapping x by {offset} on rank {comm.rank}")

    return run


def _reduce_out_overlap(algo, offset, n):
    dtype = np.dtype(np.int32)

    def run(comm):
        root = comm.size // 2
        buf = garbage(comm.rank, 3 * n, dtype)
        x, out = buf[n : 2 * n], buf[n + offset : 2 * n + offset]
        x[:] = value(comm.rank, n, dtype)
        comm.reduce(x, root=root, out=out, algo=algo)
        if comm.rank == root:
            expect(out, reduced(comm.size, n, dtype, ReduceOp.SUM), f"reduce out overlapping x by {offset} on the root")

    return run


def _scatter_out_overlap(algo, offset, n):
    dtype = np.dtype(np.int64)

    def run(comm):
        size, r = comm.size, comm.rank
        buf = garbage(r, size * n, dtype)
        root = size // 2
        if r == root:
            buf[:] = np.concatenate([value(j, n, dtype, salt=4) for j in range(size)])
        out = buf[offset : offset + n]  # on the root inside the input it scatters
        comm.scatter(buf.reshape(size, n) if r == root else None, root=root, out=out, algo=algo)
        expect(out, value(r, n, dtype, salt=4), f"scatter out at element {offset} of the root's input, rank {r}")

    return run


def _gather_out_overlap(algo, offset, n):
    dtype = np.dtype(np.int64)

    def run(comm):
        size, r = comm.size, comm.rank
        root = size // 2
        buf = garbage(r, size * n, dtype)
        x = buf[offset : offset + n]  # on the root inside the output it gathers into
        x[:] = value(r, n, dtype, salt=6)
        out = buf.reshape(size, n) if r == root else None
        comm.gather(x, root=root, out=out, algo=algo)
        if r == root:
            expect(
                out,
                np.stack([value(i, n, dtype, salt=6) for i in range(size)]),
                f"gather into out holding x at {offset}",
            )

    return run


def _alltoall_out_overlap(algo, offset, n):
    dtype = np.dtype(np.int32)

    def run(comm):
        size, r = comm.size, comm.rank
        buf = garbage(r, size * n + 2 * n, dtype)
        x = buf[n : n + size * n]
        x[:] = np.concatenate([value(r * size + j, n, dtype, salt=8) for j in range(size)])
        out = buf[n + offset : n + offset + size * n]
        comm.all_to_all(x.reshape(size, n), out=out.reshape(size, n), algo=algo)
        expect(
            out.reshape(size, n),
            np.stack([value(i * size + r, n, dtype, salt=8) for i in range(size)]),
            f"alltoall out overlapping x by {offset} on rank {r}",
        )

    return run


def _alltoallv_overlap(algo, offset):
    dtype = np.dtype(np.int32)

    def run(comm):
        size, r = comm.size, comm.rank
        m = _matrix(size, 2)
        sends, recvs = m[r], [m[i][r] for i in range(size)]
        total_send, total_recv = sum(sends), sum(recvs)
        pad = abs(offset)
        buf = garbage(r, pad + max(total_send, total_recv) + pad, dtype)
        send = buf[pad : pad + total_send]
        send[:] = (
            np.concatenate([value(r * size + j, sends[j], dtype, salt=9) for j in range(size)]) if total_send else send
        )
        recv = buf[pad + offset : pad + offset + total_recv]
        comm.all_to_all_v(send, sends, None, recv, recvs, None, algo=algo)
        want = (
            np.concatenate([value(i * size + r, recvs[i], dtype, salt=9) for i in range(size)]) if total_recv else recv
        )
        expect(recv, want, f"alltoallv recv overlapping send by {offset} on rank {r}")

    return run
