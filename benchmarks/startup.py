"""What starting a job costs: importing hccl_py, and a whole ``hccl-launch -n N`` job next to
``mpiexec -n N`` of the same work on mpi4py.

The job is the smallest real one: every rank initializes and runs one barrier. Its wall time
(process start to the launcher's exit) is measured for hccl-py under ``hccl-launch`` and for
MPICH (the ``mpich`` wheel's mpiexec, mpi4py), alternating, median of ``--repeats``::

    python -m benchmarks.startup                 # import time, and jobs of 16 ranks
    python -m benchmarks.startup -n 8 -n 16 --repeats 5

Import time is ``python -c "import hccl_py"`` minus ``python -c pass`` (medians), what every
rank pays before it runs a line of the program.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.peers.mpi import find_mpiexec

HCCL_SCRIPT = "import hccl_py\ncomm = hccl_py.init()\ncomm.barrier()\n"
MPI_SCRIPT = "from mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\n"


def _wall_s(cmd: list[str], timeout: float = 300.0) -> float:
    """Seconds from start to exit of ``cmd`` (its output discarded; a failure raises)."""
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
    return time.perf_counter() - start


def import_time_s(repeats: int) -> tuple[float, float]:
    """(median seconds of ``python -c "import hccl_py"``, of ``python -c pass``)."""
    with_import, bare = [], []
    for _ in range(repeats):
        with_import.append(_wall_s([sys.executable, "-c", "import hccl_py"]))
        bare.append(_wall_s([sys.executable, "-c", "pass"]))
    return statistics.median(with_import), statistics.median(bare)


def job_times_s(nranks: int, repeats: int, folder: Path) -> tuple[float, float, float | None]:
    """Median seconds of the hccl-launch job (ranks forked, the default), of the same with
    ``--start exec`` (fresh interpreters), and of the mpiexec job (None without mpiexec)."""
    hccl_script, mpi_script = folder / "hccl_job.py", folder / "mpi_job.py"
    hccl_script.write_text(HCCL_SCRIPT)
    mpi_script.write_text(MPI_SCRIPT)
    launcher = [sys.executable, "-m", "launch.cli", "-n", str(nranks)]
    mpiexec = find_mpiexec()
    forked, execd, mpi = [], [], []
    for _ in range(repeats):
        forked.append(_wall_s([*launcher, str(hccl_script)]))
        execd.append(_wall_s([*launcher, "--start", "exec", str(hccl_script)]))
        if mpiexec is not None:
            mpi.append(_wall_s([mpiexec, "-n", str(nranks), sys.executable, str(mpi_script)]))
    return statistics.median(forked), statistics.median(execd), (statistics.median(mpi) if mpi else None)


def main(argv: list[str] | None = None) -> int:
    """Print import time and job start-up times (see the module doc)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--nranks", type=int, action="append", help="ranks per job (repeatable); default 16")
    parser.add_argument("--repeats", type=int, default=5, help="runs per measurement; the median is shown (default 5)")
    args = parser.parse_args(argv)
    with_import, bare = import_time_s(args.repeats)
    print(
        f"# import hccl_py: {with_import - bare:.3f} s (python -c 'import hccl_py' {with_import:.3f} s, "
        f"python -c pass {bare:.3f} s; median of {args.repeats})"
    )
    print("# job: every rank inits and runs one barrier; wall time of the whole job, median of", args.repeats)
    print(
        "# hccl-launch forks ranks from itself (default); --start exec starts a fresh interpreter per rank;"
        " ratio = hccl-launch / mpiexec"
    )
    print(f"# {'ranks':>5}  {'hccl-launch s':>13}  {'mpiexec s':>9}  {'ratio':>5}  {'--start exec s':>14}")
    with tempfile.TemporaryDirectory(prefix="hccl-startup-") as tmp:
        for n in args.nranks or [16]:
            forked, execd, mpi = job_times_s(n, args.repeats, Path(tmp))
            ratio = f"{forked / mpi:5.2f}" if mpi else "    -"
            print(f"  {n:>5}  {forked:13.2f}  {mpi if mpi is not None else float('nan'):9.2f}  {ratio}  {execd:14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
