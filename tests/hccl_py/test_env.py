"""Every environment value is parsed in one place (``hccl_py/env.py``): a bad value is an
HcclParamError naming the variable, never a raw Python error or a silent fallback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hccl_py import HcclParamError, env
from hccl_py.job import check_user_settings, read_job
from tests.mp import ROOT

BAD = [
    ("HCCL_EXEC_TIMEOUT", "nan"),
    ("HCCL_EXEC_TIMEOUT", "inf"),
    ("HCCL_EXEC_TIMEOUT", "-1"),
    ("HCCL_EXEC_TIMEOUT", "soon"),
    ("HCCL_EXEC_TIMEOUT", "1e12"),
    ("HCCL_CONNECT_TIMEOUT", "nan"),
    ("HCCL_CONNECT_TIMEOUT", "0"),
    ("HCCL_CONNECT_TIMEOUT", "-5"),
    ("HCCL_BUFFSIZE", "inf"),
    ("HCCL_BUFFSIZE", "0"),
    ("HCCL_BUFFSIZE", "0.5"),
    ("HCCL_BUFFSIZE", "nan"),
    ("HCCL_PY_SPIN_US", "-1"),
    ("HCCL_PY_MODELED_TIME", "2"),
    ("HCCL_PY_CMA", "yes"),
    ("HCCL_ALGO", "level1:warp"),
    ("HCCL_PY_TRANSPORT", "pigeon"),
    ("HCCL_DETERMINISTIC", "yes"),
    ("HCCL_DETERMINISTIC", "1"),
]


@pytest.mark.parametrize("name,value", BAD)
def test_bad_value_names_the_variable(name, value):
    with pytest.raises(HcclParamError) as info:
        check_user_settings({name: value})
    assert info.value.code == 1
    assert info.value.variable == name


@pytest.mark.parametrize("name,value", [("MASTER_PORT", "99999"), ("MASTER_PORT", "0"), ("MASTER_PORT", "http")])
def test_master_port_out_of_range(name, value):
    with pytest.raises(HcclParamError) as info:
        env.master_port({name: value})
    assert info.value.variable == name


@pytest.mark.parametrize(
    "environ,variable",
    [
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK_ID": "x"}, "RANK_ID"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"RANK_SIZE": "70000"}, "RANK_SIZE"),
    ],
)
def test_rank_and_size_checked(environ, variable):
    with pytest.raises(HcclParamError) as info:
        env.rank_and_size(environ)
    assert info.value.variable == variable


def test_strict_determinism_is_refused_off_a_910b():
    from hccl_py.engine.context import make_context
    from hccl_py.errors import HcclNotSupportedError

    job = read_job({"HCCL_DETERMINISTIC": "strict", "HCCL_PY_TOPOLOGY": "ascend910-8p"})
    with pytest.raises(HcclNotSupportedError) as info:
        make_context(job, None)
    assert info.value.code == 5 and info.value.variable == "HCCL_DETERMINISTIC"


def test_good_values():
    assert env.deterministic({}) == "false" and env.deterministic({"HCCL_DETERMINISTIC": " TRUE "}) == "true"
    assert env.deterministic({"HCCL_DETERMINISTIC": "strict"}) == "strict"
    assert env.exec_timeout_s({"HCCL_EXEC_TIMEOUT": "0"}) is None  # 0: no limit, as HCCL
    assert env.exec_timeout_s({"HCCL_EXEC_TIMEOUT": "1.5"}) == 1.5
    assert env.exec_timeout_s({}) == env.DEFAULT_EXEC_TIMEOUT_S
    assert env.connect_timeout_s({"HCCL_CONNECT_TIMEOUT": " 7 "}) == 7.0
    assert env.buffsize_bytes({"HCCL_BUFFSIZE": "1"}) == 1 << 20
    assert env.master_port({"MASTER_PORT": "29500"}) == 29500
    assert env.rank_and_size({"RANK_ID": "3", "RANK": "1", "WORLD_SIZE": "4"}) == (3, 4)  # HCCL's name first
    check_user_settings({})


@pytest.mark.timeout(60)
def test_init_checks_every_setting_even_in_a_world_of_one():
    """A world of one never uses HCCL_BUFFSIZE, yet a typo in it is reported, not ignored."""
    code = "import hccl_py\ntry:\n    hccl_py.init()\nexcept hccl_py.HcclParamError as e:\n    print(e.variable)\n"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": "", "PYTHONPATH": str(ROOT), "HCCL_BUFFSIZE": "inf"},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert out.stdout.strip() == "HCCL_BUFFSIZE", out.stderr


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("no_leaks")
def test_hccl_launch_refuses_a_bad_value_before_starting_any_rank(tmp_path):
    marker = tmp_path / "started"
    script = tmp_path / "rank.py"
    script.write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    launcher = [sys.executable, "-m", "launch.cli", "-n", "2", str(script)]
    out = subprocess.run(
        launcher,
        env={"PATH": "", "PYTHONPATH": str(ROOT), "HCCL_EXEC_TIMEOUT": "nan"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert out.returncode == 2
    assert "HCCL_EXEC_TIMEOUT" in out.stderr  # the one line a user reads
    assert not marker.exists()


def test_where_the_store_is():
    """hccl-py's own variables first (hccl-launch: MASTER_PORT is torch's), then MASTER_*; under
    torchrun MASTER_ADDR:MASTER_PORT is its agent's c10d store."""
    launched = {
        "HCCL_PY_STORE_ADDR": "10.0.0.1",
        "HCCL_PY_STORE_PORT": "41000",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    assert env.store_address(launched) == ("10.0.0.1", 41000, False)
    assert env.store_address({"MASTER_PORT": "29500"}) == ("127.0.0.1", 29500, False)  # by hand: rank 0 hosts it
    torchrun = {"MASTER_ADDR": "localhost", "MASTER_PORT": "46405", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert env.store_address(torchrun) == ("localhost", 46405, True)
    assert env.store_address({}) == ("127.0.0.1", None, False)
    job = read_job({**torchrun, "RANK": "1", "WORLD_SIZE": "2"})
    assert (job.store_addr, job.store_port, job.torch_store) == ("localhost", 46405, True)
    with pytest.raises(HcclParamError) as info:
        env.store_address({"HCCL_PY_STORE_PORT": "70000"})
    assert info.value.variable == "HCCL_PY_STORE_PORT"
