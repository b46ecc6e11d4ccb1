"""hccl-topo: show, validate, generate, presets; errors without tracebacks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from topology import RankTable
from topology.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_show_preset(capsys):
    code, out, err = run(capsys, "show", "--preset", "ascend910-8p")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "ascend910-8p: 8 ranks on 1 server, ascend910 cards, 2 HCCS islands"
    assert "rank  server  device  card       island" in out
    assert "   7       0       7  ascend910       1" in out
    assert "HCCS     12  10.7        2.60" in out and "HCCL auto groups: {0-3} {4-7}" in out


def test_show_defaults_and_n(capsys):
    code, out, _ = run(capsys, "show", "-n", "4")
    assert code == 0 and out.startswith("ascend910-8p: 4 ranks")
    code, out, _ = run(capsys, "show", "-n", "12")
    assert code == 0 and out.startswith("2x8p-roce: 12 ranks on 2 servers")


def test_show_rank_table_with_wiring(capsys, tmp_path):
    path = tmp_path / "rt.json"
    assert run(capsys, "generate", "--preset", "2x4p-roce", "-o", str(path))[0] == 0
    code, out, _ = run(capsys, "show", "--rank-table", str(path), "--wiring", "pcie-4p")
    assert code == 0 and out.startswith("rank table (2 x pcie-4p): 8 ranks on 2 servers, ascend310p cards")


def test_validate_ok_and_bad(capsys, tmp_path):
    good = tmp_path / "good.json"
    RankTable.generate(__import__("topology").Topology.preset("2x8p-roce")).dump(good)
    code, out, _ = run(capsys, "validate", str(good))
    assert (code, out) == (0, "OK: 16 ranks on 2 servers (version 1.0)\n")

    doc = json.loads(good.read_text())
    doc["server_list"][1]["device"][0]["rank_id"] = "3"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, out, err = run(capsys, "validate", str(bad))
    assert code == 1 and out == ""
    assert err.startswith("hccl-topo: error: EI0014") and "server_list[1].device[0].rank_id" in err

    code, _, err = run(capsys, "validate", str(tmp_path / "missing.json"))
    assert code == 1 and "is not a valid real path" in err


@pytest.mark.parametrize("version", ["1.0", "1.2"])
def test_generate_writes_a_valid_table(capsys, tmp_path, version):
    path = tmp_path / "rank_table.json"
    code, out, _ = run(
        capsys, "generate", "--preset", "ascend910b-8p", "-n", "6", "-o", str(path), "--version", version
    )
    assert code == 0 and str(path) in out
    table = RankTable.load(path)
    assert table.num_ranks == 6 and table.version == version


def test_generate_to_stdout(capsys):
    code, out, _ = run(capsys, "generate", "--preset", "pcie-4p")
    assert code == 0 and RankTable.loads(out).num_ranks == 4


def test_presets_lists_every_preset(capsys):
    code, out, _ = run(capsys, "presets")
    assert code == 0 and "mixed-4p" in out and "512x8p-roce" in out and "NxMp-roce" in out


@pytest.mark.parametrize(
    "argv, code, fragment",
    [
        (["show", "--preset", "bogus"], 1, "unknown preset 'bogus'"),
        (["show", "--preset", "pcie-4p", "-n", "5"], 1, "has 4 cards"),
        (["show", "--preset", "pcie-4p", "--rank-table", "x.json"], 2, "not allowed with"),
        (["generate", "-n", "4"], 2, "--preset"),
        (["frobnicate"], 2, "invalid choice"),
        (["generate", "--preset", "pcie-4p", "-o", "/nonexistent-dir/rt.json"], 1, "No such file"),
    ],
)
def test_errors_are_one_message(capsys, argv, code, fragment):
    got, out, err = run(capsys, *argv)
    assert got == code and fragment in err


def test_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "topo.png"
    code, out, _ = run(capsys, "show", "--preset", "2x8p-roce-910", "--png", str(path))
    assert code == 0 and f"wrote {path}" in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_console_script_module_runs_without_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "topology.cli", "validate", str(tmp_path / "none.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "not a valid real path" in proc.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "module, args",
    [
        ("hccl_py.planning.cli", ["allreduce", "--preset", "ascend910b-8p", "-b", "8", "-e", "64M", "-f", "2"]),
        ("topology.cli", ["generate", "--preset", "2x8p-roce"]),
    ],
)
def test_a_table_piped_into_head_ends_quietly(module, args):
    """``hccl-sim ... | head -3``: the reader has closed the pipe before the tool writes; the tool
    stops as a Unix tool does (SIGPIPE), without a BrokenPipeError traceback or an error line
    (hccl-calibrate calls the same ``quiet_on_closed_pipe``)."""
    tool = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        tool.stdout.close()  # head has read what it wanted before the tool wrote
        _, err = tool.communicate(timeout=50)
    finally:
        tool.kill()
    assert err == b"", err.decode()
