"""Golden verify: a subject on every stored case (golden_files.py), each judged against the FP64
reference stored with it.

A golden verify does not depend on the machine's random number generator or its FP64 arithmetic, so it
tells whether a new GPU, driver or CUDA computes attention right. A bad file fails its own row; the other
cases still run.

    faverify golden verify --kernel K
    faverify golden record          rebuild the files (FP64 on the CPU; deterministic)
"""
from __future__ import annotations

from pathlib import Path

import torch

from faverify.cases.golden_files import (
    CASES,
    DEFAULT_DIR,
    Entry,
    GoldenFileProblem,
    decode,
    index,
    kept_entries,
    read,
    write_case,
    write_index,
)
from faverify.cases.inputs import Inputs, lay_out, variant_of
from faverify.cases.values import draw_values
from faverify.dtypes import TORCH
from faverify.judge.reference import reference
from faverify.run.evaluate import evaluate
from faverify.run.isolation import Task, Worker, thread_share
from faverify.run.plan import Judging
from faverify.run.scheduler import Pool
from faverify.subjects import resolve


def summarize(rows: list) -> dict:
    """verify's rows by outcome: passed, bad (fail, crash, timeout, corrupt file), skipped."""
    return {"passed": [r for r in rows if r["status"] == "pass"],
            "bad": [r for r in rows if r["status"] in ("fail", "crash", "timeout", "corrupt")],
            "skipped": [r for r in rows if r["status"] == "skip"]}


def verify(kernel: str, device, *, directory: Path = DEFAULT_DIR, tolerance, names=None, isolate: bool = True,
           timeout: float = 300.0) -> list:
    """Run `kernel` on every golden case (or `names`), each judged against its stored reference.

    One row per case: name, status (pass, fail, skip, crash, timeout, or "corrupt" for a bad file) and
    reason. A bad file fails its own row only; the index itself must be readable. isolate: in a worker
    process (verify_many); else in this one."""
    if isolate:
        return verify_many([(kernel, str(device), 1)], directory=directory, tolerance=tolerance, names=names,
                           timeout=timeout)[(kernel, str(device))]

    subject = resolve(kernel)
    rows = []
    for entry in _entries(directory, names):
        try:
            stored = decode(read(directory, entry), entry, device)  # integrity first: a bad file is its row
        except GoldenFileProblem as e:
            rows.append(_corrupt_row(entry, e))
            continue
        rows.append(_row(entry, evaluate(subject, entry.case, device, tolerance=tolerance, stored=stored)))
    return rows


def verify_many(jobs: list, *, directory: Path = DEFAULT_DIR, tolerance, names=None, timeout: float = 300.0,
                on_done=lambda kernel, device, rows: None) -> dict:
    """verify() for several (kernel, device, workers) jobs at once, every job in worker processes of its
    own, all running together: doctor checks every subject on every GPU in the time of the slowest.
    A job's cases are spread over its workers (a JIT-compiled subject compiles per variant: several
    workers compile several at once). Returns {(kernel, device): rows in the index's order};
    on_done(kernel, device, rows) as each job finishes."""

    entries = _entries(directory, names)
    bad = {}
    for entry in entries:  # integrity once, in this process: a bad file is its row in every job, whether its
        try:               # bytes fail the index's sha256 or do not decode (as verify() in this process)
            decode(read(directory, entry), entry, "cpu")
        except GoldenFileProblem as e:
            bad[entry.name] = e
    rows = {(k, d): {} for k, d, _ in jobs}
    threads = thread_share(sum(max(1, n) for _, _, n in jobs))
    pool = Pool({(k, d): [Worker(k, d, Judging(tolerance=tolerance, timeout=timeout), threads=threads)
                          for _ in range(max(1, n))]
                 for k, d, n in jobs})

    def ordered(job) -> list:
        return [_corrupt_row(e, bad[e.name]) if e.name in bad else rows[job][e.name] for e in entries]

    def record(job, entry: Entry, result) -> None:
        rows[job][entry.name] = _row(entry, result)

    queues = {job: ((e, Task(e.case, golden=(str(directory), e))) for e in entries if e.name not in bad)
              for job in rows}
    try:
        pool.run(queues, record, on_lane_done=lambda job: on_done(*job, ordered(job)))
    finally:
        pool.close()
    return {job: ordered(job) for job in rows}


def _entries(directory: Path, names) -> list:
    return [e for e in index(directory) if not names or e.name in names]


def _row(entry: Entry, result) -> dict:
    return {"name": entry.name, "status": result.status, "reason": result.reason, "case": entry.case,
            "result": result}


def _corrupt_row(entry: Entry, problem: Exception) -> dict:
    return {"name": entry.name, "status": "corrupt", "reason": str(problem), "case": entry.case}


def record(directory: Path = DEFAULT_DIR, names=None) -> list:
    """Draw each case's inputs on the CPU, compute its FP64 outputs and gradients, and write its file and the
    index. names: record only these. Returns the entries recorded."""
    directory = Path(directory)
    kept = kept_entries(directory, names)  # before any work: an index it cannot read is refused
    (directory / "cases").mkdir(parents=True, exist_ok=True)
    entries = []
    for name, case in CASES.items():
        if names and name not in names:
            continue
        drawn = draw_values(case, torch.device("cpu"))
        values = Inputs(*(t.to(TORCH[case.dtype]) for t in drawn[:4]), *drawn[4:])
        x = lay_out(case, values)  # the call's view: a loss on lse brings its dlse, and "alone" a zero dO
        if case.kv_shared:  # v is k's leading columns: those are the values the call sees
            values.v = x.v.detach().contiguous()
        with torch.no_grad():
            ref, scales = reference(values.q, values.k, values.v, x.dout, causal=case.causal, scale=case.scale,
                                    variant=variant_of(case, x), dlse=x.dlse)
        entries.append(write_case(directory, name, case, values, ref, scales))
    write_index(directory, entries, kept)
    return entries
