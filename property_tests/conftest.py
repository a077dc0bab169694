import os

# Before numpy loads: one OpenBLAS thread, as the command line sets it (faverify/cli/__init__.py says why).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

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


@pytest.hookimpl(trylast=True)  # after -m/-k deselection: start the background compiles only when their tests run
def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
    # Compiling every Triton variant, and every .cu file, takes minutes of CPU, and the full mutants run
    # (one mutant after another, on one core) about 6: start them now, beside the rest of the suite, which
    # mostly keeps one core busy; the tests collect the results.
    names = {item.name for item in items}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if AOT_TEST in names:
        jobs = str(os.cpu_count() or 2)
        config._faverify_aot = _background(["faverify.kernels.triton.build.aot", "--jobs", jobs], env)
    if CUDA_COMPILE_TEST in names:
        config._faverify_cuda = _background(["faverify.kernels.cuda.compile_report"], env)
    if MUTANTS_TEST in names:
        import tempfile
        folder = tempfile.mkdtemp(prefix="faverify-mutants-")
        config._faverify_mutants_json = os.path.join(folder, "mutants.json")
        config._faverify_mutants = _background(
            ["faverify", "mutants", *MUTANTS_ARGS, "--device", "cuda" if HAS_GPU else "cpu",
             "--json", config._faverify_mutants_json], dict(os.environ), cwd=folder)


def pytest_unconfigure(config):
    """A background run whose test did not collect it (the session stopped first) ends with the session."""
    for attribute in ("_faverify_aot", "_faverify_cuda", "_faverify_mutants"):
        proc = getattr(config, attribute, None)
        if proc is not None and proc.poll() is None:
            import signal
            os.killpg(proc.pid, signal.SIGKILL)  # its worker processes too: it leads a session of its own
            proc.wait()


def _background(module_args: list, env: dict, cwd: str | None = None):
    """The module run in a session of its own, its output into files: a pipe nobody reads until the test
    collects it would stall a run that prints more than the pipe holds."""
    import subprocess
    import sys
    import tempfile
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-m", *module_args], stdout=out, stderr=err, text=True, env=env,
                            cwd=cwd, start_new_session=True)
    proc.files = (out, err)
    return proc


def _collect(request, attribute: str, what: str):
    proc = getattr(request.config, attribute, None)
    assert proc is not None, f"the {what} was not started at collection"
    proc.wait(timeout=1800)
    texts = []
    for f in proc.files:
        f.seek(0)
        texts.append(f.read())
    return proc.returncode, *texts


@pytest.fixture
def aot_compile(request):
    """(returncode, stdout, stderr) of the Triton AOT compile started at collection."""
    return _collect(request, "_faverify_aot", "Triton AOT compile")


@pytest.fixture
def cuda_compile(request):
    """(returncode, stdout, stderr) of the CUDA compile report started at collection."""
    return _collect(request, "_faverify_cuda", "CUDA compile report")


@pytest.fixture
def mutants_run(request):
    """(returncode, stdout, stderr, path of its JSON report) of the full mutants run started at collection."""
    return (*_collect(request, "_faverify_mutants", "full mutants run"), request.config._faverify_mutants_json)


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
