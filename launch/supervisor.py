"""Start, watch and stop the ranks of one hccl-launch job: all of them or none.

The supervisor hosts the rendezvous store (HCCL_PY_STORE_ADDR/PORT; MASTER_ADDR/MASTER_PORT name a
free port left to torch's ``env://`` rendezvous, so torch scripts run too), starts each rank (forked from
this warm launcher, ``launch/fork.py``, or exec'd with ``--start exec``) in its own session (so a terminal's
Ctrl-C reaches only the launcher, which decides what the ranks get), relays every rank's output
line by line with a ``[rank] `` prefix (launch/relay.py), and polls for exits. The first rank to
fail is the root cause: the others get SIGTERM, then SIGKILL after the grace, and the launcher
exits with the failing rank's status. Ranks carry PR_SET_PDEATHSIG=SIGKILL, so they die even if the launcher is
SIGKILLed, and whatever a rank started (children, grandchildren, other process groups) stays in the
rank's session: the launcher kills that session when the rank exits, and a watchdog process
(launch/_watchdog.py) kills it when the launcher dies, however it dies. Nothing a job started
outlives it (short of a descendant calling setsid() itself).

Example::

    code = Supervisor(LaunchConfig(nproc=2, target="infer.py")).run()
"""

from __future__ import annotations

import collections
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from hccl_py import env, rundir, tracefile
from hccl_py.errors import HcclError, HcclSyscallError, HcclTimeoutError
from hccl_py.rendezvous.secret import user_secret
from hccl_py.rendezvous.store import StoreClient, StoreServer, store_address

from . import fork
from ._watchdog import Watchdog, start_time, supported
from .config import LaunchConfig
from .diagnosis import diagnose, failure_order, format_diagnosis, load_dumps
from .proc import (
    free_port,
    new_job_id,
    new_job_secret,
    pdeathsig_preexec,
    rank_env,
    shell_exit_code,
    signal_group,
    signal_name,
    stop_all,
)
from .relay import Sink, relay
from .report import RankOutcome, format_failure, format_stopped

POLL_INTERVAL_S = 0.05  # how often exits are checked: a crash is noticed within ~50 ms
STDERR_TAIL_LINES = 20
EXIT_TIMEOUT = 124  # as coreutils timeout(1)
JOB_ID_KEY = "hccl-launch/job_id"  # across nodes: node 0's launcher publishes the job id here
TORCH_PORT_KEY = "hccl-launch/torch_port"  # and the port it left free for torch's env:// rendezvous
NODE_KEY = "hccl-launch/node"  # and every other node's launcher checks in under NODE_KEY/<node rank>


@dataclass(eq=False)
class _Rank:
    rank: int
    popen: subprocess.Popen[bytes] | fork.ForkedProcess
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=STDERR_TAIL_LINES))
    readers: list[threading.Thread] = field(default_factory=list)
    log: Sink | None = None
    log_path: Path | None = None
    returncode: int | None = None
    exit_time: float | None = None
    stopped_by: int | None = None
    start_time: int | None = None  # /proc start time: with the pid, names the session leader for good

    def outcome(self) -> RankOutcome:
        return RankOutcome(
            self.rank, self.popen.pid, self.returncode, self.exit_time, self.stopped_by, tuple(self.tail), self.log_path
        )


class Supervisor:
    """Runs one job described by a :class:`LaunchConfig`; :meth:`run` returns the exit status.

    ``stdout``/``stderr`` are binary streams for the prefixed rank output and the report
    (default: the launcher's own).
    """

    def __init__(self, config: LaunchConfig, stdout: BinaryIO | None = None, stderr: BinaryIO | None = None):
        self.config = config
        self.job_id = new_job_id()
        self.job_secret = self._secret()
        self._out = Sink(stdout if stdout is not None else sys.stdout.buffer)
        self._err = Sink(stderr if stderr is not None else sys.stderr.buffer)
        self._ranks: list[_Rank] = []
        self._store: StoreServer | None = None
        self.torch_port: int | None = None  # MASTER_PORT of the ranks: left free for torch's env:// rendezvous
        self._watchdog: Watchdog | None = None
        self._signals: list[int] = []  # signals received by the launcher, in order
        # Signals wake the supervisor through this pair (signal.set_wakeup_fd: written by the C
        # handler, so a Python handler never takes a lock the interrupted code may hold).
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._previous_wakeup_fd: int | None = None
        self._waiting: list[fork.Waiting] = []  # forked children not yet given their rank
        self.start_time = time.time()
        self._wall_origin = time.monotonic()  # ranks' wall timelines start here (one host: one clock)
        # Ranks dump their flight recorders here when something fails; kept under --log-dir.
        if config.log_dir is not None:
            self._flight_dir = config.log_dir / "flight"
            self._own_flight_dir = False
        else:  # in the job's private directory: a killed launcher's is swept with the job's sockets
            try:
                self._flight_dir = Path(rundir.flight_dir(self.job_id))
            except (HcclSyscallError, OSError):  # no usable run directory (the ranks will say why)
                self._flight_dir = Path(tempfile.mkdtemp(prefix=f"hccl-launch-{self.job_id}-"))
            self._own_flight_dir = True

    # -- public ------------------------------------------------------------------------------

    def run(self) -> int:
        """Start the ranks, supervise them to the end, and return the launcher's exit status."""
        previous = self._install_signal_handlers()
        try:
            if supported():
                # First of all: from here on, nothing a rank starts can outlive this launcher.
                self._watchdog = Watchdog.start()
            if self.config.forks():
                # Before any thread (the store's) exists: the children are copies of a
                # single-threaded, warm launcher and wait for their rank's orders.
                fork.warm_up()
                self._waiting = fork.fork_waiting(
                    self.config.nproc, self._watchdog, close=[self._wake_r.fileno(), self._wake_w.fileno()]
                )
            if self.config.node_rank == 0:
                self._store = StoreServer(
                    self.config.master_addr, self.config.master_port, job_id=self.job_id, secret=self.job_secret
                ).start()
                port = self._store.port
                self.torch_port = free_port(self.config.master_addr)
                if self.config.nnodes > 1:
                    self._share_job_id()
                    self._wait_for_nodes()
            else:
                port = self.config.master_port
                self.job_id = self._join_node0()
            if self._signals:
                return self._interrupted(self._signals[0])
            # Before any rank binds a socket: the job's directory names this launcher, so the
            # watchdog, or else the next launcher, cleans it up if this one is SIGKILLed.
            mark = rundir.claim_job(self.job_id)
            if mark is not None and self._watchdog is not None:
                self._watchdog.remove_at_end(mark)
            rundir.sweep_dead_jobs(keep=self.job_id)  # killed launchers' jobs, and torchrun's ranks' leftovers
            self._start_ranks(port)
            return self._supervise()
        finally:
            # Whatever happened (including a bug here or a failed start), nothing outlives us.
            self._abandon_waiting()
            self._stop_all(signal.SIGKILL, grace_s=0.0)
            self._finish_io()
            if self._watchdog is not None:
                self._watchdog.close()  # it sweeps any session not cleaned up above, and exits
            if self._store is not None:
                self._store.close()
            if self._own_flight_dir:
                shutil.rmtree(self._flight_dir, ignore_errors=True)
            rundir.remove_job(self.job_id)  # sockets of ranks that were killed; the folder once empty
            if self.config.trace_dir is not None:
                merged = tracefile.merge(self.config.trace_dir)
                if merged is not None:
                    self._report(
                        f"hccl-launch: trace of {self.config.nproc} ranks written to {merged} (open in Perfetto)"
                    )
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if self._previous_wakeup_fd is not None:
                signal.set_wakeup_fd(self._previous_wakeup_fd)
            self._wake_r.close()
            self._wake_w.close()

    # -- start -------------------------------------------------------------------------------

    def _secret(self) -> str:
        """The job's store secret: HCCL_PY_JOB_SECRET if set (across hosts, give every node's
        launcher the same), else a fresh one for a one-node job, else this user's secret file
        (the same for every launcher of this user on this host)."""
        given = env.job_secret()
        if given:
            return given
        return new_job_secret() if self.config.nnodes == 1 else user_secret()

    def _share_job_id(self) -> None:
        """Node 0: put the job id in the store, where the other nodes' launchers read it (every
        rank of the job must name its keys and sockets alike)."""
        assert self._store is not None
        with StoreClient(self._store.address, timeout_s=10, secret=self.job_secret) as client:
            client.set(TORCH_PORT_KEY, str(self.torch_port).encode())
            client.set(JOB_ID_KEY, self.job_id.encode())

    def _wait_for_nodes(self) -> None:
        """Node 0: start ranks only once every node's launcher has joined (HCCL_CONNECT_TIMEOUT),
        so the store outlives every launcher's use of it even if node 0's ranks finish first."""
        assert self._store is not None
        keys = [f"{NODE_KEY}/{k}" for k in range(1, self.config.nnodes)]
        deadline = time.monotonic() + env.connect_timeout_s()
        with StoreClient(self._store.address, timeout_s=10, secret=self.job_secret) as client:
            while not self._signals:
                try:
                    client.wait(keys, min(1.0, max(deadline - time.monotonic(), 0.01)))
                    return
                except HcclTimeoutError:
                    if time.monotonic() >= deadline:
                        missing = [k for k, ok in zip(range(1, self.config.nnodes), client.check(keys)) if not ok]
                        raise HcclTimeoutError(
                            f"node 0: node(s) {missing} of {self.config.nnodes} did not join within "
                            f"{env.connect_timeout_s():g} s (HCCL_CONNECT_TIMEOUT); start hccl-launch --node-rank N "
                            f"--master-addr {self.config.master_addr} --master-port {self._store.port} on each"
                        ) from None

    def _join_node0(self) -> str:
        """Other nodes: check in with node 0 and take its job id, waiting for node 0 up to
        HCCL_CONNECT_TIMEOUT."""
        cfg = self.config
        deadline = time.monotonic() + env.connect_timeout_s()
        with StoreClient(
            store_address(cfg.master_addr, cfg.master_port), timeout_s=env.connect_timeout_s(), secret=self.job_secret
        ) as client:
            while True:  # in short waits, so a Ctrl-C meanwhile is acted on
                try:
                    job_id = client.get(JOB_ID_KEY, min(1.0, max(deadline - time.monotonic(), 0.01))).decode()
                    self.torch_port = int(client.get(TORCH_PORT_KEY, 1.0))
                    client.set(f"{NODE_KEY}/{cfg.node_rank}", str(os.getpid()).encode())
                    return job_id
                except HcclError as err:
                    if self._signals:
                        return ""  # run() stops here, as interrupted
                    if time.monotonic() >= deadline:
                        raise type(err)(
                            f"node {cfg.node_rank}: no job from node 0 at {cfg.master_addr}:{cfg.master_port} "
                            f"(start hccl-launch --node-rank 0 there, with the same --master-port): "
                            f"{err.message}"
                        ) from None

    def _start_ranks(self, port: int) -> None:
        cfg = self.config
        if cfg.log_dir is not None:
            cfg.log_dir.mkdir(parents=True, exist_ok=True)
        command = cfg.command()
        nodes = (
            {env.HCCL_PY_NNODES: str(cfg.nnodes), env.HCCL_PY_NODE_RANK: str(cfg.node_rank)} if cfg.nnodes > 1 else {}
        )
        for local, (r, device) in enumerate(cfg.node_ranks()):
            child_env = {
                **os.environ,
                **cfg.npu_env(dict(os.environ)),
                **rank_env(
                    r,
                    cfg.world_size,
                    cfg.master_addr,
                    port,
                    self.job_id,
                    self.job_secret,
                    local,
                    cfg.nproc,
                    torch_port=self.torch_port,
                ),
                env.DEVICE_ID: str(device),
                **nodes,
                **cfg.modeled_env(),
                env.HCCL_PY_WALL_ORIGIN: repr(self._wall_origin),
                env.HCCL_PY_FLIGHT_DIR: str(self._flight_dir),
            }
            popen: subprocess.Popen[bytes] | fork.ForkedProcess
            if self._waiting:
                popen = self._waiting.pop(0).start(child_env, cfg.argv(), cfg.target, is_module=cfg.is_module)
            else:
                popen = subprocess.Popen(
                    command,
                    env=child_env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    # Own session: Ctrl-C in the terminal reaches only the launcher, which forwards it,
                    # the rank's whole process group can be signalled at once, and everything the rank
                    # starts can be found by its session id (= its pid). The rank registers that
                    # session with the watchdog before it execs.
                    start_new_session=True,
                    preexec_fn=pdeathsig_preexec(self._watchdog),
                )
            rank = _Rank(r, popen, start_time=start_time(popen.pid))
            if cfg.log_dir is not None:
                rank.log_path = cfg.log_dir / f"rank_{r}.log"
                rank.log = Sink(open(rank.log_path, "wb"))
            self._ranks.append(rank)
            assert popen.stdout is not None and popen.stderr is not None
            for pipe, sink, keep_tail in ((popen.stdout, self._out, False), (popen.stderr, self._err, True)):
                reader = threading.Thread(
                    target=self._pump, args=(rank, pipe, sink, keep_tail), name=f"hccl-launch-tee-{r}", daemon=True
                )
                reader.start()
                rank.readers.append(reader)

    def _abandon_waiting(self) -> None:
        """Forked children that never got a rank (the start failed): they exit on EOF; reap them."""
        for waiting in self._waiting:
            waiting.abandon()
            try:
                os.waitpid(waiting.pid, 0)
            except ChildProcessError:
                pass
        self._waiting = []

    def _pump(self, rank: _Rank, pipe: BinaryIO, sink: Sink, keep_tail: bool) -> None:
        """Relay one of the rank's pipes until EOF (launch/relay.py): to ``sink`` with the
        ``[rank] `` prefix, to the rank's log unprefixed, its last lines to the report's tail."""
        sinks = [(sink, f"[{rank.rank}] ".encode())] + ([(rank.log, b"")] if rank.log is not None else [])
        with pipe:
            relay(pipe.fileno(), sinks, rank.tail if keep_tail else None)

    # -- supervise ---------------------------------------------------------------------------

    def _supervise(self) -> int:
        deadline = None if self.config.timeout_s is None else time.monotonic() + self.config.timeout_s
        while True:
            if self._signals:
                return self._interrupted(self._signals[0])
            root = self._reap_exited()
            if root is not None:
                self._stop_all(signal.SIGTERM, self.config.grace_s)
                self._finish_io()
                self._report(
                    format_failure(self.job_id, [r.outcome() for r in self._ranks], root.rank, self.start_time)
                )
                self._report_diagnosis()
                assert root.returncode is not None
                return shell_exit_code(root.returncode)
            if all(r.returncode is not None for r in self._ranks):
                return 0
            if deadline is not None and time.monotonic() >= deadline:
                self._stop_all(signal.SIGTERM, self.config.grace_s)
                self._finish_io()
                self._report(
                    format_stopped(
                        self.job_id,
                        [r.outcome() for r in self._ranks],
                        f"--timeout {self.config.timeout_s:g} s exceeded",
                    )
                )
                self._report_diagnosis()
                return EXIT_TIMEOUT
            self._nap()

    def _interrupted(self, signum: int) -> int:
        # SIGINT (not SIGTERM) for both: Python ranks get KeyboardInterrupt and run their
        # finally/atexit cleanup (shared-memory segments), as on a terminal Ctrl-C.
        self._stop_all(signal.SIGINT, self.config.grace_s)
        self._finish_io()
        self._report(
            format_stopped(
                self.job_id,
                [r.outcome() for r in self._ranks],
                f"launcher received {signal_name(signum)}; forwarded SIGINT to the ranks",
            )
        )
        return 128 + signum

    def _reap_exited(self) -> _Rank | None:
        """Record ranks that exited since the last look; the first failing one, if any (of
        several found at one look, the one whose flight record says it failed first)."""
        failed = [rank for rank in self._ranks if rank.returncode is None and self._exited(rank) and rank.returncode]
        if len(failed) > 1:
            order = failure_order(load_dumps(self._flight_dir), [r.rank for r in failed])
            return next(r for r in failed if r.rank == order[0])
        return failed[0] if failed else None

    def _exited(self, rank: _Rank) -> bool:
        """Whether the rank has exited (its status recorded the first time this sees it)."""
        if rank.returncode is None:
            returncode = self._exit_status(rank)
            if returncode is not None:
                rank.returncode, rank.exit_time = returncode, time.time()
        return rank.returncode is not None

    def _exit_status(self, rank: _Rank, block: bool = False) -> int | None:
        """The rank's exit status (``None`` while it runs, unless ``block``); collecting it
        first kills whatever the rank left running."""
        if rank.popen.returncode is not None:
            return rank.popen.returncode
        pid = rank.popen.pid
        try:
            # WNOWAIT: look without reaping, so the pid (and so the process-group and session
            # ids) stays ours while we kill whatever the rank left running.
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG))
        except ChildProcessError:  # already reaped
            return rank.popen.poll()
        if info is None:
            return None
        self._end_session(rank)
        return rank.popen.wait()

    def _end_session(self, rank: _Rank) -> None:
        """The rank exited (not reaped yet): its leftover processes must not outlive it. Its
        process group goes at once; the rest of its session (other groups, orphaned
        grandchildren) is found in /proc. Then the watchdog can forget the rank's pid."""
        signal_group(rank.popen, signal.SIGKILL)
        if self._watchdog is not None:
            self._watchdog.sweep({rank.popen.pid: rank.start_time})

    def _stop_all(self, sig: int, grace_s: float) -> None:
        """Send ``sig`` to every live rank's process group, SIGKILL what is left after the grace
        (or at once on another signal to the launcher, e.g. a second Ctrl-C)."""
        self._reap_exited()
        alive = [r for r in self._ranks if r.returncode is None]
        seen_signals = len(self._signals)

        def send(rank: _Rank, signum: int) -> None:
            rank.stopped_by = signum
            signal_group(rank.popen, signum)

        stop_all(
            alive,
            grace_s,
            sig,
            send=send,
            exited=self._exited,
            wait=lambda live, timeout_s: self._nap(),
            give_up=lambda: len(self._signals) > seen_signals,
        )
        for r in alive:
            if r.returncode is None:
                r.returncode, r.exit_time = self._exit_status(r, block=True), time.time()

    def _finish_io(self) -> None:
        """Let the tee threads drain (so the report has the last stderr lines), close logs."""
        deadline = time.monotonic() + 2.0
        for rank in self._ranks:
            for reader in rank.readers:
                reader.join(max(0.0, deadline - time.monotonic()))
            if rank.log is not None and not any(t.is_alive() for t in rank.readers):
                rank.log.close()
                rank.log = None

    def _nap(self) -> None:
        # A signal (a Ctrl-C, a rank's exit) writes to _wake_w, so it is acted on at once.
        select.select([self._wake_r], [], [], POLL_INTERVAL_S)
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _report_diagnosis(self) -> None:
        """What the ranks' flight recorders say; also diagnosis.json under --log-dir."""
        dumps = load_dumps(self._flight_dir)
        if not dumps:
            return
        local = [r.rank for r in self._ranks] if self.config.nnodes > 1 else None
        found = diagnose(dumps, self.config.world_size, local)
        self._report(format_diagnosis(found))
        if self.config.log_dir is not None:
            path = self.config.log_dir / "diagnosis.json"
            path.write_text(json.dumps(found, indent=2))
            self._report(f"hccl-launch: diagnosis written to {path}")

    def _report(self, text: str) -> None:
        self._err.write(self, b"", ("\n" + text + "\n").encode())

    # -- signals -----------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Callable[..., object] | int | None]:
        if threading.current_thread() is not threading.main_thread():
            return {}  # signal handlers can only be set from the main thread (e.g. in tests)

        def handler(signum: int, frame: object) -> None:
            self._signals.append(signum)  # the wakeup fd ends the supervisor's nap

        def child_exited(signum: int, frame: object) -> None:
            # Nothing to do: the wakeup fd makes the supervisor look at once. The first rank to
            # exit is the root cause, and a peer that learns of its death exits a few
            # milliseconds later, inside one poll interval.
            pass

        previous = {}
        for signum, act in ((signal.SIGINT, handler), (signal.SIGTERM, handler), (signal.SIGCHLD, child_exited)):
            previous[signum] = signal.getsignal(signum)
            signal.signal(signum, act)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        return previous
