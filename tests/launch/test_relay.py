"""hccl-launch relays rank output in large reads, whole lines with a ``[rank] `` prefix, and with
bounded memory however long a line is (launch/relay.py)."""

from __future__ import annotations

import collections
import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from launch.relay import LINE_CAP, READ_BYTES, TAIL_LINE_BYTES, Sink, relay
from tests.launch.scripts.long_line import line as long_line
from tests.mp import wait_for_files, wait_until

ROOT = Path(__file__).resolve().parents[2]
LONG_LINE = Path(__file__).resolve().parent / "scripts" / "long_line.py"


class _Recorder(io.RawIOBase):
    """A sink stream that keeps every write (to check how large each one was)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        self.writes.append(bytes(data))
        return len(data)

    def value(self) -> bytes:
        return b"".join(self.writes)


def _relay_bytes(*pieces: bytes, tail: collections.deque | None = None) -> _Recorder:
    """Relay what a writer thread writes to a pipe, piece by piece, to a recorder with prefix [0]."""
    r, w = os.pipe()

    def write() -> None:
        with open(w, "wb", buffering=0) as pipe:
            for piece in pieces:
                pipe.write(piece)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    out = _Recorder()
    try:
        relay(r, [(Sink(out), b"[0] ")], tail)
    finally:
        os.close(r)
    writer.join(10)
    return out


@pytest.mark.timeout(30)
def test_lines_are_prefixed_and_written_whole_in_large_writes() -> None:
    lines = [f"line {i}\n".encode() for i in range(20_000)]
    # one write of them all (a rank's buffered stdout): the relay's reads then take what the pipe
    # holds, pages at least, whatever the machine's speed; written line by line, a reader as fast
    # as the writer would see one line per read, and the count below would measure the machine
    out = _relay_bytes(b"".join(lines) + b"last without newline")
    assert out.value() == b"".join(b"[0] " + line for line in lines) + b"[0] last without newline\n"
    assert len(out.writes) < len(lines) / 10  # many lines per write, not one read per byte or line
    assert all(w.endswith(b"\n") for w in out.writes)  # short lines never leave a line open


@pytest.mark.timeout(30)
def test_a_line_without_newline_is_relayed_in_bounded_pieces() -> None:
    size = 8 * 1024 * 1024 + 5
    tail: collections.deque[str] = collections.deque(maxlen=3)
    out = _relay_bytes(b"first\n", b"z" * size, b"\nafter\n", tail=tail)
    assert out.value() == b"[0] first\n[0] " + b"z" * size + b"\n[0] after\n"  # alone on the sink: exactly the line
    assert max(len(w) for w in out.writes) <= LINE_CAP + READ_BYTES + len(b"[0] first\n")
    assert list(tail) == ["first", "z" * TAIL_LINE_BYTES + " [...]", "after"]


@pytest.mark.timeout(30)
def test_a_long_line_written_byte_by_byte_and_the_tail_of_many_lines() -> None:
    text = bytes(range(97, 123)) * 4000  # 104,000 bytes, no newline, one write per byte
    tail: collections.deque[str] = collections.deque(maxlen=5)
    numbers = [f"{i}\n".encode() for i in range(100)]
    out = _relay_bytes(*(text[i : i + 1] for i in range(len(text))), b"\n", *numbers, tail=tail)
    assert out.value() == b"[0] " + text + b"\n" + b"".join(f"[0] {i}\n".encode() for i in range(100))
    assert list(tail) == ["95", "96", "97", "98", "99"]


def test_another_writer_ends_an_open_line_and_the_rest_follows_prefixed() -> None:
    stream = _Recorder()
    sink = Sink(stream)
    a, b = object(), object()
    sink.write(a, b"[0] ", b"aaa", open_end=True)
    sink.write(a, b"[0] ", b"aa", open_end=True)
    sink.write(b, b"[1] ", b"one\ntwo\n")
    sink.write(a, b"[0] ", b"a\nnext\n")
    sink.write(b, b"[1] ", b"bb", open_end=True)
    sink.end_line(a)  # not a's line: nothing
    sink.end_line(b)
    assert stream.value() == b"[0] aaaaa\n[1] one\n[1] two\n[0] a\n[0] next\n[1] bb\n"


def test_pieces_are_cut_between_utf8_characters() -> None:
    text = b"x" + "é".encode() * LINE_CAP  # an odd start: a cut at an even count splits a character
    out = _relay_bytes(text, b"\n")
    assert out.value() == b"[0] " + text + b"\n"
    for piece in out.writes:
        piece.decode("utf-8")  # each write is whole characters


def _hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for entry in f:
            if entry.startswith("VmHWM:"):
                return int(entry.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("start", ["fork", "exec"])
def test_launcher_memory_stays_bounded_for_a_long_line_and_relays_it_completely(tmp_path: Path, start: str) -> None:
    """Two ranks each write a 16 MiB line without a newline at once: the launcher's peak memory
    grows by far less than one line, stdout has every byte of each (where the other rank's output
    cuts a line, the rest follows on a new prefixed line; whole characters each), and the log has
    each rank's output exactly."""
    size, ranks = 16 * 1024 * 1024, 2
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    logs = tmp_path / "logs"
    command = [
        sys.executable,
        "-m",
        "launch.cli",
        "-n",
        str(ranks),
        "--start",
        start,
        "--log-dir",
        str(logs),
        str(LONG_LINE),
        str(size),
        str(tmp_path),
    ]
    launcher = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got: dict[int, list[bytes]] = {r: [] for r in range(ranks)}
    ended: set[int] = set()

    def read() -> None:
        assert launcher.stdout is not None
        for raw in launcher.stdout:
            head, _, payload = raw.partition(b"] ")
            r = int(head[1:])
            got[r].append(payload)
            if payload == b"end\n":
                ended.add(r)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for_files(tmp_path, "ready_*", ranks, within=60)
        before = _hwm_kib(launcher.pid)
        (tmp_path / "go").touch()
        wait_until(lambda: len(ended) == ranks, "both ranks' end lines relayed", within=60)
        growth_kib = _hwm_kib(launcher.pid) - before
        (tmp_path / "done").touch()
        _, err = launcher.communicate(timeout=60)
    finally:
        (tmp_path / "done").touch()
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()
    reader.join(10)
    assert launcher.returncode == 0, err.decode(errors="replace")
    assert growth_kib < 8 * 1024, f"the launcher grew by {growth_kib} KiB relaying two {size >> 20} MiB lines"
    for r in range(ranks):
        expected = long_line(r, size)
        assert b"".join(p.rstrip(b"\n") for p in got[r]) == expected + b"end"
        for p in got[r]:
            p.decode("utf-8")
        assert (logs / f"rank_{r}.log").read_bytes() == expected + b"\nend\n"
