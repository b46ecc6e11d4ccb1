"""HCCL's C API: the prefix builds; a C program of our own (c/capi_check.c) runs every operator
under mpiexec (a rank per process) and as threads (a rank per device, root info and
HcclCommInitAll), checks results and error codes on every rank, and its modeled allreduce equals
the simulator's; the library built with ASan and UBSan runs it clean; a ctypes client in a Python
process joins that process's runtime."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hccl_py import native
from hccl_py.native import build
from launch.npu import capi_environment
from tests.mp import run_command

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CHECK = HERE / "c" / "capi_check.c"
EXAMPLE = HERE.parents[2] / "examples" / "capi"
VENV = Path(sys.prefix)
MPI_HEADER = VENV / "include" / "mpi.h"
MPIEXEC = VENV / "bin" / "mpiexec"
# every symbol hicann/oam-tools' hccl_test references (its 11 binaries, linked with -Wl,-z,now)
HCCL_TEST_SYMBOLS = """
HcclAllGather HcclAllGatherV HcclAllReduce HcclAlltoAll HcclAlltoAllV HcclAlltoAllVC HcclBroadcast HcclReduce
HcclReduceScatter HcclReduceScatterV HcclScatter HcclCommActivateCommMemory HcclCommDeactivateCommMemory
HcclCommDestroy HcclCommInitRootInfo HcclCommInitRootInfoConfig HcclCommSetMemoryRange HcclCommSymWinDeregister
HcclCommSymWinRegister HcclCommUnsetMemoryRange HcclGetCommConfigCapability HcclGetRootInfo aclFinalize aclInit
aclprofCreateConfig aclprofFinalize aclprofInit aclprofStart aclprofStop aclrtCreateEvent aclrtCreateEventWithFlag
aclrtCreateStream aclrtDestroyEvent aclrtDestroyStream aclrtEventElapsedTime aclrtFree aclrtFreeHost
aclrtFreePhysical aclrtGetDevice aclrtGetDeviceCount aclrtGetMemInfo aclrtGetSocName aclrtMalloc aclrtMallocHost
aclrtMallocPhysical aclrtMapMem aclrtMemGetAllocationGranularity aclrtMemcpy aclrtRecordEvent
aclrtReleaseMemAddress aclrtReserveMemAddress aclrtResetDevice aclrtResetEvent aclrtSetDevice
aclrtSetDeviceSatMode aclrtSetStreamFailureMode aclrtStreamWaitEvent aclrtSynchronizeStream aclrtUnmapMem
""".split()

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("no_leaks")]


@pytest.fixture(scope="module")
def prefix() -> Path:
    found = native.prefix()
    if found is None:
        pytest.fail(f"HCCL's C API did not build: {native.why_not()}")
    return found


def _compile(prefix: Path, out: Path, *, mpi: bool, flags: tuple[str, ...] = (), library: Path | None = None) -> Path:
    lib64 = library or prefix / "lib64"
    command = [
        build.compiler(),
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{prefix / 'include'}",
        *flags,
        str(CHECK),
        f"-L{lib64}",
        f"-Wl,-rpath,{lib64}",
        "-lhccl",
        "-lpthread",
        "-o",
        str(out),
    ]
    if mpi:
        command[1:1] = ["-DWITH_MPI", f"-I{VENV / 'include'}"]
        command += [f"-L{VENV / 'lib'}", f"-Wl,-rpath,{VENV / 'lib'}", "-lmpi"]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="module")
def program(prefix, tmp_path_factory) -> Path:
    return _compile(prefix, tmp_path_factory.mktemp("capi") / "capi_check", mpi=False)


def _env(devices: int, **extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HCCL_", "RANK", "MASTER_", "PMI"))}
    environ.update(capi_environment(environ))
    environ.update({"HCCL_PY_NPU_DEVICES": str(devices), "HCCL_PY_TOPOLOGY": "ascend910b-8p", **extra})
    return environ


def _ranks_ok(out: str, n: int) -> dict[int, float]:
    """Every rank said ok; its modeled allreduce microseconds."""
    assert "FAILED" not in out, out
    assert sorted(int(r) for r in re.findall(r"rank (\d+): ok \d+ checks", out)) == list(range(n)), out
    return {int(r): float(us) for r, us in re.findall(r"rank (\d+): modeled allreduce \d+ ([\d.]+)", out)}


def _simulated_us(n: int, nbytes: int, preset: str = "ascend910b-8p") -> float:
    """What hccl-sim says one float32 allreduce of ``nbytes`` takes on ``n`` cards of ``preset``."""
    from hccl_py.collectives import CallSpec
    from hccl_py.planning.calls import simulate_call
    from topology import Topology

    topology = Topology.preset(preset, n=n) if preset == "ascend910b-8p" else Topology.preset(preset)
    return simulate_call(CallSpec.of("allreduce", nbytes // 4), topology).time_s * 1e6


def test_the_prefix_is_cann_shaped_and_exports_what_hccl_test_links(prefix):
    lib64 = prefix / "lib64"
    for alias in build.ALIASES:
        assert (lib64 / alias).resolve() == (lib64 / build.LIBRARY).resolve()
    for header in (
        "hccl/hccl.h",
        "hccl/hccl_types.h",
        "hccl/hccl_comm.h",
        "acl/acl.h",
        "acl/acl_rt.h",
        "acl/acl_prof.h",
    ):
        assert (prefix / "include" / header).is_file(), header
    library = ctypes.CDLL(str(lib64 / "libacl_rt.so"))  # a name resolves to the one library
    missing = [name for name in HCCL_TEST_SYMBOLS if not hasattr(library, name)]
    assert not missing, missing
    assert build.current(prefix)


@pytest.mark.parametrize("language", ["c11", "c++11"])
def test_the_headers_compile_clean_in_c_and_cpp(prefix, tmp_path, language):
    source = tmp_path / ("probe.cc" if language == "c++11" else "probe.c")
    source.write_text(
        "#include <hccl/hccl.h>\n#include <acl/acl.h>\n#include <acl/acl_prof.h>\n"
        "int main(void) { HcclCommConfig c; HcclCommConfigInit(&c); HcclRootInfo r;\n"
        "  return (sizeof(c) == 2248 && sizeof(r) == 4108 && sizeof(HcclSendRecvItem) == 32) ? 0 : 1; }\n"
    )
    compiler = "g++" if language == "c++11" else build.compiler()
    out = tmp_path / "probe"
    subprocess.run(
        [
            compiler,
            f"-std={language}",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{prefix / 'include'}",
            str(source),
            "-o",
            str(out),
        ],
        check=True,
    )
    assert subprocess.run([str(out)]).returncode == 0  # the struct sizes of HCCL's interface


@pytest.mark.parametrize("mode", ["threads", "initall"])
def test_ranks_as_threads_of_one_process_run_every_operator(program, mode):
    result = run_command([str(program), mode, "4"], timeout=120, env=_env(4))
    assert result.returncode == 0, result.stdout + result.stderr
    modeled = _ranks_ok(result.stdout, 4)
    assert len(modeled) == 4 and all(
        us == pytest.approx(_simulated_us(4, 1 << 20), abs=1e-3) for us in modeled.values()
    )


def test_a_mismatch_and_a_timeout_reach_every_rank_with_hccls_codes(program):
    """Failures of the runtime, through the C API: calls that disagree fail on both ranks
    (HCCL_E_PARA, the mismatch named in the log); a rank alone in a call times out
    (HCCL_E_TIMEOUT), and its peer that comes later fails too (the peer's failure, HCCL_E_REMOTE,
    or its own timeout), never a hang."""
    result = run_command([str(program), "failures"], timeout=120, env=_env(2, HCCL_EXEC_TIMEOUT="2"))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = set(result.stdout.split("\n"))
    assert {"rank 0: mismatch 1", "rank 1: mismatch 1", "rank 0: alone 9"} <= lines, result.stdout
    assert lines & {"rank 1: alone 21", "rank 1: alone 9"}, result.stdout
    assert "count" in result.stderr and "Waiting peer rank" in result.stderr, result.stderr


def test_ranks_of_a_rank_table_meet_and_run_every_operator(program, tmp_path):
    """HcclCommInitClusterInfo: the rank table is the modeled cluster (its cards' links)."""
    table = tmp_path / "rank_table.json"
    subprocess.run(
        [str(VENV / "bin" / "hccl-topo"), "generate", "--preset", "ascend910b-8p", "-n", "4", "-o", str(table)],
        check=True,
    )
    env = _env(4, MASTER_PORT=str(_free_port()))  # HCCL_PY_TOPOLOGY ascend910b-8p: the table's cards are 910B
    result = run_command([str(program), "cluster", str(table), "4"], timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    modeled = _ranks_ok(result.stdout, 4)
    assert all(us == pytest.approx(_simulated_us(4, 1 << 20), abs=1e-3) for us in modeled.values())


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.skipif(not MPI_HEADER.exists() or not MPIEXEC.exists(), reason="the mpich wheel (pip install -e '.[mpi]')")
def test_a_rank_per_process_under_mpiexec_with_bad_calls_refused_everywhere(prefix, tmp_path):
    program = _compile(prefix, tmp_path / "capi_check_mpi", mpi=True)
    result = run_command([str(MPIEXEC), "-n", "4", str(program), "mpi", "errors"], timeout=120, env=_env(4))
    assert result.returncode == 0, result.stdout + result.stderr
    modeled = _ranks_ok(result.stdout, 4)
    assert len(modeled) == 4 and all(
        us == pytest.approx(_simulated_us(4, 1 << 20), abs=1e-3) for us in modeled.values()
    )
    # rank 1's refusal reached the others, with the runtime's message in their log
    assert (
        len(re.findall(r"rank 1 refused this call before any data moved: sendBuf is a null pointer", result.stderr))
        == 3
    )


def test_the_library_runs_clean_under_address_and_undefined_behaviour_sanitizers(prefix, tmp_path):
    flags = ("-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined")
    asan = build.build(tmp_path / "asan", extra_flags=flags, quiet=True)
    assert asan is not None, build.status(tmp_path / "asan")
    program = _compile(prefix, tmp_path / "capi_check_asan", mpi=False, flags=flags, library=asan / "lib64")
    # Python's own allocations live until exit by design: leaks are not the library's to report
    env = _env(2, ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="print_stacktrace=1")
    env["LD_LIBRARY_PATH"] = str(asan / "lib64")
    result = run_command([str(program), "threads", "2"], timeout=180, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "runtime error" not in result.stderr and "AddressSanitizer" not in result.stderr, result.stderr
    _ranks_ok(result.stdout, 2)


@pytest.mark.timeout(180)
def test_pip_install_without_a_compiler_installs_python_and_says_once_why_c_is_not_built(tmp_path):
    """``pip install`` on a machine with no C compiler (PATH holds only python): the package
    installs, the build says once that the C API is not built and why, and the installed prefix
    tells ``hccl-npu --prefix`` the same; the Python API runs."""
    source = tmp_path / "src"  # a copy: the build writes build/ beside setup.py
    ignore = shutil.ignore_patterns("prefix", "__pycache__", "*.so", "build", "*.egg-info")
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("hccl_py", "topology", "launch", "benchmarks"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    env = {"PATH": str(bare), "HOME": str(tmp_path), "PIP_NO_INPUT": "1"}  # no cc, no gcc
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps", "--no-index"]
    result = run_command([*pip, "--target", str(target), str(source)], timeout=150, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    said = (result.stdout + result.stderr).count("hccl-py: HCCL's C API is not built: no C compiler")
    assert said == 1, result.stdout + result.stderr
    prefix = target / "hccl_py" / "native" / "prefix"
    assert not (prefix / "lib64" / "libhccl.so").exists()
    code = (
        "import numpy as np, hccl_py; from hccl_py.native import build; print(build.status()); "
        "comm = hccl_py.init(); x = np.arange(4.0); comm.all_reduce(x); print(x.tolist())"
    )
    run = run_command([sys.executable, "-c", code], timeout=60, env={**env, "PYTHONPATH": str(target)}, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no C compiler" in run.stdout and "[0.0, 1.0, 2.0, 3.0]" in run.stdout, run.stdout


def test_a_ctypes_client_joins_its_process_runtime(prefix):
    """In a Python process the library joins the running interpreter (vLLM's pyhccl loads it so):
    the same entry points, here on one rank."""
    code = (
        "import ctypes, numpy as np\n"
        f"lib = ctypes.CDLL({str(prefix / 'lib64' / 'libhccl.so')!r})\n"
        "lib.HcclGetErrorString.restype = ctypes.c_char_p\n"
        "assert lib.aclrtSetDevice(0) == 0\n"
        "root = ctypes.create_string_buffer(4108); assert lib.HcclGetRootInfo(root) == 0\n"
        "comm = ctypes.c_void_p(); assert lib.HcclCommInitRootInfo(1, root, 0, ctypes.byref(comm)) == 0\n"
        "buf = ctypes.c_void_p(); assert lib.aclrtMalloc(ctypes.byref(buf), ctypes.c_size_t(64), 0) == 0\n"
        "host = (ctypes.c_float * 16)(*range(16))\n"
        "assert lib.aclrtMemcpy(buf, ctypes.c_size_t(64), host, ctypes.c_size_t(64), 1) == 0\n"
        "assert lib.HcclAllReduce(buf, buf, ctypes.c_uint64(16), 4, 0, comm, None) == 0\n"
        "assert lib.HcclAllReduce(None, buf, ctypes.c_uint64(16), 4, 0, comm, None) == 2\n"
        "assert lib.HcclGetErrorString(2) == b'empty pointer'\n"
        "out = (ctypes.c_float * 16)(); assert lib.aclrtMemcpy(out, ctypes.c_size_t(64), buf, ctypes.c_size_t(64), 2) == 0\n"
        "assert list(out) == list(map(float, range(16)))\n"
        "assert lib.HcclCommDestroy(comm) == 0\n"
        "import hccl_py.capi.acl as acl; assert acl.RUNTIME.cards  # the process's own runtime served the calls\n"
        "print('ok')\n"
    )
    result = run_command([sys.executable, "-c", code], timeout=60, env=_env(1))
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def test_the_c_example_makes_and_prints_what_hccls_examples_print(tmp_path):
    """examples/capi, as a user runs it: `hccl-npu --devices 8 make test`."""
    example = tmp_path / "capi"
    shutil.copytree(EXAMPLE, example)
    hccl_npu = str(VENV / "bin" / "hccl-npu")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HCCL_", "ASCEND_"))}
    result = run_command([hccl_npu, "--devices", "8", "make", "-s", "test"], timeout=120, env=environ, cwd=example)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "Found 8 NPU device(s) available"
    expected = [f"rankId: {r}, output: [ 0 8 16 24 32 40 48 56 ]" for r in range(8)]
    assert [line.split(", modeled")[0] for line in lines[1:]] == expected
    modeled = [float(line.split("modeled ")[1].split()[0]) for line in lines[1:]]
    assert all(us == pytest.approx(_simulated_us(8, 32), abs=1e-3) for us in modeled)


@pytest.mark.skipif(not MPI_HEADER.exists() or not MPIEXEC.exists(), reason="the mpich wheel (pip install -e '.[mpi]')")
def test_ranks_on_two_servers_pay_the_two_level_model(prefix, tmp_path):
    """8 ranks on 2x4p-roce (a host's cards as ranks of two modeled servers): every operator
    right, the allreduce's modeled time the simulator's for that cluster."""
    program = _compile(prefix, tmp_path / "capi_check_mpi", mpi=True)
    env = _env(4, HCCL_PY_TOPOLOGY="2x4p-roce")
    result = run_command([str(MPIEXEC), "-n", "8", str(program), "mpi"], timeout=180, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    modeled = _ranks_ok(result.stdout, 8)
    expected = _simulated_us(8, 1 << 20, preset="2x4p-roce")
    assert len(modeled) == 8 and all(us == pytest.approx(expected, abs=1e-3) for us in modeled.values())


@pytest.mark.timeout(300)
def test_a_pyhccl_client_all_reduces_and_broadcasts_npu_tensors_under_torchrun():
    """vLLM-ascend's way (our own client of its shape, scripts/pyhccl_client.py): root info over a
    gloo group, npu tensors' data_ptr() as buffers, torch.npu.current_stream().npu_stream as the
    stream; a CPU tensor refused on every rank."""
    pytest.importorskip("torch")
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(_free_port()),
    ]
    command = [str(VENV / "bin" / "hccl-npu"), "--devices", "2", *torchrun, str(HERE / "scripts" / "pyhccl_client.py")]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HCCL_", "MASTER_", "RANK", "WORLD_SIZE"))}
    result = run_command(command, timeout=240, env=environ)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(re.findall(r"rank (\d): ok", result.stdout)) == ["0", "1"], result.stdout + result.stderr
