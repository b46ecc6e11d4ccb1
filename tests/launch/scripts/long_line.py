"""A rank that writes one long line without a newline, for the relay tests.

    long_line.py BYTES DIR

Each rank writes ``DIR/ready_<rank>``, waits for ``DIR/go``, writes BYTES bytes in one write
(rank 0: ``a``s; rank 1: one ``x`` then two-byte ``é``s, so the relay's cuts fall inside
characters; others: their rank's letter), then ``\\nend\\n``, and waits for ``DIR/done``.
"""

import os
import sys
import time


def wait_for(folder: str, name: str) -> None:
    while not os.path.exists(os.path.join(folder, name)):
        time.sleep(0.02)


def line(rank: int, size: int) -> bytes:
    if rank == 1:
        return b"x" + "é".encode() * ((size - 1) // 2)
    return bytes([ord("a") + rank]) * size


if __name__ == "__main__":
    size, folder = int(sys.argv[1]), sys.argv[2]
    rank = int(os.environ["RANK_ID"])
    with open(os.path.join(folder, f"ready_{rank}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(folder, f"ready_{rank}.tmp"), os.path.join(folder, f"ready_{rank}"))
    wait_for(folder, "go")
    out = sys.stdout.buffer
    out.write(line(rank, size))
    out.flush()
    out.write(b"\nend\n")
    out.flush()
    wait_for(folder, "done")
