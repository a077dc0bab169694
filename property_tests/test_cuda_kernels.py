"""The bundled CUDA kernels: the build glue and every .cu file's compile on the CPU, and what only these
kernels do on the GPU (marked gpu). What every bundled kernel must do is test_conformance.py's."""
import ctypes

import pytest
import torch

from faverify.kernels.cuda import build
from property_tests.cli_helpers import cli, read_json

HAS_GPU = torch.cuda.is_available()


def nvcc_or_skip() -> str:
    try:
        return build.find_nvcc()
    except build.BuildError as e:
        pytest.skip(f"needs nvcc to compile: {e}")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache, on disk and in this process (a library an earlier test loaded would be reused)."""
    monkeypatch.setenv("FAVERIFY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_LOADED", {})
    return tmp_path / "cache" / "cuda"


# --- the build glue, on the CPU ---------------------------------------------------------------------------

def test_cache_key_follows_sources_nvcc_and_arch(tmp_path):
    (tmp_path / "a.cu").write_text("int x;")
    (tmp_path / "a.cuh").write_text("// header")
    key = build.cache_key("sm_90", "13.0", tmp_path)
    assert key == build.cache_key("sm_90", "13.0", tmp_path)
    assert key != build.cache_key("sm_80", "13.0", tmp_path)
    assert key != build.cache_key("sm_90", "12.8", tmp_path)
    (tmp_path / "a.cuh").write_text("// header, edited")
    assert key != build.cache_key("sm_90", "13.0", tmp_path)


def test_tile_overrides_reach_the_compiler_and_the_cache_key(tmp_path, monkeypatch):
    """$FAVERIFY_CUDA_DEFINES (tuning runs, devtools/cuda_tune.py) builds another library, not the cached one."""
    (tmp_path / "a.cu").write_text("int x;")
    monkeypatch.delenv(build.DEFINES_VAR, raising=False)
    plain = build.cache_key("sm_90", "13.0", tmp_path)
    monkeypatch.setenv(build.DEFINES_VAR, "-DFA_FWD_BN128=64 -DFA_DKDV_WARPS=8")
    assert build.cache_key("sm_90", "13.0", tmp_path) != plain
    cmd = build.compile_command("nvcc", "sm_90", tmp_path / "a.cu", "x.o")
    assert "-DFA_FWD_BN128=64" in cmd and "-DFA_DKDV_WARPS=8" in cmd


@pytest.mark.parametrize("value", ["-O0", "-DFA_X=1;rm", "-DOTHER=1", "-DFA_FWD_BN128=big"])
def test_tile_overrides_refuse_anything_but_fa_macros(monkeypatch, value):
    monkeypatch.setenv(build.DEFINES_VAR, value)
    with pytest.raises(build.BuildError, match="FAVERIFY_CUDA_DEFINES.*-DFA_NAME=INTEGER"):
        build.flags()


def test_compile_command_targets_one_architecture():
    cmd = build.compile_command("nvcc", "sm_90", build.SOURCE_DIR / "simt.cu", "x.o")
    assert "arch=compute_90,code=sm_90" in cmd and "-O3" in cmd and "--use_fast_math" not in cmd


def test_missing_nvcc_is_an_environment_error(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(build, "FALLBACK_NVCC", str(tmp_path / "nvcc"))
    with pytest.raises(build.BuildError, match="nvcc not found"):
        build.find_nvcc()


def test_gpus_before_sm80_are_refused_by_name():
    with pytest.raises(build.BuildError, match="7.5 is not supported.*sm_80"):
        build.arch((7, 5))
    assert build.arch((9, 0)) == "sm_90"


def test_a_compile_error_shows_the_compiler_output(tmp_path, cache):
    nvcc = nvcc_or_skip()
    (tmp_path / "broken.cu").write_text('extern "C" int f() { return undeclared_name; }\n')
    with pytest.raises(build.BuildError) as e:
        build.build("sm_80", tmp_path, nvcc)
    assert "compiling broken.cu for sm_80 failed" in str(e.value) and "undeclared_name" in str(e.value)
    assert not list(cache.glob("*.so"))  # nothing half-built is left for the next run to load


def test_a_build_is_cached_and_loads(tmp_path, cache, monkeypatch):
    nvcc = nvcc_or_skip()
    (tmp_path / "ok.cu").write_text('extern "C" int answer() { return 42; }\n')
    path = build.build("sm_80", tmp_path, nvcc)
    assert path.parent == cache and ctypes.CDLL(str(path)).answer() == 42
    monkeypatch.setattr(build, "_run", lambda *a: pytest.fail("a warm start must not compile"))
    assert build.build("sm_80", tmp_path, nvcc) == path


def test_cpu_tensors_are_refused_before_any_build():
    from faverify.kernels.cuda import flash_attn_func
    q = torch.randn(1, 4, 1, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match="is on cpu; these kernels take CUDA tensors"):
        flash_attn_func(q, q, q)


def test_fuzz_on_the_cpu_runs_nothing_and_says_so():
    r = cli("fuzz", "--kernel", "cuda", "--iters", "5", "--device", "cpu", "--no-db")
    assert r.exit_code == 2 and "no case ran" in r.stderr


@pytest.mark.slow
def test_every_cu_file_compiles_for_sm80_and_sm90_without_spills(capsys, cuda_compile):
    """python -m faverify.kernels.cuda.compile_report, started at collection (conftest.py)."""
    returncode, out, err = cuda_compile
    with capsys.disabled():  # registers, shared memory and spills per kernel belong in the CI log
        print("\n" + out[-30000:])
    assert returncode == 0, out[-3000:] + err[-3000:]
    assert "0 failed; 0 spill" in out


# --- the kernels, on the GPU ------------------------------------------------------------------------------



@pytest.mark.gpu
def test_fp32_is_refused_by_the_tensor_core_variant():
    from faverify.kernels.cuda import flash_attn_func
    q = torch.randn(1, 4, 1, 32, device="cuda")
    with pytest.raises(ValueError, match="float32; supported"):
        flash_attn_func(q, q, q)


@pytest.mark.gpu
def test_doctor_builds_and_passes_the_cuda_kernels(tmp_path):
    r = cli("doctor", "--json", tmp_path / "d.json")
    rows = {c["check"]: c["status"] for c in read_json(tmp_path / "d.json")["checks"] if c["device"] != "cpu"}
    assert rows.get("build: cuda") == "Pass" and rows.get("golden: cuda") == "Pass", (rows, r.stderr[-2000:])
    assert rows.get("golden: cuda-simt") == "Pass" and rows.get("determinism: cuda, 5 runs") == "Pass", rows


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FAVERIFY_CACHE", str(tmp_path))
    assert build.cache_dir() == tmp_path / "cuda"
    monkeypatch.delenv("FAVERIFY_CACHE")
    assert build.cache_dir() == type(tmp_path).home() / ".cache" / "faverify" / "cuda"


@pytest.mark.parametrize("capability,message", [
    ((9, 0), "nvcc not found"),                  # a GPU, but no CUDA toolkit
    ((7, 5), "7.5 is not supported.*sm_80"),      # a GPU too old for the kernels
])
def test_fuzz_stops_with_exit_2_when_the_kernels_cannot_build(monkeypatch, tmp_path, capability, message, cache):
    """What a user with a GPU sees: one clear line and exit 2 before any case runs, not a traceback. The
    cache is empty (the `cache` fixture): on a GPU machine a library built earlier would load without nvcc."""
    import re
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(build, "FALLBACK_NVCC", str(tmp_path / "nvcc"))
    r = cli("fuzz", "--kernel", "cuda", "--iters", "5", "--no-db")
    assert r.exit_code == 2 and re.search(message, r.stderr), r.stderr
    assert "Traceback" not in r.stderr
