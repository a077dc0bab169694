"""Seconds Triton spends compiling, or loading from its on-disk cache, the kernels a case launches: the
Triton subjects' "compile" and "load" phases (Subject.compile_seconds), which the evaluation reports apart from
the kernels' own time. A build the warm-up missed shows as compile: it compiles in every GPU worker that
meets it first. A build the warm-up made shows as load, once per worker. Triton's compile hooks time both;
its compilation listener, called inside the compile, says which one it was (cache_hit). The interpreter
compiles nothing, so there both stay 0."""
from __future__ import annotations

import time

_started: list = []  # when the compile in progress began (hooks fire around each compile, in this thread)
_hit: list = [False]  # whether Triton's cache held the build in progress (its listener says)
_spent = {"compile": 0.0, "load": 0.0}


def _before(**_) -> None:
    _started.append(time.perf_counter())
    _hit[0] = False  # a compile that never reaches the listener counts as a compile
    return None  # None: Triton goes on to compile (a true value would skip the compile)


def _listen(*, cache_hit: bool = False, **_) -> None:
    _hit[0] = bool(cache_hit)


def _after(**_) -> None:
    if _started:
        _spent["load" if _hit[0] else "compile"] += time.perf_counter() - _started.pop()
        _hit[0] = False
    return None


def install() -> None:
    """Set Triton's compile hooks and its compilation listener, unless something else has set its own."""
    from triton import knobs
    runtime = knobs.runtime
    if runtime.jit_cache_hook in (None, _before) and runtime.jit_post_compile_hook in (None, _after):
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = _before, _after
        if knobs.compilation.listener in (None, _listen):
            knobs.compilation.listener = _listen


def take() -> dict:
    """The seconds spent since the last take, by phase: {"compile": ..., "load": ...}, the nonzero ones."""
    spent = {phase: seconds for phase, seconds in _spent.items() if seconds}
    for phase in _spent:
        _spent[phase] = 0.0
    return spent
