"""``hccl-npu``: run any command as one host with N simulated Ascend NPUs.

    hccl-npu --devices 4 python hccl_pytorch_allreduce_test.py       # mp.spawn over the 4 cards
    hccl-npu --devices 2 torchrun --nproc-per-node 2 train.py        # torchrun's workers see 2 cards
    hccl-npu --devices 2 --topology ascend910b-8p pytest tests/      # Ascend's unittest files

Every process the command starts (mp.spawn, torchrun workers, subprocesses) inherits the host:
``import torch_npu`` finds hccl-py's (``hccl_py/torch/standin``), torch's device-backend autoload
loads it when a script never imports it (the entry point sits only on this path: installing
hccl-py changes no other torch program), ``torch.npu.device_count()`` is N, and the "hccl"
backend refuses what Ascend's refuses. Nothing is installed; no process not started this way is
touched. ``hccl-launch --npu`` sets the same environment for the ranks it starts.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import hccl_py
from hccl_py import env
from hccl_py.errors import HcclError, HcclNotSupportedError, HcclParamError

# hccl-py's torch_npu (hccl_py/torch/standin/torch_npu), found without importing torch
NPU_STANDIN = Path(hccl_py.__file__).resolve().parent / "torch" / "standin"
MAX_DEVICES = 64  # the device's limit (csrc/state.h, kMaxDevices)
DEFAULT_DEVICES = 8  # one Atlas server's cards
DEFAULT_TOPOLOGY = "ascend910b-8p"  # an Atlas 800T A2 (910B) server, unless --topology, a preset or a rank table says


def foreign_torch_npu() -> str | None:
    """Where a real torch_npu is installed (not hccl-py's), or None."""
    for name in ("torch_npu", "torch-npu"):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        where = Path(str(dist.locate_file(""))).resolve()
        if where != NPU_STANDIN and not str(dist.version).endswith("+hccl.py"):
            return f"torch_npu {dist.version} in {where}"
    return None


TORCH_MISSING = (
    "hccl-py's npu device needs torch: pip install 'hccl-py[torch]' (torch 2.13.0; docs/torch.md says how to "
    "get its CPU build)"
)


def check_ready(*, torch_required: bool = True) -> None:
    """Refuse before any process starts: without torch when ``torch_required`` (hccl-launch
    --npu, whose ranks are torch programs; say what to install), or beside a real torch_npu
    (which would serve 'npu' and 'hccl' itself)."""
    if torch_required and importlib.util.find_spec("torch") is None:
        raise HcclNotSupportedError(TORCH_MISSING, module="torch", rule="required")
    holder = foreign_torch_npu()
    if holder is not None:
        raise HcclNotSupportedError(
            f"a real torch_npu is installed ({holder}): it serves the npu device and 'hccl' "
            "itself; run hccl-py's simulated NPUs in an environment without it",
            holder=holder,
            rule="unique",
        )


def npu_environment(environ: dict[str, str], devices: int | None = None) -> dict[str, str]:
    """The variables that make a process tree one host with simulated NPUs: hccl-py's torch_npu
    first on PYTHONPATH, the card count (None: each process's LOCAL_WORLD_SIZE, as under
    hccl-launch), the backend's Ascend rules on; and, when HCCL's C API is built, its prefix
    where C programs and ctypes loaders look for CANN (``capi_environment``)."""
    path = environ.get("PYTHONPATH", "")
    parts = [p for p in path.split(os.pathsep) if p and Path(p).resolve() != NPU_STANDIN]
    out = {"PYTHONPATH": os.pathsep.join([str(NPU_STANDIN), *parts]), env.HCCL_PY_NPU_STRICT: "1"}
    if devices is not None:
        out[env.HCCL_PY_NPU_DEVICES] = str(devices)
    out.update(capi_environment(environ))
    return out


def capi_environment(environ: dict[str, str]) -> dict[str, str]:
    """What Makefiles, set_env.sh-style scripts and ctypes loaders read to find CANN, pointed at
    hccl-py's prefix (none of it when the prefix cannot be built): ASCEND_HOME_PATH and
    ASCEND_TOOLKIT_HOME, lib64 first on LD_LIBRARY_PATH, HCCL_SO_PATH (vLLM's pyhccl), and
    HCCL_PY_PYTHON, the Python the library starts in a C program."""
    from hccl_py import native  # lazy: builds the prefix when its sources changed

    prefix = native.prefix()
    if prefix is None:
        return {}
    lib64 = str(prefix / "lib64")
    libraries = [p for p in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and p != lib64]
    return {
        "ASCEND_HOME_PATH": str(prefix),
        "ASCEND_TOOLKIT_HOME": str(prefix),
        "LD_LIBRARY_PATH": os.pathsep.join([lib64, *libraries]),
        "HCCL_SO_PATH": str(prefix / "lib64" / "libhccl.so"),
        "HCCL_PY_PYTHON": sys.executable,
    }


def build_parser() -> argparse.ArgumentParser:
    """hccl-npu's options, then the command and its arguments."""
    parser = argparse.ArgumentParser(
        prog="hccl-npu",
        description="Run COMMAND (python, torchrun, pytest, a shell script) as one host with N "
        "simulated Ascend NPUs: `import torch_npu`, the npu device and the 'hccl' backend work in every process it "
        "starts.",
        epilog="exit status: COMMAND's own.",
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=None,
        metavar="N",
        help=f"NPUs this host shows (1..{MAX_DEVICES}; default: a server's cards of --topology, "
        f"else {DEFAULT_DEVICES})",
    )
    parser.add_argument(
        "--topology",
        default=None,
        metavar="PRESET",
        help=f"the modeled cluster (an hccl-topo preset): cards, links, HBM (default {DEFAULT_TOPOLOGY} "
        "up to 8 cards, unless HCCL_PY_TOPOLOGY or RANK_TABLE_FILE is set)",
    )
    parser.add_argument(
        "--prefix",
        action="store_true",
        help="print the CANN-shaped prefix of HCCL's C API (include/, lib64/) and exit: build C programs "
        "with ASCEND_DIR=$(hccl-npu --prefix); exit 2 when it is not built, saying why",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, with its arguments")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """hccl-npu's entry point: check, set the environment, exec COMMAND."""
    ns = build_parser().parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if ns.prefix:
        from hccl_py import native  # lazy: only --prefix and C programs need the build

        found = native.prefix()
        if found is None:
            print(f"hccl-npu: HCCL's C API is not built: {native.why_not()}", file=sys.stderr)
            return 2
        print(found)
        return 0
    if not command:
        build_parser().error("give a command to run, e.g. hccl-npu --devices 4 python script.py")
    try:
        devices = ns.devices
        if ns.topology is not None:
            from topology import TopologyError
            from topology.presets import parse_preset

            try:
                cards = parse_preset(ns.topology).cards_per_server
            except TopologyError as err:
                raise HcclParamError(f"--topology {ns.topology}: {err}", arg="--topology", value=ns.topology) from None
            devices = cards if devices is None else devices
        devices = DEFAULT_DEVICES if devices is None else devices
        if not 1 <= devices <= MAX_DEVICES:
            raise HcclParamError(
                f"--devices {devices}: expected 1..{MAX_DEVICES}",
                arg="--devices",
                value=devices,
                rule="range",
                min=1,
                max=MAX_DEVICES,
            )
        check_ready(torch_required=False)  # a C program of HCCL's API needs no torch
        if importlib.util.find_spec("torch") is None:
            print(f"hccl-npu: {TORCH_MISSING}; HCCL's C API is served without it", file=sys.stderr)
    except HcclError as err:
        print(f"hccl-npu: {err}", file=sys.stderr)
        return 2
    environ = dict(os.environ)
    environ.update(npu_environment(environ, devices))
    if ns.topology is not None:
        environ[env.HCCL_PY_TOPOLOGY] = ns.topology
    elif not environ.get(env.HCCL_PY_TOPOLOGY) and not environ.get(env.RANK_TABLE_FILE) and devices <= DEFAULT_DEVICES:
        environ[env.HCCL_PY_TOPOLOGY] = DEFAULT_TOPOLOGY  # the server Ascend programs are written for today
    try:  # what would make every process's `import torch` fail, said once, before anything starts
        from hccl_py.engine.context import host_cards

        env.alloc_conf(environ)
        host_cards(devices, environ)
    except HcclError as err:
        print(f"hccl-npu: {err}", file=sys.stderr)
        return 2
    try:
        os.execvpe(command[0], command, environ)
    except OSError as err:
        print(f"hccl-npu: cannot run {command[0]!r}: {err.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
