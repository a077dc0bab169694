"""Seconds Triton spends compiling (or loading from its cache) the kernels a case launches: the Triton
subjects' "compile" phase (Subject.compile_seconds), which the runner reports apart from the kernels' own
time. On a GPU fuzz it is how a build the warm-up missed shows in the report: each one compiles in every
worker that meets it first. The interpreter compiles nothing, so there it stays 0."""
from __future__ import annotations

import time

_started: list = []  # when the compile in progress began (hooks fire around each compile, in this thread)
_spent = [0.0]


def _before(**_) -> None:
    _started.append(time.perf_counter())
    return None  # None: Triton goes on to compile (a true value would skip the compile)


def _after(**_) -> None:
    if _started:
        _spent[0] += time.perf_counter() - _started.pop()
    return None


def install() -> None:
    """Set Triton's compile hooks, unless something else has set its own."""
    from triton import knobs
    runtime = knobs.runtime
    if runtime.jit_cache_hook in (None, _before) and runtime.jit_post_compile_hook in (None, _after):
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = _before, _after


def take() -> float:
    """The seconds spent since the last take."""
    spent, _spent[0] = _spent[0], 0.0
    return spent
