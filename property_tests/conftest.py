import os

# Before numpy loads: one OpenBLAS thread, as the command line sets it (faverify/cli/__init__.py says why).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from property_tests import background  # noqa: E402

# CPU runs of the Triton kernels go through the interpreter; set before anything imports triton.
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
# One CPU thread per torch, here and in the worker processes the tests spawn (they inherit the variable):
# the suite's cases are small, and the background compiles below keep both cores of a CI machine busy,
# where a second thread per process only contends for them.
if not torch.cuda.is_available():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

settings.register_profile("faverify", deadline=None, max_examples=25,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("faverify")

HAS_GPU = torch.cuda.is_available()


AOT_TEST = "test_every_variant_compiles_for_sm80_and_sm90"
CUDA_COMPILE_TEST = "test_every_cu_file_compiles_for_sm80_and_sm90_without_spills"
MUTANTS_TEST = "test_every_mutant_is_killed_and_the_control_passes"
# test_mutants.py's full run (its docstring says why these settings), in a folder of its own
MUTANTS_ARGS = ["--iters", "100", "--control-iters", "20", "--shrink-budget", "1", "--workers", "2"]


def pytest_configure(config):
    config._faverify_owns_background = background.open_session()


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: start the background runs only when their tests run
def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
    # Compiling every Triton variant, and every .cu file, takes minutes of CPU, and so does the full mutants
    # run: start them now, beside the rest of the suite; the tests that collect their results run last, so
    # that no test process waits on them while other tests are left.
    names = {item.name for item in items}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if AOT_TEST in names:
        background.start("aot", ["faverify.kernels.triton.build.aot", "--jobs", str(os.cpu_count() or 2)], env)
    if CUDA_COMPILE_TEST in names:
        background.start("cuda", ["faverify.kernels.cuda.compile_report"], env)
    if MUTANTS_TEST in names:
        cwd = os.path.join(background.folder(), "mutants")
        os.makedirs(cwd, exist_ok=True)
        background.start("mutants", ["faverify", "mutants", *MUTANTS_ARGS, "--device", "cuda" if HAS_GPU else "cpu",
                                     "--json", os.path.join(cwd, "mutants.json")], dict(os.environ), cwd=cwd)
    items.sort(key=lambda item: item.name in (AOT_TEST, CUDA_COMPILE_TEST, MUTANTS_TEST))


def pytest_unconfigure(config):
    """A background run no test collected (the session stopped first) ends with the session."""
    if getattr(config, "_faverify_owns_background", False):
        background.close_session()


@pytest.fixture
def aot_compile():
    """(returncode, stdout, stderr) of the Triton AOT compile started at collection."""
    return background.collect("aot", "Triton AOT compile")


@pytest.fixture
def cuda_compile():
    """(returncode, stdout, stderr) of the CUDA compile report started at collection."""
    return background.collect("cuda", "CUDA compile report")


@pytest.fixture
def mutants_run():
    """(returncode, stdout, stderr, path of its JSON report) of the full mutants run started at collection."""
    return (*background.collect("mutants", "full mutants run"),
            os.path.join(background.folder(), "mutants", "mutants.json"))


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
