"""faverify installed from its wheel, outside the source tree: what a user who runs `pip install faverify`
gets must find its golden files, its kernels' sources (mutants copy them, nvcc builds them) and its
version, from any directory."""
import subprocess
import sys
from pathlib import Path

import pytest

from faverify.cases.golden_files import CASES
from faverify.subjects.registry import LIBRARIES

ROOT = Path(__file__).resolve().parent.parent


def _run(args, cwd, timeout=600):
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with the wheel built from this checkout, and a working directory far from the clone.

    The wheel goes in with --no-deps; its dependencies (torch, triton, ...) come from this test's own
    environment through a .pth line, which puts that site-packages on the path without running its .pth
    files: the editable install of the clone stays inactive there, so `import faverify` can only find the
    wheel's copy (the first test checks it). Installing torch again would add a minute to CI for nothing
    the wheel does."""
    import sysconfig
    base = tmp_path_factory.mktemp("wheel")
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                  base / "dist", ROOT], cwd=base)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((base / "dist").glob("faverify-*.whl"))
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", venv], cwd=base)
    assert made.returncode == 0, made.stderr
    pip = _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", wheel], cwd=base, timeout=600)
    assert pip.returncode == 0, pip.stderr[-3000:]
    site = _run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=base).stdout.strip()
    (Path(site) / "faverify-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    return venv / "bin", elsewhere


@pytest.mark.slow
def test_the_wheel_imports_from_its_venv_not_the_clone(installed):
    bin_dir, elsewhere = installed
    r = _run([bin_dir / "python", "-c", "import faverify, faverify.kernels.triton.dense.forward as f; "
              "print(faverify.__file__); print(f.__file__)"], cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert all(str(bin_dir.parent) in line and str(ROOT) not in line for line in r.stdout.split()), r.stdout
    r = _run([bin_dir / "faverify", "--version"], cwd=elsewhere)
    assert r.returncode == 0 and r.stdout.startswith("faverify "), r.stdout + r.stderr


def test_the_packages_list_names_every_package_of_the_clone():
    """pyproject.toml lists the packages one by one. setuptools puts a package left out of the list in the
    wheel only as data files, with a warning that it will leave it out: every folder of faverify/ and
    kernels/ with an __init__.py must be listed (a new kernel family's too)."""
    import re
    text = (ROOT / "pyproject.toml").read_text()
    start = text.index("packages = [")
    listed = set(re.findall(r'"([\w.]+)"', text[start:text.index("]", start)]))
    found = {".".join(("faverify", *p.parent.relative_to(ROOT / "faverify").parts)) for p in
             (ROOT / "faverify").rglob("__init__.py")} | {
        ".".join(("faverify", "kernels", *p.parent.relative_to(ROOT / "kernels").parts)) for p in
        (ROOT / "kernels").rglob("__init__.py")}
    assert "faverify.kernels.triton.dense" in found and found <= listed, sorted(found - listed)


@pytest.mark.slow
def test_golden_verify_and_kernels_from_the_wheel(installed):
    bin_dir, elsewhere = installed
    r = _run([bin_dir / "faverify", "golden", "verify", "--kernel", "sdpa-math", "--device", "cpu"], cwd=elsewhere)
    lse = sum(1 for c in CASES.values() if c.lse_grad != "off")  # SDPA returns no lse: those are skipped
    assert r.returncode == 0 and f"{len(CASES) - lse} of {len(CASES)} golden cases pass, 0 fail, {lse} skipped" \
        in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    r = _run([bin_dir / "faverify", "kernels"], cwd=elsewhere)
    # every subject faverify ships loads from the wheel (the library adapters need their own packages)
    unavailable = [line.split()[0] for line in r.stdout.splitlines() if " unavailable " in line]
    assert r.returncode == 0 and "triton" in r.stdout and set(unavailable) <= set(LIBRARIES), \
        r.stdout + r.stderr


@pytest.mark.slow
def test_mutants_and_the_cuda_sources_from_the_wheel(installed):
    """mutants copy the installed Triton kernels' files (every mutant's source builds from them); the nvcc
    build compiles the installed .cu files."""
    bin_dir, elsewhere = installed
    r = _run([bin_dir / "python", "-c", "from faverify.kernels.mutants.build import KERNELS, source; "
              "from faverify.kernels.mutants.catalog import MUTANTS; [source(m) for m in MUTANTS]; print(KERNELS)"],
             cwd=elsewhere)
    assert r.returncode == 0 and str(bin_dir.parent) in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    r = _run([bin_dir / "python", "-c", "from faverify.kernels.cuda import build; "
              "print(sorted(p.name for p in build.SOURCE_DIR.glob('*.cu*')))"], cwd=elsewhere)
    assert r.returncode == 0 and "mma_fwd.cu" in r.stdout and "common.cuh" in r.stdout, r.stdout + r.stderr
