"""The environment a run's numbers depend on: printed above every report and stored in its JSON."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

import torch

# Variables that change what a kernel computes or which kernel runs.
NUMERICS_VARIABLES = (
    "TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION", "TRITON_F32_DEFAULT", "TRITON_CACHE_DIR",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "TORCH_CUDNN_V8_API_DISABLED",
)


def _version(module: str) -> str:
    """The installed version, read from the package's metadata: importing triton here, before the
    `triton` subject chooses the interpreter on a machine without a GPU (kernels/triton/subject.py), would
    fix triton in compiled mode for this process, and the kernels would then fail to run at all."""
    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return "not installed"


def _command(*args: str) -> str:
    if not shutil.which(args[0]):
        return "not found"
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=20)
        return (out.stdout or out.stderr).strip() or "no output"
    except Exception as e:  # a hung or broken tool is reported, never fatal
        return f"failed: {e}"


def nvcc_version() -> str:
    text = _command("nvcc", "--version")
    for line in text.splitlines():
        if "release" in line:
            return line.split("release", 1)[1].strip().split(",")[0]
    return text.splitlines()[-1] if text else "not found"


def gpus() -> list:
    out = []
    if not torch.cuda.is_available():
        return out
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                    "memory_gib": round(p.total_memory / 2**30, 1), "multiprocessors": p.multi_processor_count})
    return out


def driver_version() -> str:
    if not torch.cuda.is_available():
        return "no GPU"
    text = _command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    return text.splitlines()[0] if text and not text.startswith(("not found", "failed")) else text


def collect(*, quick: bool = False) -> dict:
    """quick skips external commands (nvcc, nvidia-smi), for the per-worker headers."""
    env = {
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda or "cpu build",
        "triton": _version("triton"),
        "hypothesis": _version("hypothesis"),
        "gpus": gpus(),
        "variables": {k: os.environ[k] for k in NUMERICS_VARIABLES if k in os.environ},
        "torch_flags": {
            "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "matmul.allow_fp16_reduced_precision_reduction":
                torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            "matmul.allow_bf16_reduced_precision_reduction":
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        },
    }
    if not quick:
        env["driver"] = driver_version()
        env["nvcc"] = nvcc_version()
    return env


def header_lines(env: dict) -> list:
    gpu = "; ".join(f"cuda:{g['index']} {g['name']} (sm {g['capability']}, {g['memory_gib']} GiB)"
                    for g in env.get("gpus", [])) or "none"
    variables = ", ".join(f"{k}={v}" for k, v in env.get("variables", {}).items()) or "none set"
    flags = ", ".join(f"{k}={v}" for k, v in env.get("torch_flags", {}).items())
    return [
        f"platform: {env.get('os')}, python {env.get('python')}",
        f"torch {env.get('torch')} ({_cuda_build(env.get('torch_cuda'))}), triton {env.get('triton')}, "
        f"hypothesis {env.get('hypothesis')}, driver {env.get('driver', '?')}, nvcc {env.get('nvcc', '?')}",
        f"GPUs: {gpu}",
        f"numerics variables: {variables}",
        f"torch flags: {flags}",
    ]


def _cuda_build(version) -> str:
    return "a CPU build, no CUDA" if version in (None, "cpu build") else f"built for CUDA {version}"
