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


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)


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
