"""--device auto|cpu|cuda[:i]|all -> the torch devices a run uses."""
from __future__ import annotations

import torch

from faverify.errors import EnvironmentProblem, UsageError


def resolve(text: str) -> list:
    if text is None:
        text = "auto"
    text = text.strip().lower()
    if not text:
        raise UsageError("--device", text, "must be auto, cpu, cuda, cuda:INDEX or all (it is empty)")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if text == "auto":
        return [torch.device("cuda:0")] if n else [torch.device("cpu")]
    if text == "cpu":
        return [torch.device("cpu")]
    if text == "all":
        if not n:
            raise EnvironmentProblem("--device all: no CUDA GPU is visible (torch.cuda.is_available() is False)")
        return [torch.device(f"cuda:{i}") for i in range(n)]
    if text == "cuda" or text.startswith("cuda:"):
        index = text.partition(":")[2] or "0"
        if not index.isdigit():
            raise UsageError("--device", text, "must be auto, cpu, cuda, cuda:INDEX or all")
        if not n:
            raise EnvironmentProblem(f"--device {text}: no CUDA GPU is visible (torch.cuda.is_available() is False)")
        if int(index) >= n:
            raise UsageError("--device", text, f"GPU index must be < {n} (the GPUs this process sees)")
        return [torch.device(f"cuda:{index}")]
    raise UsageError("--device", text, "must be auto, cpu, cuda, cuda:INDEX or all")


def default_workers(device: torch.device) -> int:
    """Worker processes per device for a fuzz: one on the CPU (the cases are compute-bound there), six per
    GPU, where a case is bound by kernel launches and the host's Python, not by the GPU."""
    return 1 if device.type == "cpu" else 6
