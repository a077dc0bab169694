"""The warm-up process (warmup.py): lists the Triton builds of a subject's warm-up cases and compiles them
into Triton's on-disk cache across every core, for a GPU named or the one it runs beside.

    TRITON_INTERPRET=0 python -m faverify.run.precompile FOLDER

FOLDER holds request.json (warmup.Request); result.json (warmup.Precompiled) is written there. The subject's
calls run on CPU tensors under builds.listing, which launches nothing: each call's builds are listed, and a
build is compiled by the first process that claims it. The processes are forked from this one once the
subject and its kernels are imported, so each starts at once; a case goes to whichever is free.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from faverify.run.warmup import Precompiled, Request, warmup_cases

_STATE: dict = {}  # what the forked processes inherit: the subject, the cases, the request, the lister


def run(request: Request) -> Precompiled:
    start = time.perf_counter()
    import torch

    from faverify.cases.case import Case
    from faverify.kernels.triton.build import builds, target
    from faverify.subjects import resolve
    # the target first: asking the GPU initializes CUDA here, which the forked processes then never use
    named = target.parse(request.target) if request.target else target.of_device(request.device)
    torch.set_num_threads(1)  # one a process: the processes take the cores
    subject = resolve(request.kernel)
    cases = [Case.from_dict(d) for d in request.cases] if request.cases else warmup_cases(
        subject, request.dtypes, request.features, request.gradcheck)
    # the calls run on CPU tensors: the subject's own declaration of the device stands aside
    subject = dataclasses.replace(subject, caps=dataclasses.replace(subject.caps, devices=("cpu",)))
    jobs = max(1, min(request.jobs or _cores(), len(cases)))
    claims = tempfile.mkdtemp(prefix="faverify-claims-")
    _STATE.update(subject=subject, cases=cases, request=request, target=named, claims=claims)
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"), initializer=_enter) as pool:
            outcomes = list(pool.map(_trace, range(len(cases)), chunksize=1))
    finally:
        shutil.rmtree(claims, ignore_errors=True)
    return _gathered(outcomes, named, len(cases), jobs, time.perf_counter() - start, builds.key_fields(named))


def _cores() -> int:
    from faverify.run.scheduler import cores
    return cores()


def _enter() -> None:
    """A forked process: every call it makes from now on is listed (builds.listing), for its life."""
    from faverify.kernels.triton.build import builds
    # kept in _STATE: a context manager collected would leave its block
    _STATE["listing"] = builds.listing(_STATE["target"], _STATE["claims"], _STATE["request"].compile)
    _STATE["lister"] = _STATE["listing"].__enter__()


def _trace(index: int) -> tuple:
    """(index, the error its calls raised or "", the builds they met first in this process, as dicts)."""
    import torch

    from faverify.run.evaluate import evaluate, exercise
    from faverify.run.gradcheck import directional
    subject, request, case = _STATE["subject"], _STATE["request"], _STATE["cases"][index]
    lister = _STATE["lister"]
    try:
        if request.judged:
            evaluate(subject, case, "cpu", mode=request.mode)
            if index in request.checked:  # the check's calls, whatever the verdict on outputs never computed
                directional(subject, case, torch.device("cpu"))
        else:
            exercise(subject, case, "cpu", request.mode)
    except Exception as e:  # these calls need what a named target does not give: the workers will warm them
        lister.take()
        return index, f"{type(e).__name__}: {str(e)[:300]}", []
    return index, "", [b.to_dict() for b in lister.take()]


def _gathered(outcomes: list, named, cases: int, jobs: int, seconds: float, fields: dict) -> Precompiled:
    """One Precompiled of every process's builds: a build once, as the process that claimed it saw it."""
    builds: dict = {}
    for _, _, met in outcomes:
        for b in met:
            if b["key"] not in builds or builds[b["key"]]["outcome"] == "claimed":
                builds[b["key"]] = b
    compiles = sum(b["outcome"] == "compiled" for _, _, met in outcomes for b in met)
    return Precompiled(target=named.name, cases=cases, built=tuple(builds.values()), compiles=compiles,
                       untraced=tuple((i, error) for i, error, _ in outcomes if error), seconds=seconds, jobs=jobs,
                       fields=fields)


def main(argv: list | None = None) -> int:
    (folder,) = sys.argv[1:] if argv is None else argv
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("precompile: TRITON_INTERPRET is set: interpreted kernels compile nothing", file=sys.stderr)
        return 2
    with open(os.path.join(folder, "request.json")) as f:
        request = Request.from_dict(json.load(f))
    result = run(request)
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump(result.to_dict(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
