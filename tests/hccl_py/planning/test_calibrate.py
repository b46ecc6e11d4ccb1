"""hccl-calibrate: HCCL Test and nccl-tests logs in, fitted figures out."""

from __future__ import annotations

import json

import pytest

from hccl_py.planning import cli as sim
from hccl_py.planning.calibrate import CalibrationError, Runs, fit, main, parse_log, parse_params
from topology import LINK_KINDS, Topology, load_figures

HEADER = "data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:"


def _sweep(tmp_path, capsys, name, args) -> str:
    assert sim.main(args) == 0
    path = tmp_path / name
    path.write_text(capsys.readouterr().out)
    return str(path)


def test_figures_behind_generated_logs_are_recovered_within_one_percent(tmp_path, capsys):
    known = {
        "links": {"HCCS_910B": {"bandwidth_Bps": 15e9, "latency_s": 4e-6}},
        "cards": {"ascend910b": {"launch_overhead_s": 30e-6}},
    }
    figures = tmp_path / "known.json"
    figures.write_text(json.dumps(known))
    sweep = ["--preset", "ascend910b-8p", "--figures", str(figures), "-b", "8K", "-e", "256M", "-f", "4"]
    ar = _sweep(tmp_path, capsys, "all_reduce.log", ["allreduce", *sweep])  # collective from the file name
    ag = _sweep(tmp_path, capsys, "ag.log", ["allgather", *sweep])  # collective from hccl-sim's header
    out = tmp_path / "fitted.json"
    assert main(["--preset", "ascend910b-8p", ar, ag, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "residual" in printed and "fitted us" in printed and printed.count("  allgather  ") == 8  # 8K .. 128M by 4
    links, cards = load_figures(out)
    assert links["HCCS_910B"].bandwidth_Bps == pytest.approx(15e9, rel=0.01)
    assert links["HCCS_910B"].latency_s == pytest.approx(4e-6, rel=0.01)
    assert cards["ascend910b"].launch_overhead_s == pytest.approx(30e-6, rel=0.01)
    assert (
        sim.main(["allreduce", "--preset", "ascend910b-8p", "--figures", str(out), "--bytes", "1M"]) == 0
    )  # the JSON is taken


def test_two_link_kinds_of_a_multi_server_run(tmp_path, capsys):
    # a non-blocking fabric (8 ports' worth a server): the ports, not the servers' uplinks, bound
    uplink = {"ROCE200_UPLINK": {"bandwidth_Bps": 188e9}}
    known = {"links": {"HCCS_910B": {"bandwidth_Bps": 16e9}, "ROCE200": {"bandwidth_Bps": 11e9}, **uplink}}
    figures = tmp_path / "known.json"
    figures.write_text(json.dumps(known))
    fabric = tmp_path / "fabric.json"
    fabric.write_text(json.dumps({"links": uplink}))
    sweep = ["--figures", str(figures), "-b", "1M", "-e", "1G", "-f", "4"]
    # one server alone tells HCCS; both servers then tell RoCE (in one two-level run alone the two
    # trade off: allgather's time is allreduce's halved, whatever the split)
    one = _sweep(tmp_path, capsys, "ar1.log", ["allreduce", "--preset", "1x4p-roce", *sweep])
    two = _sweep(tmp_path, capsys, "ar2.log", ["allreduce", "--preset", "2x4p-roce", *sweep])
    fit_ = tmp_path / "f.json"
    assert (
        main(
            [
                "--preset",
                "2x4p-roce",
                "--figures",
                str(fabric),
                f"{one}:allreduce:4",
                f"{two}:allreduce",
                "-o",
                str(fit_),
                "--fit",
                "links.HCCS_910B.bandwidth_Bps,links.ROCE200.bandwidth_Bps",
            ]
        )
        == 0
    )
    links, _ = load_figures(fit_)
    assert links["HCCS_910B"].bandwidth_Bps == pytest.approx(16e9, rel=0.01)
    assert links["ROCE200"].bandwidth_Bps == pytest.approx(11e9, rel=0.01)


def _public_table(tmp_path) -> list[str]:
    """The issue's table (limulidae: 910B, CANN 8.0) as HCCL Test logs at the plateau (1e9 bytes)."""
    specs = []
    for cards, collective, algbw in (
        (2, "allreduce", 18),
        (2, "allgather", 38),
        (4, "allreduce", 30),
        (4, "allgather", 64),
        (8, "allreduce", 72),
        (8, "allgather", 149),
    ):
        path = tmp_path / f"lim_{cards}_{collective}.log"
        path.write_text(f"{HEADER}\n1000000000        | {1e9 / (algbw * 1e9) * 1e6:<14.2f} | {algbw:<20} | success\n")
        specs.append(f"{path}:{collective}:{cards}")
    return specs


def test_fitting_the_public_table(tmp_path, capsys):
    assert main(["--preset", "ascend910b-8p", *_public_table(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "links.HCCS_910B.bandwidth_Bps" in out and "not fitted: links.HCCS_910B.latency_s" in out
    residuals = {
        line.split()[0].split("/")[-1]: float(line.split()[-1].rstrip("%"))
        for line in out.splitlines()
        if line.startswith(str(tmp_path))
    }
    assert len(residuals) == 6 and all(abs(r) < 15 for r in residuals.values())
    # 2- and 8-card allreduce and the 4- and 8-card allgather within 10%; the 4-card allreduce (-14.6%) and
    # 2-card allgather (+10.5%) cannot be, with one per-link figure (the 4-card run achieves 16 GB/s per link,
    # the others 18.6-19; docs/fidelity.md)
    assert sum(abs(r) <= 10 for r in residuals.values()) == 4


def test_nccl_tests_tables_and_stated_rank_counts(tmp_path, capsys):
    log = tmp_path / "nccl.log"
    log.write_text(
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor)\n"
        "#  Rank  0 Group  0 Pid 1 on host device  0 [0x01] Ascend\n"
        "#  Rank  1 Group  0 Pid 2 on host device  1 [0x02] Ascend\n"
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
        "     1048576        262144     float     sum      -1    80.00   13.11   13.11      0    80.00   13.11   13.11      0\n"
        "   268435456      67108864     float     sum      -1  14000.0   19.17   19.17      0  14000.0   19.17   19.17      0\n"
    )
    parsed = parse_log(f"{log}:allreduce")
    assert (
        [r[1] for r in parsed.rows] == [1048576, 268435456]
        and parsed.stated_ranks == (2, 3)
        and parsed.dtype == "float32"
    )
    assert main(["--preset", "ascend910b-8p", f"{log}:allreduce:2", "--fit", "links.HCCS_910B.bandwidth_Bps"]) == 0
    capsys.readouterr()
    assert main(["--preset", "ascend910b-8p", f"{log}:allreduce"]) == 2  # 2 ranks ran, the preset has 8
    err = capsys.readouterr().err
    assert f"{log}:3" in err and "2 ranks" in err and "8" in err


def test_an_hccl_sim_sweep_says_what_it_modeled(tmp_path, capsys):
    log = parse_log(
        _sweep(
            tmp_path,
            capsys,
            "sweep.log",
            [
                "reduce_scatter",
                "--preset",
                "2x4p-roce",
                "--dtype",
                "bf16",
                "--op",
                "max",
                "-b",
                "64K",
                "-e",
                "1M",
                "-f",
                "4",
            ],
        )
    )
    assert (log.collective, log.dtype, log.op, log.stated_ranks[0], len(log.rows)) == (
        "reduce_scatter",
        "bfloat16",
        "max",
        8,
        3,
    )


@pytest.mark.parametrize(
    "text, where, fragment",
    [
        ("hello\nworld\n", "", "no HCCL Test table"),
        (
            f"mpirun -n 8 ./bin/all_reduce_test -b 8 -e 64\n{HEADER}\n8 | fast | 0.1 | success\n",
            ":3",
            "cannot read this row",
        ),
        (f"{HEADER}\n8 | 10.0 | 0.1 | failed\n", ":2", "result check failed"),
        (f"mpirun -n 16 ./bin/all_reduce_test -p 8 -b 8 -e 64\n{HEADER}\n8 | 10.0 | 0.1 | success\n", ":1", "16 ranks"),
    ],
)
def test_bad_logs_name_the_file_and_line(tmp_path, capsys, text, where, fragment):
    log = tmp_path / "all_reduce.log"
    log.write_text(text)
    assert main(["--preset", "ascend910b-8p", str(log)]) == 2
    err = capsys.readouterr().err
    assert f"{log}{where}" in err and fragment in err


def test_other_bad_input(tmp_path, capsys):
    log = tmp_path / "mystery.log"
    log.write_text(f"{HEADER}\n8 | 10.0 | 0.1 | success\n")
    assert main(["--preset", "ascend910b-8p", str(log)]) == 2
    assert "which collective" in capsys.readouterr().err
    assert main(["--preset", "ascend910b-8p", str(tmp_path / "missing.log")]) == 2
    assert "cannot read" in capsys.readouterr().err
    with pytest.raises(CalibrationError, match="names no figure"):
        parse_params("links.NVLINK.bandwidth_Bps")


def test_a_fit_that_does_not_converge_says_so(tmp_path):
    log = tmp_path / "ar.log"
    log.write_text(
        f"{HEADER}\n"
        + "".join(f"{s} | {t} | 0 | success\n" for s, t in ((8192, 90.0), (1 << 20, 100.0), (1 << 28, 9000.0)))
    )
    runs = Runs(
        [parse_log(f"{log}:allreduce")],
        lambda ranks, figures: Topology.preset("ascend910b-8p", n=ranks, figures=figures),
        (dict(LINK_KINDS), dict(Topology.preset("ascend910b-8p").card_models)),
    )
    with pytest.raises(CalibrationError, match="did not converge in 1 iterations"):
        fit(runs, parse_params("links.HCCS_910B.bandwidth_Bps,links.HCCS_910B.latency_s"), max_iterations=1)
