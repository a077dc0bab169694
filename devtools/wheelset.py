"""Fetch the wheels a kernel library needs on the lent GPU machine (which has no network), and cut them into
loads that fit one device call (64 MiB carried per call, the working tree included: 14 MiB of this
repository's files, hence loads of 48 MiB).

    python3 devtools/wheelset.py flash-attn-4==4.0.0b36 [--extra cu13 --without nvidia-cutlass-dsl-libs-cu12]
                                 [--dir .whl] [--load-mib 48]

--extra takes the requirements each wheel declares under that extra too (flash-attn-4's cu13: the CuTe DSL
built for CUDA 13, the GPU image's torch being a CUDA 13 build); --without leaves a package out of the set
(nvidia-cutlass-dsl requires its CUDA 12 libraries whatever the extra; installed with --no-deps, the CUDA
13 ones alone serve).

What it does: downloads the package and, following each wheel's Requires-Dist, every dependency the GPU
image lacks (IMAGE: the packages its python3 holds, as the lending service lists them), as wheels for
CPython 3.12 on manylinux x86-64, into --dir (ignored by git: `echo /.whl/ >> .git/info/exclude`). Then
it splits the set into loads of at most --load-mib MiB: whole wheels where they fit, and a wheel larger
than a load into numbered parts (NAME.whl.part0, .part1, ...), each load in a folder of its own,
DIR/load0, DIR/load1, ... Call k names DIR/loadK in its `carry` (a carried path replaces that path on the
machine, and ignored paths not named stay there while the machine is warm, so the loads of earlier calls
wait there); the last call then runs:

    cat .whl/load*/NAME.whl.part* > .whl/NAME.whl   (for each split wheel, parts in order)
    python3 -m pip install -q --no-index --no-deps --no-compile --target .whl/site .whl/load*/*.whl .whl/*.whl
    export PYTHONPATH=$PWD/.whl/site:$(python3 devtools/wheelset.py --pth-dirs .whl/site)

(an ignored folder of the checkout, which stays on the warm machine between calls). A --target install runs
no .pth file, and the CuTe DSL finds its `cutlass` package through one (nvidia_cutlass_dsl_packages.pth adds
nvidia_cutlass_dsl/dsl_packages to sys.path): --pth-dirs prints the folders the site's .pth files add,
":"-joined. flash-attn-4 4.0.0b36 with --extra cu13 ran on the H200 so (2026-12-04): its three loads in two
calls, load0 and then load1 with load2 (49.4 MiB beside the 13.6 MiB checkout).

Nothing of the libraries is committed; this recipe is how anyone repeats the set. For flash-attn-4
4.0.0b36 with --extra cu13 (2026-12-04): 9 wheels, 97.4 MiB, the largest nvidia-cutlass-dsl-libs-cu13
(87.7 MiB, split);
flashinfer-python 0.7.4: 11 wheels, 228.3 MiB in 5 loads (its own wheel 96.6 MiB, split in three); for its
attention alone, 3 wheels, 40.7 MiB, one load:

    python3 devtools/wheelset.py flashinfer-python==0.7.4 --trim --without nvidia-cutlass-dsl \
        --without nccl-extensions --without nccl4py --without nvidia-cudnn-frontend

--trim sheds the JIT sources of its other kernels (TRIMS; 96.6 -> 37.1 MiB), and the four left out are
imported by none of `import flashinfer`'s modules (checked on the CPU, 2026-12-04: Python 3.11 with the
cp311 apache-tvm-ffi and the image's other packages; every source file its attention JIT modules name is
in the trimmed wheel). Not yet run on a GPU.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import zipfile

# What the GPU image's python3 already holds (the lending service's list of its Python packages, read 2026-11-17),
# by normalized name: a dependency among them is not fetched
IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless
optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson
six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision
tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
wheel wrapt xarray xxhash yarl zipp""".split()) | {"cuda-python"}  # a meta-package over cuda-bindings
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(wheel: str, extras=()) -> list:
    """The Requires-Dist of a wheel that apply without extras or under one of `extras`: [(name, spec)]."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        marker = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", req)
        if marker and marker.group(1) not in extras:
            continue
        req = req.split(";")[0].strip()
        name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
        out.append((name, req[len(name):].strip()))
    return out


def download(spec: str, folder: str) -> str:
    before = set(os.listdir(folder))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--pre",
           "--python-version", "3.12", "--implementation", "cp", "-d", folder, spec]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd, check=True)
    new = sorted(set(os.listdir(folder)) - before)
    if new:
        return os.path.join(folder, new[0])
    # already there: the wheel of that name
    base = normalize(re.match(r"[A-Za-z0-9_.\-]+", spec).group(0)).replace("-", "_")
    return next(os.path.join(folder, f) for f in os.listdir(folder) if normalize(f).replace("-", "_").startswith(base))


def closure(root: str, folder: str, extras=(), without=()) -> list:
    """Download root and every dependency the image lacks (under `extras` too, but for `without`); the wheels,
    in download order."""
    todo, seen, wheels = [root], {normalize(n) for n in without}, []
    while todo:
        spec = todo.pop(0)
        name = normalize(re.match(r"[A-Za-z0-9_.\-]+", spec).group(0))
        if name in seen or name in IMAGE:
            continue
        seen.add(name)
        wheel = download(re.sub(r"\[[^\]]*\]", "", spec.replace(" ", "")), folder)
        wheels.append(wheel)
        todo += [n + s for n, s in requirements(wheel, extras)]
    return wheels


def _flashinfer_other_sources(name: str) -> bool:
    """FlashInfer's files its attention never reads: the JIT sources of its other kernels (the subfolders of
    data/csrc: MoE, GEMM, sampling, ...; each package's csrc/ and kernel_src/; experimental/). Its attention
    JIT modules (flashinfer/jit/attention/modules.py) name only top-level files of data/csrc, and data/include,
    data/cutlass and data/cccl stay."""
    parts = name.split("/")
    if parts[:3] == ["flashinfer", "data", "csrc"]:
        return len(parts) > 4
    if parts[:2] == ["flashinfer", "data"]:
        return False
    return parts[:2] == ["flashinfer", "experimental"] or any(d in ("csrc", "kernel_src") for d in parts[:-1])


# --trim: the files a package's wheel sheds, by normalized package name (Python files and metadata always stay)
TRIMS = {"flashinfer-python": _flashinfer_other_sources}


def trim(wheel: str) -> str:
    """The wheel without the files its TRIMS rule drops, its RECORD rewritten to what stays (pip checks each
    installed file against it)."""
    import base64
    import hashlib
    rule = TRIMS.get(normalize(re.match(r"[A-Za-z0-9_.]+?(?=-\d)", os.path.basename(wheel)).group(0)))
    if rule is None:
        return wheel
    out = wheel + ".trimmed"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        record, rows = None, []
        for info in src.infolist():
            name = info.filename
            if name.endswith(".dist-info/RECORD"):
                record = name
                continue
            if not name.endswith(".py") and ".dist-info/" not in name and rule(name):
                continue
            data = src.read(name)
            dst.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{name},sha256={digest},{len(data)}")
        dst.writestr(record, "\n".join(rows + [f"{record},,"]) + "\n")
    os.replace(out, wheel)
    return wheel


def loads(wheels: list, limit: int) -> list:
    """Files per call: wheels packed first-fit, each wheel past the limit split into parts of it."""
    files = []
    for w in sorted(wheels, key=os.path.getsize, reverse=True):
        size = os.path.getsize(w)
        if size <= limit:
            files.append((w, size))
            continue
        with open(w, "rb") as f:
            for i, chunk in enumerate(iter(lambda: f.read(limit), b"")):
                part = f"{w}.part{i}"
                with open(part, "wb") as g:
                    g.write(chunk)
                files.append((part, len(chunk)))
        os.remove(w)
    bins: list = []
    for path, size in files:
        for b in bins:
            if b[0] + size <= limit:
                b[0] += size
                b[1].append(path)
                break
        else:
            bins.append([size, [path]])
    return [b[1] for b in bins]


def pth_dirs(site: str) -> list:
    """The folders the .pth files of a --target install would add to sys.path: each line naming a folder
    under the site, or a line of code that appends a folder joined from a package's path (the CuTe DSL's
    form: os.path.join(PACKAGE.__path__[0], 'FOLDER')), resolved against the site."""
    out = []
    for name in sorted(os.listdir(site)):
        if not name.endswith(".pth"):
            continue
        for line in open(os.path.join(site, name)):
            line = line.strip()
            joined = re.search(r"os\.path\.join\((\w+)\.__path__\[0\],\s*['\"]([^'\"]+)['\"]\)", line)
            folder = os.path.join(site, joined.group(1), joined.group(2)) if joined else \
                os.path.join(site, line) if line and not line.startswith(("#", "import")) else None
            if folder and os.path.isdir(folder):
                out.append(os.path.abspath(folder))
    return out


def main() -> int:
    if sys.argv[1:2] == ["--pth-dirs"]:
        print(":".join(pth_dirs(sys.argv[2])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("package", help="NAME==VERSION")
    p.add_argument("--dir", default=".whl")
    p.add_argument("--load-mib", type=int, default=48)
    p.add_argument("--extra", action="append", default=[], help="also the requirements under this extra")
    p.add_argument("--without", action="append", default=[], help="a package left out of the set")
    p.add_argument("--trim", action="store_true",
                   help="shed the files TRIMS names (FlashInfer's other kernels' sources)")
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    wheels = closure(a.package, a.dir, tuple(a.extra), tuple(a.without))
    if a.trim:
        wheels = [trim(w) for w in wheels]
    for w in wheels:
        print(f"{os.path.getsize(w) / 2**20:8.1f} MiB  {os.path.basename(w)}")
    groups = loads(wheels, a.load_mib << 20)
    total = sum(os.path.getsize(x) for g in groups for x in g) / 2**20
    for i, g in enumerate(groups):
        folder = os.path.join(a.dir, f"load{i}")
        os.makedirs(folder, exist_ok=True)
        for x in g:
            os.replace(x, os.path.join(folder, os.path.basename(x)))
        print(f"{folder}: " + " ".join(os.path.basename(x) for x in g))
    print(f"{len(wheels)} wheels, {total:.1f} MiB, in {len(groups)} loads of at most {a.load_mib} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
