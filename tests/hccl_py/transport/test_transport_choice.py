"""Transport choice: who started the ranks, which transport serves them, and the errors for a
request that cannot be served (in one process; the paths themselves are tested per transport)."""

from __future__ import annotations

import sys

import pytest

import hccl_py
from hccl_py import HcclNotSupportedError, HcclParamError
from hccl_py.transport.choice import (
    describe_hosts,
    host_identity,
    mpi_launch,
    plan_store_transport,
    requested_transport,
    use_mpi,
)

LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "RANK_ID",
    "RANK_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HCCL_PY_TRANSPORT",
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_launchers_are_recognised_by_their_environment():
    hydra = mpi_launch({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"})
    assert (hydra.starter, hydra.rank, hydra.size, hydra.local_rank) == ("mpiexec (MPICH/Hydra)", 2, 4, 0)
    ompi = mpi_launch({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
    assert (ompi.starter, ompi.rank, ompi.size) == ("mpiexec (Open MPI)", 1, 2)
    step = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"}
    assert mpi_launch(step).starter == "srun (Slurm)" and mpi_launch(step).rank == 5
    batch_script = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}  # sbatch's own shell is no rank of a step
    assert mpi_launch(batch_script) is None and mpi_launch({}) is None
    with pytest.raises(HcclParamError) as info:
        mpi_launch({"PMI_RANK": "x", "PMI_SIZE": "2"})
    assert (info.value.variable, info.value.value, info.value.rule) == ("PMI_RANK", "x", "type")


def test_automatic_choice_and_overrides():
    hydra = mpi_launch({"PMI_RANK": "0", "PMI_SIZE": "2"})
    assert use_mpi(None, hydra, launcher_env=False)
    assert not use_mpi(None, hydra, launcher_env=True)  # a wrapper set RANK on purpose (hccl-bench)
    assert use_mpi("mpi", hydra, launcher_env=True)
    assert not use_mpi("tcp", hydra, launcher_env=False) and not use_mpi(None, None, launcher_env=True)
    assert not use_mpi(None, hydra, launcher_env=False, store_given=True)  # MASTER_PORT: meet through the store
    with pytest.raises(HcclNotSupportedError) as info:  # mpi asked for, no MPI launcher
        use_mpi("mpi", None, launcher_env=True)
    assert (info.value.variable, info.value.value) == ("HCCL_PY_TRANSPORT", "mpi")
    assert requested_transport({}) is None and requested_transport({"HCCL_PY_TRANSPORT": "TCP"}) == "tcp"
    with pytest.raises(HcclParamError) as info:
        requested_transport({"HCCL_PY_TRANSPORT": "ib"})
    assert (info.value.variable, info.value.value, info.value.rule) == ("HCCL_PY_TRANSPORT", "ib", "choices")
    assert info.value.choices == ["shm", "tcp", "mpi", "auto"]


def test_store_plan_by_host():
    hosts = ["a", "a", "b", "b", "b"]
    plan = plan_store_transport(3, hosts, None)
    assert (plan.kind, plan.local, plan.remote, plan.num_hosts) == ("shm+tcp", (2, 3, 4), (0, 1), 2)
    assert plan_store_transport(0, ["a", "a"], None).kind == "shm"
    assert plan_store_transport(0, ["a", "b"], None).kind == "tcp"  # alone on its host
    forced = plan_store_transport(1, ["a", "a", "a"], "tcp")
    assert (forced.kind, forced.local, forced.remote) == ("tcp", (1,), (0, 2))
    with pytest.raises(HcclNotSupportedError) as info:
        plan_store_transport(0, hosts, "shm")
    assert (info.value.variable, info.value.value, info.value.rank, info.value.ranks) == (
        "HCCL_PY_TRANSPORT",
        "shm",
        0,
        [2, 3, 4],
    )
    assert describe_hosts(["n0", "n0", "n1"], hosts[:2] + ["b"]) == "2 hosts: n0 ranks 0-1, n1 rank 2"
    assert describe_hosts(["x", "x"], ["a", "a"]) == "1 host"


def test_host_identity_is_stable_and_overridable():
    assert host_identity({}) == host_identity({}) and len(host_identity({})) == 16
    assert host_identity({"HCCL_PY_HOST_ID": "node7"}) == "node7"


def test_mpi_requested_without_mpi4py_says_why(clean_env):
    clean_env.setenv("PMI_RANK", "0")
    clean_env.setenv("PMI_SIZE", "2")
    clean_env.setenv("HCCL_PY_TRANSPORT", "mpi")
    clean_env.setitem(sys.modules, "mpi4py", None)  # as if not installed
    clean_env.setitem(sys.modules, "mpi4py.MPI", None)
    with pytest.raises(HcclNotSupportedError) as err:
        hccl_py.init()
    assert err.value.code == 5 and err.value.module == "mpi4py"
    assert "pip install 'hccl-py[mpi]'" in err.value.message  # the message's point: what to install
    clean_env.delenv("HCCL_PY_TRANSPORT")  # automatic: no mpi4py and no store address either
    # Raised by runtime.py, which has no fields yet: the hint (install mpi4py, or set MASTER_PORT) is the point.
    with pytest.raises(
        HcclNotSupportedError, match=r"started by mpiexec \(MPICH/Hydra\).*mpi4py is not installed.*MASTER_PORT"
    ):
        hccl_py.init()


def test_mpi_requested_outside_mpiexec_is_not_supported(clean_env):
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("HCCL_PY_TRANSPORT", "mpi")
    with pytest.raises(HcclNotSupportedError) as info:
        hccl_py.init()
    assert (info.value.variable, info.value.value) == ("HCCL_PY_TRANSPORT", "mpi")
