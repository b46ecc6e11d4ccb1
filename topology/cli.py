"""``hccl-topo``: look at, check and write cluster topologies and rank tables.

    hccl-topo show [--preset NAME | --rank-table FILE] [-n N] [--png FILE] [--figures FILE]
    hccl-topo validate FILE
    hccl-topo generate --preset NAME [-n N] [-o rank_table.json] [--version 1.0|1.2]
    hccl-topo presets

Errors go to stderr as one message (exit 1; 2 for bad command-line usage), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .errors import TopologyError
from .groups import auto_partition
from .presets import PRESET_PATTERN_HELP, PRESETS, default_preset
from .rank_table import VERSIONS, RankTable
from .topology import Topology


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hccl-topo", description="Show, validate and generate hccl-py cluster topologies and HCCL rank tables."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{show,validate,generate,presets}")

    show = sub.add_parser("show", help="print the ranks, cards, islands and links of a topology")
    source = show.add_mutually_exclusive_group()
    source.add_argument("--preset", help="preset name (default: the default preset for -n cards)")
    source.add_argument("--rank-table", metavar="FILE", help="HCCL rank table JSON")
    show.add_argument("--wiring", metavar="PRESET", help="with --rank-table: the preset whose server wiring to use")
    show.add_argument("-n", type=int, help="only the first N cards of the preset")
    show.add_argument("--png", metavar="FILE", help="also draw the graph to a PNG (needs matplotlib)")
    show.add_argument("--figures", metavar="FILE", help="JSON file overriding link/card figures")
    show.add_argument("--all-links", action="store_true", help="list every link even for large topologies")

    validate = sub.add_parser("validate", help="check a rank table the way HCCL does")
    validate.add_argument("file", metavar="FILE")

    generate = sub.add_parser("generate", help="write a rank table for a preset")
    generate.add_argument("--preset", required=True, help="preset name")
    generate.add_argument("-n", type=int, help="only the first N cards of the preset")
    generate.add_argument("-o", "--output", metavar="FILE", help="output file (default: stdout)")
    generate.add_argument("--version", choices=VERSIONS, default="1.0", help="rank table version (default 1.0)")

    sub.add_parser("presets", help="list the presets")
    return parser


def quiet_on_closed_pipe(argv) -> None:
    """A console script (``argv`` None) whose table is piped into ``head`` ends quietly, as a Unix
    tool does, instead of with Python's BrokenPipeError traceback; called from within a program
    (``argv`` given) it changes nothing."""
    import signal

    if argv is None and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hccl-topo`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    quiet_on_closed_pipe(argv)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse already printed usage / help
        return int(exit_.code or 0)
    try:
        return _COMMANDS[args.command](args)
    except TopologyError as err:
        print(f"hccl-topo: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"hccl-topo: error: {err.strerror or err} ({err.filename or ''})".replace(" ()", ""), file=sys.stderr)
        return 1


def _show(args: argparse.Namespace) -> int:
    if args.rank_table:
        if args.n is not None:
            raise TopologyError(
                "-n selects cards of a preset; a rank table already lists its cards. Fix: drop -n.", "n"
            )
        topo = Topology.from_rank_table(RankTable.load(args.rank_table), preset=args.wiring, figures=args.figures)
    else:
        if args.wiring:
            raise TopologyError("--wiring goes with --rank-table; for a preset use --preset.", "wiring")
        name = args.preset or default_preset(args.n or 8)
        topo = Topology.preset(name, n=args.n, figures=args.figures)
    print(topo.describe(max_links=10**9 if args.all_links else 200))
    groups = auto_partition(topo)
    shown = " ".join(_group_text(g) for g in groups[:16]) + (f" ... ({len(groups)} groups)" if len(groups) > 16 else "")
    print(f"\nHCCL auto groups: {shown}")
    if args.png:
        from .draw import draw_png

        shown = draw_png(topo, args.png)
        note = "" if shown == topo.num_servers else f" (first {shown} of {topo.num_servers} servers)"
        print(f"wrote {args.png}{note}")
    return 0


def _group_text(group: list[int]) -> str:
    """``{0-7}`` for a run of consecutive ranks, else ``{0,2,5}``."""
    if len(group) > 2 and group == list(range(group[0], group[0] + len(group))):
        return f"{{{group[0]}-{group[-1]}}}"
    return "{" + ",".join(map(str, group)) + "}"


def _validate(args: argparse.Namespace) -> int:
    table = RankTable.load(args.file)
    servers = "server" if table.server_count == 1 else "servers"
    print(f"OK: {table.num_ranks} ranks on {table.server_count} {servers} (version {table.version})")
    return 0


def _generate(args: argparse.Namespace) -> int:
    topo = Topology.preset(args.preset, n=args.n)
    table = RankTable.generate(topo, version=args.version)
    if args.output:
        table.dump(args.output)
        print(
            f"wrote {args.output}: {table.num_ranks} ranks on {table.server_count} server(s), "
            f"{topo.name} (version {table.version})"
        )
    else:
        sys.stdout.write(table.dumps())
    return 0


def _presets(args: argparse.Namespace) -> int:
    width = max(map(len, PRESETS))
    for name, text in PRESETS.items():
        print(f"{name.ljust(width)}  {text}")
    print(f"\n{PRESET_PATTERN_HELP}.")
    return 0


_COMMANDS = {"show": _show, "validate": _validate, "generate": _generate, "presets": _presets}

if __name__ == "__main__":
    sys.exit(main())
