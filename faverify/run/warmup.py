"""Compiling before the cases (docs/design.md, "The orchestration").

A JIT subject's warm-up cases (Subject.warmup) need every build the draw can reach. For the bundled Triton
kernels those builds are listed and compiled in a process of their own (precompile.py), across every core
and into Triton's on-disk cache, while the workers start and the draw begins: each build once, for the GPU
the run is on or one named (`faverify warmup --target sm_90`, on any machine). The workers then only load.
A warm-up case whose builds could not be listed so (a subject whose launchers need the GPU itself) runs in
the workers, spread over every core, as the warm-up of any JIT subject does.

A subject that declares its compile key (Subject.compile_key) compiles per configuration: its warm-up is
the first drawn case of each key, spread over one worker a core, before the cases; each key's cases then go
to the worker that compiled it (scheduler.Affinity), and the others find it in the library's own on-disk
cache (inductor's, flash-attn-4's CuTe DSL cache, FlashInfer's JIT directory).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from faverify.cases.case import Case
from faverify.run.scheduler import Affinity

# What the warm-up process is asked to do, as JSON: one field a setting
REQUEST_FIELDS = ("kernel", "mode", "dtypes", "features", "gradcheck", "cases", "target", "device", "jobs",
                  "compile", "judged", "checked")


@dataclass(frozen=True)
class Request:
    """kernel: the subject; mode: fwd, bwd or both; dtypes, features, gradcheck: the draw's, whose warm-up
    cases (warmup_cases) are listed, unless `cases` names the cases (as dicts). target: a compute capability
    (target.parse), "" for the device's own. jobs: processes (0: one a core). compile: list only, when
    False. judged: each case as a fuzz judges it (evaluate), with the gradient check for the indices in
    `checked`, instead of its calls alone (exercise): what a fuzz of those cases would compile."""
    kernel: str
    mode: str = "both"
    dtypes: tuple = ("bf16", "fp16")
    features: tuple = ()
    gradcheck: bool = True
    cases: tuple = ()
    target: str = ""
    device: str = "cuda:0"
    jobs: int = 0
    compile: bool = True
    judged: bool = False
    checked: tuple = ()

    def to_dict(self) -> dict:
        return {name: list(v) if isinstance(v, tuple) else v for name, v in
                ((n, getattr(self, n)) for n in REQUEST_FIELDS)}

    @classmethod
    def from_dict(cls, d: dict) -> "Request":
        return cls(**{n: tuple(d[n]) if isinstance(d[n], list) else d[n] for n in REQUEST_FIELDS if n in d})


@dataclass(frozen=True)
class Precompiled:
    """What the warm-up process did: each build its cases needed (builds.Built, as dicts: its key, the
    cache directory; its kernel; compiled, cached or failed), and the cases whose builds it could not list
    (index, error), which a fuzz warms in its workers instead."""
    target: str = ""
    cases: int = 0
    built: tuple = ()
    compiles: int = 0  # the compiles every process made together: each build once, so those compiled here
    untraced: tuple = ()
    seconds: float = 0.0  # the process's wall time, start to end
    jobs: int = 0
    fields: dict = field(default_factory=dict)  # builds.key_fields: what every build's key holds beside the build
    error: str = ""  # why the process gave no result (every case is then untraced)

    @property
    def keys(self) -> tuple:
        return tuple(b["key"] for b in self.built)

    def count(self, outcome: str) -> int:
        return sum(b["outcome"] == outcome for b in self.built)

    @property
    def failed(self) -> list:
        return [b for b in self.built if b["outcome"] == "failed"]

    def to_dict(self) -> dict:
        return {"target": self.target, "cases": self.cases, "built": list(self.built), "compiles": self.compiles,
                "untraced": [list(u) for u in self.untraced], "seconds": round(self.seconds, 2), "jobs": self.jobs,
                "fields": self.fields, "error": self.error}

    @classmethod
    def from_dict(cls, d: dict) -> "Precompiled":
        return cls(**{**d, "built": tuple(d["built"]), "untraced": tuple(tuple(u) for u in d["untraced"])})

    def describe(self) -> str:
        """One line for the terminal."""
        failed = f", {len(self.failed)} failed to compile" if self.failed else ""
        return (f"{len(self.built)} Triton builds for {self.target} ({self.count('compiled')} compiled, "
                f"{self.count('cached')} found in the cache{failed}) by {self.jobs} processes in {self.seconds:.1f} s")


class Ahead:
    """The warm-up process, started at once; wait() for what it did. stop() ends it and its pool."""

    def __init__(self, request: Request, cache_dir: str | None = None):
        self.request = request
        self.folder = tempfile.mkdtemp(prefix="faverify-warmup-")
        with open(os.path.join(self.folder, "request.json"), "w") as f:
            json.dump(request.to_dict(), f)
        env = dict(os.environ, TRITON_INTERPRET="0")  # the kernels compiled, not interpreted, whatever the machine
        # the cubin and its metadata alone, not every stage's IR: a seventh of the disk (2.2 MB a build with
        # the IR), and what a worker reads to load a build
        env.setdefault("TRITON_STORE_BINARY_ONLY", "1")
        if cache_dir:
            env["TRITON_CACHE_DIR"] = str(cache_dir)
        self.log = open(os.path.join(self.folder, "log.txt"), "w")
        self.process = subprocess.Popen([sys.executable, "-m", "faverify.run.precompile", self.folder], env=env,
                                        stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self) -> Precompiled:
        try:
            code = self.process.wait()
        except BaseException:
            self.stop()
            raise
        self.log.close()
        try:
            path = os.path.join(self.folder, "result.json")
            if code == 0 and os.path.exists(path):
                with open(path) as f:
                    return Precompiled.from_dict(json.load(f))
            with open(os.path.join(self.folder, "log.txt")) as f:
                tail = f.read().strip().splitlines()[-1:] or [f"exit code {code}"]
            return Precompiled(error=f"the warm-up process ended with exit code {code}: {tail[0][:300]}")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def stop(self) -> None:
        """End the process and its pool (a session of their own: start_new_session)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def precompile(request: Request, cache_dir: str | None = None) -> Precompiled:
    """Run the warm-up process to its end (`faverify warmup`, the tests)."""
    return Ahead(request, cache_dir).wait()


@dataclass
class Warmup:
    """A fuzz's warm-up of one subject: its cases, and the process compiling their builds ahead (None: the
    workers compile them, running the cases)."""
    cases: list
    ahead: Ahead | None = None

    def compiled(self, stats) -> list:
        """Wait for the process ahead; record what it did in stats; the cases left for the workers."""
        if self.ahead is None:
            return list(self.cases)
        done = self.ahead.wait()
        stats.warmup_builds = {"target": done.target, "builds": len(done.built), "compiled": done.count("compiled"),
                               "cached": done.count("cached"), "failed": len(done.failed), "jobs": done.jobs,
                               "seconds": round(done.seconds, 2)}
        if done.error:
            stats.warmup_builds["error"] = done.error
            return list(self.cases)
        return [self.cases[i] for i, _ in done.untraced]

    def stop(self) -> None:
        if self.ahead is not None:
            self.ahead.stop()


def start(subject, device, mode: str) -> Warmup:
    """The warm-up of a fuzz of one subject (request.SubjectPlan) on `device` (its first): the warm-up cases,
    and on a GPU the process that compiles their Triton builds across every core, started now."""
    cases = subject.warmup_cases()
    if not cases or device.type != "cuda":
        return Warmup(cases)
    request = Request(subject.name, mode, cases=tuple(c.to_dict() for c in cases),
                      device=f"cuda:{device.index or 0}")
    return Warmup(cases, Ahead(request))


def warmup_cases(subject, dtypes: tuple, features: tuple, gradcheck: bool) -> list:
    """The subject's warm-up cases for the dtypes and the features the run draws (a dense fuzz compiles no
    variant build), and where the run checks gradients, those of the check's own cases: in its dtype (fp32
    where the subject has it), as the check runs them (gradcheck.checked_case: the contiguous layout alone)."""
    from faverify.judge.gradcheck import checked_case, dtype_for
    if subject.warmup is None:
        return []
    cases = list(subject.warmup(tuple(dtypes), tuple(features)))
    checked = gradcheck and subject.caps.backward_on("cuda") and subject.caps.ragged.dense
    check = dtype_for(subject.caps.dtypes) if checked else None
    if check is not None:
        cases += [checked_case(c, check) for c in subject.warmup((check,), tuple(features))]
    return list(dict.fromkeys(cases))


def warm_up(pool, warmup, stats, keep: int | None, items: Iterable, key: Callable | None = None) -> Iterable:
    """Everything compiled before the cases: the builds of the process ahead (Warmup.compiled), the warm-up
    cases it left to the workers, and, for a subject that declares its compile key, the first drawn case of
    each key (first_of_each_key), spread over the pool's workers, unjudged. Then the pool keeps `keep`
    workers a device. Returns the run's queue of the (index, Task) items: for a compile key, each key's cases
    go to the kept worker that compiled it (scheduler.Affinity)."""
    from faverify.run.isolation import Task
    start = time.perf_counter()
    warm = warmup if isinstance(warmup, Warmup) else Warmup(list(warmup))
    if warm.ahead is not None and keep is not None:
        start_kept(pool, keep)
    cases = warm.compiled(stats)

    def done(tag, result) -> None:
        stats.warmup_cases += 1
        stats.compiles += result.compiles
        stats.warmup_compiles += result.compiles

    if cases:
        pool.map([(i, Task(c, warm=True)) for i, c in enumerate(cases)], done)
    stats.warmup_cases += len(warm.cases) - len(cases)  # the cases whose builds the process ahead compiled
    kept: list = []
    warming = Affinity(first_of_each_key(items, key, kept), lambda task: key(task.case)) if key else None
    if warming is not None:
        pool.map(warming, done)
    stats.warmup_seconds += time.perf_counter() - start
    if keep is not None:
        pool.retain(keep)
    if warming is None:
        return items
    return Affinity(iter(kept), lambda task: key(task.case), owner=owned(warming, pool.workers))


def first_of_each_key(items: Iterable, key: Callable[[Case], tuple], kept: list) -> Iterable:
    """The warm-up of a subject that compiles per configuration: of the (index, Task) items as they are drawn,
    each one whose compile key no earlier item had, as a warm task; every item is appended to `kept`, for
    the run that follows."""
    from faverify.run.isolation import Task
    seen: set = set()
    for index, task in items:
        kept.append((index, task))
        k = key(task.case)
        if k not in seen:
            seen.add(k)
            yield index, Task(task.case, warm=True)


def owned(warm: Affinity, workers: list) -> dict:
    """The keys the warm-up's workers compiled, for those of them the run keeps (Affinity.owner)."""
    return {k: w for k, w in warm.owner.items() if w in workers}


def start_kept(pool, per_device: int) -> None:
    """Start the workers the run keeps after a warm-up (Pool.retain), so that they import torch and reach
    the device while the builds compile."""
    seen: dict = {}
    for w in pool.workers:
        seen[w.device] = seen.get(w.device, 0) + 1
        if seen[w.device] <= per_device and w.process is None:
            w.start()

