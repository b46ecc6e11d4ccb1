"""How hccl-launch relays each rank's output: large reads, whole lines, a ``[rank] `` prefix, and
bounded memory whatever the rank writes.

One thread per rank and stream (:func:`relay`) reads the rank's pipe in chunks of up to
:data:`READ_BYTES` and writes every complete line of a chunk at once, each line prefixed, to a
:class:`Sink` (the launcher's stdout or stderr; the rank's ``--log-dir`` file, unprefixed). A line
is never split between ranks: lines of different ranks reach a sink whole, in the order their
chunks arrived. Only a line longer than :data:`LINE_CAP` is written before its newline comes: the
piece held so far goes out and the line stays open on that sink, so the next piece of the same rank
continues it exactly; if another rank (or the launcher's report) writes first, the sink ends the
open line with a newline and the rest of the long line follows on a fresh ``[rank] `` line. So the
launcher holds at most ``LINE_CAP + READ_BYTES`` bytes per stream, a partial line shorter than the
cap waits for its newline (as before: a line is shown once it is complete), and the last line of a
stream without a newline is shown with one added.

Example::

    out = Sink(sys.stdout.buffer)
    relay(proc.stdout.fileno(), [(out, b"[0] ")], tail=None)   # until EOF
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Sequence
from typing import BinaryIO

__all__ = ["READ_BYTES", "LINE_CAP", "TAIL_LINE_BYTES", "Sink", "relay"]

READ_BYTES = 64 * 1024  # one read from a rank's pipe (a Linux pipe holds 64 KiB by default)
LINE_CAP = 64 * 1024  # a partial line this long is written before its newline (bounds memory)
TAIL_LINE_BYTES = 1000  # a stderr line kept for the failure report is cut to this many bytes


class Sink:
    """One stream the relays write to; its lock keeps lines whole, and it remembers which relay
    left a long line open on it (see the module doc)."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.lock = threading.Lock()
        self._open: object | None = None  # the writer whose line is unfinished on the stream

    def write(self, writer: object, prefix: bytes, data: bytes, *, open_end: bool = False) -> None:
        """Write ``data`` (whole lines, the last one unfinished if ``open_end``) for ``writer``,
        ``prefix`` before every line it starts."""
        if not data:
            return
        body = data[:-1].replace(b"\n", b"\n" + prefix) + data[-1:] if prefix else data
        with self.lock:
            if self._open is writer:
                head = b""  # the same line goes on
            elif self._open is not None:
                head = b"\n" + prefix  # end another writer's unfinished line first
            else:
                head = prefix
            self._open = writer if open_end else None
            self._put(head + body)

    def end_line(self, writer: object) -> None:
        """``writer`` is done: end its unfinished line, if it left one."""
        with self.lock:
            if self._open is writer:
                self._open = None
                self._put(b"\n")

    def close(self) -> None:
        """Close the stream (a rank's log, once its relays have ended)."""
        with self.lock:
            self.stream.close()

    def _put(self, data: bytes) -> None:
        try:
            self.stream.write(data)
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass  # our reader went away (e.g. `| head`), or a closed log; keep draining so ranks never block


def relay(fd: int, sinks: Sequence[tuple[Sink, bytes]], tail: collections.deque[str] | None = None) -> None:
    """Copy the pipe ``fd`` to every ``(sink, prefix)`` line by line until EOF, in large reads;
    the last lines, decoded and cut to TAIL_LINE_BYTES, go to ``tail`` (if given)."""
    writer = object()  # this relay's identity on the sinks
    pending = bytearray()  # the start of a line whose newline has not come yet (< LINE_CAP)
    cut = False  # the line in ``pending`` was already written in part (its tail entry is cut)
    while True:
        try:
            chunk = os.read(fd, READ_BYTES)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        end = chunk.rfind(b"\n") + 1
        if end:
            whole = bytes(pending) + chunk[:end] if pending else chunk[:end]
            pending = bytearray(chunk[end:])
            for sink, prefix in sinks:
                sink.write(writer, prefix, whole)
            if tail is not None:
                _keep_tail(tail, whole, cut)
            cut = False
        else:
            pending += chunk  # no copy of what is pending: a rank may write a long line byte by byte
        if len(pending) >= LINE_CAP:
            split = _utf8_boundary(pending)
            piece = bytes(pending[:split])
            del pending[:split]
            for sink, prefix in sinks:
                sink.write(writer, prefix, piece, open_end=True)
            if tail is not None and not cut:
                _keep_tail(tail, piece + b"\n", False)
                cut = True
    if pending:
        for sink, prefix in sinks:
            sink.write(writer, prefix, bytes(pending) + b"\n")
        if tail is not None and not cut:
            _keep_tail(tail, bytes(pending) + b"\n", False)
    for sink, _ in sinks:
        sink.end_line(writer)


def _keep_tail(tail: collections.deque[str], whole: bytes, first_cut: bool) -> None:
    """The last ``tail.maxlen`` lines of ``whole`` (complete lines) into ``tail``; with
    ``first_cut`` the first of them ends a line whose start is in the tail already."""
    keep = tail.maxlen
    if keep is None:
        lines = whole[:-1].split(b"\n")[1 if first_cut else 0 :]
    else:
        lines = whole[:-1].rsplit(b"\n", keep)  # split no further than needed: at most keep + 1 parts
        if len(lines) > keep or first_cut:
            lines = lines[1:]
    for line in lines:
        text = line[:TAIL_LINE_BYTES].decode(errors="replace")
        tail.append(text + (" [...]" if len(line) > TAIL_LINE_BYTES else ""))


def _utf8_boundary(data: bytes | bytearray) -> int:
    """Where to cut ``data`` so that no UTF-8 character is split: before a trailing incomplete
    sequence, else at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for the lead
            continue
        if byte < 0xC0:  # ASCII: complete
            return len(data)
        need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
        return len(data) if back >= need else len(data) - back
    return len(data)
