"""The GPU the Triton launchers decide for: the one their tensors are on, or a GPU named while the builds a
fuzz needs are listed on a machine that may have none (build/builds.py). The launchers choose their paths and
tiles by the compute capability (TMA from sm_90, the Hopper kernels on sm_90 alone) and split a paged decode
by the SM count. Under a named target the tensors are the CPU's and no kernel runs: Triton's cache hook
(build/builds.py) takes each launch before it compiles, so nothing a kernel computes depends on the name."""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import torch

from faverify.kernels.triton.common import INTERPRET


@dataclass(frozen=True)
class Target:
    major: int
    minor: int
    sms: int  # streaming multiprocessors: a paged decode's split count fills them (interface.num_splits_for)

    @property
    def name(self) -> str:
        return f"sm_{self.major}{self.minor}"

    @property
    def capability(self) -> int:
        """Triton's number for it (GPUTarget's arch): 90 for sm_90."""
        return self.major * 10 + self.minor


def parse(text: str, sms: int = 132) -> Target:
    """A target from its name, sm_90 or 90 (sm_90a is sm_90: Triton compiles every sm_90 build as sm_90a);
    ValueError naming the rule otherwise. sms: only a paged decode asked for num_splits=0 reads it (the fuzz
    passes each case's own split count), the H100's and H200's 132 by default."""
    m = re.fullmatch(r"(?:sm_?)?(\d)(\d)a?", text.strip().lower())
    if m is None:
        raise ValueError("a compute capability such as sm_90, sm_80 or 90")
    major, minor = int(m.group(1)), int(m.group(2))
    return Target(major, minor, sms)


def of_device(device) -> Target:
    """The target of a CUDA device (this initializes CUDA in the calling process)."""
    device = torch.device(device)
    major, minor = torch.cuda.get_device_capability(device)
    return Target(major, minor, torch.cuda.get_device_properties(device).multi_processor_count)


_NAMED: list = []  # the target named while builds are listed (named), innermost last


def capability(device) -> tuple:
    """(major, minor) the launchers decide for: the named target's, a CUDA device's own, or sm_90's on the
    CPU (the interpreter, whose tiles are its own whatever the capability)."""
    if _NAMED:
        return _NAMED[-1].major, _NAMED[-1].minor
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_capability(device)
    return 9, 0


def sm_count(device) -> int:
    """The SMs num_splits_for fills: the named target's, the GPU's, or 8 under the interpreter (the CPU)."""
    if _NAMED:
        return _NAMED[-1].sms
    device = torch.device(device)
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8


def cpu_tensors() -> bool:
    """Whether the launchers take CPU tensors: under the interpreter, or while a target is named."""
    return INTERPRET or bool(_NAMED)


@contextlib.contextmanager
def named(target: Target):
    """Decide every launch for `target` while the block runs (builds.listing sets it with Triton's driver)."""
    _NAMED.append(target)
    try:
        yield target
    finally:
        _NAMED.pop()
