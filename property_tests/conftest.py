import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# CPU runs of the Triton kernels go through the interpreter; set before anything imports triton.
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

settings.register_profile("faverify", deadline=None, max_examples=25,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("faverify")

HAS_GPU = torch.cuda.is_available()


AOT_TEST = "test_every_variant_compiles_for_sm80_and_sm90"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
    if any(item.name == AOT_TEST for item in items):
        # Compiling every Triton variant takes minutes of CPU: start it now, beside the rest of the suite;
        # the test collects the result.
        import subprocess
        import sys
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        config._faverify_aot = subprocess.Popen(
            [sys.executable, "-m", "faverify.kernels.triton.aot", "--jobs", str(os.cpu_count() or 2)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.fixture
def aot_compile(request):
    """(returncode, stdout, stderr) of the AOT compile started at collection."""
    proc = getattr(request.config, "_faverify_aot", None)
    assert proc is not None, "the AOT compile was not started at collection"
    out, err = proc.communicate(timeout=1800)
    return proc.returncode, out, err


@pytest.fixture
def device():
    return torch.device("cuda" if HAS_GPU else "cpu")


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path, monkeypatch, request):
    """Commands write .faverify/ into the working directory: keep each test's in its own folder, with
    the repository importable (the planted subjects live in property_tests)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(root)
