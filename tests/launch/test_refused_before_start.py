"""hccl-launch refuses a bad setting once, before any rank starts, with exit status 2 and a
message naming it: whether it comes from a flag or from the environment the ranks would read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hccl_py import env
from hccl_py.errors import HcclParamError

ROOT = Path(__file__).resolve().parents[2]
PRINT_ENV = Path(__file__).resolve().parent / "scripts" / "print_env.py"

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(60)]

SETTINGS = (
    env.HCCL_EXEC_TIMEOUT,
    env.HCCL_CONNECT_TIMEOUT,
    env.HCCL_PY_FAULTS,
    env.HCCL_PY_TOPOLOGY,
    env.RANK_TABLE_FILE,
    env.HCCL_PY_FIGURES,
    env.HCCL_PY_TRACE_DIR,
)


def _launch(*args: str, extra: dict[str, str] | None = None, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    environ.update({"PYTHONPATH": str(ROOT), **(extra or {})})
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", "-n", str(nproc), *args, str(PRINT_ENV)],
        env=environ,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )


def _refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    assert "[0]" not in done.stdout and "[0]" not in done.stderr  # no rank ran
    for word in words:
        assert word in done.stderr, (word, done.stderr)


def test_an_empty_exec_timeout_is_refused_not_taken_for_the_default() -> None:
    _refused(_launch(extra={env.HCCL_EXEC_TIMEOUT: ""}), "HCCL_EXEC_TIMEOUT is set but empty")
    _refused(_launch(extra={env.HCCL_CONNECT_TIMEOUT: "  "}), "HCCL_CONNECT_TIMEOUT is set but empty")


def test_an_empty_setting_is_a_param_error_naming_it_in_every_reader() -> None:
    with pytest.raises(HcclParamError) as caught:
        env.exec_timeout_s({env.HCCL_EXEC_TIMEOUT: ""})
    assert (caught.value.variable, caught.value.value) == (env.HCCL_EXEC_TIMEOUT, "")
    with pytest.raises(HcclParamError) as caught:
        env.single_copy({env.HCCL_PY_CMA: ""})
    assert caught.value.variable == env.HCCL_PY_CMA
    assert env.exec_timeout_s({}) == env.DEFAULT_EXEC_TIMEOUT_S
    assert env.exec_timeout_s({env.HCCL_EXEC_TIMEOUT: "0"}) is None


@pytest.mark.parametrize("value", ["nan", "inf", "NaN", "Infinity"])
def test_a_job_timeout_that_is_not_finite_is_refused(value: str) -> None:
    _refused(_launch("--timeout", value), "timeout must be a finite number", "leave --timeout out")


def test_a_grace_that_is_not_finite_is_refused() -> None:
    _refused(_launch("--grace", "inf"), "grace must be a finite number")


@pytest.mark.parametrize(
    "spec, words",
    [
        ("rank=1,action=explode", ["unknown action 'explode'"]),
        ("rank=5,action=crash", ["rank 5 is not in this job"]),
        ("rank=1;action=hang", ["'rank=1'"]),
    ],
)
def test_a_malformed_fault_spec_in_the_environment_is_refused(spec: str, words: list[str]) -> None:
    _refused(_launch(extra={env.HCCL_PY_FAULTS: spec}), "HCCL_PY_FAULTS", *words)


def test_a_fault_flag_replaces_the_environments_spec_as_the_ranks_see_it() -> None:
    done = _launch("--fault", "rank=1,action=crash", extra={env.HCCL_PY_FAULTS: "not a spec"})
    assert done.returncode == 0, done.stderr


def test_a_bad_topology_in_the_environment_is_refused() -> None:
    _refused(_launch(extra={env.HCCL_PY_TOPOLOGY: "ascend999"}), "ascend999", "HCCL_PY_TOPOLOGY='ascend999'")
    _refused(_launch(extra={env.HCCL_PY_TOPOLOGY: "pcie-4p"}, nproc=5), "pcie-4p", "HCCL_PY_TOPOLOGY")


def test_a_topology_in_the_environment_is_the_one_described() -> None:
    done = _launch(extra={env.HCCL_PY_TOPOLOGY: "mixed-4p"}, nproc=4)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == "hccl-launch: 4 ranks on topology mixed-4p"


def test_a_bad_rank_table_in_the_environment_is_refused(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.json")
    _refused(_launch(extra={env.RANK_TABLE_FILE: missing}), "ranktable is invalid", "RANK_TABLE_FILE")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _refused(_launch(extra={env.RANK_TABLE_FILE: str(bad)}), "not valid JSON", "RANK_TABLE_FILE")
    _refused(_launch(extra={env.HCCL_PY_FIGURES: str(bad)}), "not valid JSON", "HCCL_PY_FIGURES")


def test_a_trace_folder_that_cannot_be_made_is_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    _refused(_launch("--trace", str(a_file / "trace")), "trace folder", "Not a directory")
    _refused(_launch(extra={env.HCCL_PY_TRACE_DIR: str(a_file / "trace")}), "trace folder", "HCCL_PY_TRACE_DIR")
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        _refused(_launch("--trace", str(locked / "trace")), "trace folder", "Permission denied")
