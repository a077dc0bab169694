"""Build the CUDA kernels with nvcc into one shared library per GPU architecture, cached on disk, and load
it with ctypes.

No torch C++ extension: torch's headers made even a trivial kernel take 52 s to build on the H200, and a
plain C ABI (extern "C" launchers taking raw pointers) cannot mismatch torch's C++ ABI. The cache key is the
sources' hash, nvcc's version, the architecture and the flags: any of them changing rebuilds.

Every way this can fail (no nvcc, a compile error, a GPU older than sm_80) raises EnvironmentProblem with
the reason, which the command line turns into exit code 2.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from faverify.errors import EnvironmentProblem

SOURCE_DIR = Path(__file__).resolve().parent
FALLBACK_NVCC = "/usr/local/cuda/bin/nvcc"
MIN_CAPABILITY = (8, 0)  # mma.sync m16n8k16 on bf16, ldmatrix and cp.async need Ampere or newer
FLAGS = ("-std=c++17", "-O3", "-Xcompiler", "-fPIC")
DEFINES_VAR = "FAVERIFY_CUDA_DEFINES"  # tile overrides for tuning runs, e.g. "-DFA_FWD_BN128=64"
_DEFINE = re.compile(r"-DFA_[A-Z0-9_]+=\d+")
_LOADED: dict = {}
_LOCK = threading.Lock()


class BuildError(EnvironmentProblem):
    """nvcc missing or failing: the message carries the command and the compiler's output."""


def sources(root: Path = SOURCE_DIR) -> list:
    return sorted(root.glob("*.cu"))


def headers(root: Path = SOURCE_DIR) -> list:
    return sorted(root.glob("*.cuh"))


def find_nvcc() -> str:
    """nvcc from $CUDA_HOME/bin, then PATH, then /usr/local/cuda/bin."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"))
    candidates += [shutil.which("nvcc") or "", FALLBACK_NVCC]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise BuildError("nvcc not found (looked in $CUDA_HOME/bin, PATH, /usr/local/cuda/bin): the CUDA kernels are "
                     "compiled on first use; install the CUDA toolkit or set CUDA_HOME")


def nvcc_version(nvcc: str) -> str:
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"{nvcc} --version failed: {e}") from e
    found = re.search(r"release (\d+\.\d+)", text)
    if not found:
        raise BuildError(f"cannot read the version from `{nvcc} --version`: {text.strip()[:200]!r}")
    return found.group(1)


def arch(capability: tuple) -> str:
    """sm_XY for a compute capability; EnvironmentProblem below sm_80."""
    if tuple(capability) < MIN_CAPABILITY:
        raise BuildError(f"GPU compute capability {capability[0]}.{capability[1]} is not supported by the CUDA "
                         f"kernels: they need sm_80 or newer (mma.sync on bf16, ldmatrix, cp.async)")
    return f"sm_{capability[0]}{capability[1]}"


def defines() -> tuple:
    """The tile overrides of $FAVERIFY_CUDA_DEFINES (the kernels' FA_* macros with integer values); any other
    token is refused, so the variable cannot smuggle arbitrary compiler flags into a cached library."""
    tokens = tuple(os.environ.get(DEFINES_VAR, "").split())
    bad = [t for t in tokens if not _DEFINE.fullmatch(t)]
    if bad:
        raise BuildError(f"{DEFINES_VAR}={os.environ[DEFINES_VAR]!r}: {bad[0]!r} is not of the form "
                         f"-DFA_NAME=INTEGER (the tile overrides the kernels read)")
    return tokens


def flags() -> tuple:
    return FLAGS + defines()


def cache_key(sm: str, version: str, root: Path = SOURCE_DIR) -> str:
    h = hashlib.sha256()
    for path in sources(root) + headers(root):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(f"{version}\0{sm}\0{' '.join(flags())}".encode())
    return h.hexdigest()[:20]


def cache_dir() -> Path:
    return Path(os.environ.get("FAVERIFY_CACHE") or Path.home() / ".cache" / "faverify") / "cuda"


def compile_command(nvcc: str, sm: str, source: Path, output: Path, extra: tuple = ()) -> list:
    gencode = f"arch=compute_{sm[3:]},code={sm}"
    return [nvcc, *flags(), "-gencode", gencode, *extra, "-c", str(source), "-o", str(output)]


def link_command(nvcc: str, objects: list, output: Path) -> list:
    return [nvcc, "-shared", *map(str, objects), "-o", str(output)]


def _run(command: list, what: str) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"{what}: {' '.join(command)} could not run: {e}") from e
    if done.returncode != 0:
        raise BuildError(f"{what} failed (exit {done.returncode}): {' '.join(command)}\n"
                         f"{(done.stdout + done.stderr).strip()}")
    return done.stdout + done.stderr


def build(sm: str, root: Path = SOURCE_DIR, nvcc: str | None = None) -> Path:
    """The shared library for `sm`, from the cache or built now (each .cu compiled in parallel, then linked)."""
    nvcc = nvcc or find_nvcc()
    target = cache_dir() / f"faverify_cuda_{sm}_{cache_key(sm, nvcc_version(nvcc), root)}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [Path(tmp) / (src.stem + ".o") for src in sources(root)]
        with ThreadPoolExecutor(max_workers=max(1, len(objects))) as pool:
            list(pool.map(lambda so: _run(compile_command(nvcc, sm, *so), f"compiling {so[0].name} for {sm}"),
                          zip(sources(root), objects)))
        partial = Path(tmp) / target.name
        _run(link_command(nvcc, objects, partial), "linking the CUDA kernels")
        os.replace(partial, target)  # atomic: a concurrent builder or reader never sees half a library
    return target


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i, s = ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p
    for name, args in (("fa_simt_fwd", (p, i, i, s)), ("fa_mma_fwd", (p, i, i, s)), ("fa_simt_bwd", (p, i, s)),
                       ("fa_mma_bwd", (p, i, s)), ("fa_delta", (p, i, s))):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = list(args), ctypes.c_int
    lib.fa_error_string.argtypes, lib.fa_error_string.restype = [ctypes.c_int], ctypes.c_char_p
    lib.fa_params_size.argtypes, lib.fa_params_size.restype = [], ctypes.c_int
    return lib


def load(capability: tuple) -> ctypes.CDLL:
    """The library for a GPU of this compute capability, built once per process and architecture."""
    sm = arch(capability)
    with _LOCK:
        if sm not in _LOADED:
            _LOADED[sm] = _declare(ctypes.CDLL(str(build(sm))))
        return _LOADED[sm]
