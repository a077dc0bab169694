"""One run document from the shards of a fuzz (`faverify fuzz --shard I/N`, `faverify merge`).

Shard I of N runs the cases i of the seed's draw with i % N == I, so N shards of one seed and iters run
every case once between them. Each shard's run file keeps its per-case values (the stats rows' `series`),
so the merged statistics are recomputed from all the cases, not averaged: the same maxima, counts and
quantiles as the unsharded run. A failure found by several shards is kept once, with the smallest
minimal case (each shard shrank its own), its occurrences summed.
"""
from __future__ import annotations

import re

from faverify.errors import UsageError
from faverify.reports.collector import Failure, KernelStats, Roots
from faverify.reports.results import Run, num

# what the shards of one fuzz must share
SAME = ("kernels", "iters", "seed", "dtypes", "mode", "max_seqlen", "gradcheck_every")
_COUNTED = ("cases", "nan", "inf", "failed", "waived")  # per-case counts; the other series are floats


def parse_shard(text: str, argument: str = "--shard") -> tuple:
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m:
        raise UsageError(argument, text, "must be I/N: shard I (0-based) of N, e.g. 0/4")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or not 0 <= index < count:
        raise UsageError(argument, text, "needs N >= 1 and 0 <= I < N")
    return index, count


def _size(f: Failure) -> int:
    c = f.minimal.case
    return c.batch * c.seqlen_q * c.seqlen_k * c.nheads * c.head_dim


def merge_runs(named: list) -> Run:
    """named: [(path, Run)] of every shard of one fuzz, in any order."""
    shards = {}
    for path, run in named:
        if "shard" not in run.settings:
            raise UsageError("RUN.json", str(path), "is not a shard: run the fuzz with --shard I/N")
        index, count = parse_shard(run.settings["shard"], "RUN.json")
        if index in shards:
            raise UsageError("RUN.json", str(path), f"shard {index}/{count} is given twice (also {shards[index][0]})")
        shards[index] = (path, run, count)
    counts = {count for _, _, count in shards.values()}
    if len(counts) > 1:
        raise UsageError("RUN.json", sorted(counts), "the shards are of different N")
    count = counts.pop()
    missing = sorted(set(range(count)) - set(shards))
    if missing:
        raise UsageError("RUN.json", [f"{i}/{count}" for i in missing], "shard(s) missing")
    ordered = [shards[i] for i in range(count)]
    first_path, first, _ = ordered[0]
    for path, run, _ in ordered[1:]:
        if run.version != first.version:  # a statistic may be defined anew between versions (run-schema.md)
            raise UsageError("RUN.json", str(path), f"has run schema version {run.version}, {first_path} "
                                                    f"{first.version}: merge shards of one faverify")
        for name in SAME:
            if run.settings.get(name) != first.settings.get(name):
                raise UsageError(name, run.settings.get(name), f"differs between shards ({first.settings.get(name)!r} "
                                                               f"in {first_path}, this in {path})")
        if run.tolerance != first.tolerance:
            raise UsageError("tolerance", str(path), f"differs from {first_path}'s: the verdicts are not comparable")
    try:
        stats = [_merged_kernel(name, [(f"{i}/{count}", run) for i, (_, run, _) in enumerate(ordered)])
                 for name in str(first.settings["kernels"]).split(",")]
    except (TypeError, ValueError, KeyError, AttributeError) as e:  # a field of a shard of the wrong type
        if isinstance(e, UsageError):
            raise
        raise UsageError("RUN.json", ", ".join(str(p) for p, _, _ in ordered),
                         f"a shard holds a field of the wrong type ({type(e).__name__}: {str(e)[:120]}): not a "
                         "run file as faverify writes it") from None
    settings = {k: v for k, v in first.settings.items() if k != "shard"}
    settings.update(shards=count, interrupted=any(run.settings.get("interrupted") for _, run, _ in ordered))
    settings["shard_environments"] = [{"shard": f"{i}/{count}", **_environment(run)} for i, (_, run,
                                                                                             _) in enumerate(ordered)]
    command = re.sub(r" --shard \S+", "", first.command)
    return Run.from_stats(command, first.environment, settings, first.tolerance, stats)


def _environment(run: Run) -> dict:
    env = run.environment
    return {"torch": env.get("torch"), "triton": env.get("triton"), "driver": env.get("driver"),
            "gpus": ", ".join(sorted({g["name"] for g in env.get("gpus", [])})) or "none"}


def _merged_kernel(name: str, shards: list) -> KernelStats:
    stats = KernelStats(kernel=name)
    for label, run in shards:
        entry = next((k for k in run.kernels if k["summary"]["kernel"] == name), None)
        if entry is None:
            raise UsageError("RUN.json", label, f"has no results for kernel {name}")
        s = entry["summary"]
        crashed, timed_out = s.get("crashed", 0), s.get("timed_out", 0)
        stats.counts.update({"pass": s["passed"], "fail": s["failed"] - crashed - timed_out, "crash": crashed,
                             "timeout": timed_out, "skip": s["skipped"], "error": s.get("errors", 0)})
        stats.own_errors.extend(s.get("error_reasons", [])[:3 - len(stats.own_errors)])
        stats.skipped.update(s.get("skip_reasons", {}))
        stats.partial.update(s.get("partial_reasons", {}))
        stats.per_device.update({f"{label} {d}": n for d, n in s.get("per_device", {}).items()})
        stats.paths.update(s.get("paths", {}))
        for name, found in s.get("relations", {}).items():
            stats.tally_relation(name, found["promised"], found["checked"], found["equal"], found["max_diff"])
        stats.edges.update(s.get("edges", {}))
        stats.edges_listed = tuple(dict.fromkeys(stats.edges_listed + tuple(s.get("edges", {}))))
        stats.features.update(s.get("features", {}))
        for counts, field in ((stats.regimes, "regimes"), (stats.layouts, "layouts"), (stats.masks, "masks"),
                              (stats.fp8, "fp8")):
            for key, v in s.get(field, {}).items():
                row = counts.setdefault(key, {"cases": 0, "failed": 0})
                row["cases"] += v["cases"]
                row["failed"] += v["failed"]
        stats.conventions = s.get("conventions", stats.conventions)
        for f, v in s.get("by_feature", {}).items():
            row = stats.by_feature.setdefault(f, {"cases": 0, "failed": 0, "usage_max": float("nan")})
            row["cases"] += v["cases"]
            row["failed"] += v["failed"]
            u = num(v["usage_max"])
            if u == u and not u <= row["usage_max"]:
                row["usage_max"] = u
        stats.restarts += s.get("worker_restarts", 0)
        stats.calls += s.get("calls", s["cases"])
        stats.compiles += s.get("compiles", 0)
        stats.configurations.update(s.get("configurations", ()))
        stats.warmup_cases += s.get("warmup", {}).get("cases", 0)
        stats.warmup_seconds += s.get("warmup", {}).get("seconds", 0.0)
        stats.memory_retried += s.get("memory_retried", 0)
        stats.seconds += s.get("seconds", 0.0)  # the sum over shards: the work, not the wall time
        stats.phases.update({p: ms * s["cases"] / 1e3 for p, ms in s.get("ms_per_case", {}).items()})
        for key in ("cases", "failed"):
            stats.replay[key] += s.get("replayed", {}).get(key, 0)
        for row in entry["stats"]:
            if "series" not in row:
                raise UsageError("RUN.json", label, "keeps no per-case values (a run file of faverify fuzz --shard)")
            series = stats.series[(row["dtype"], row["tensor"], row.get("outcome", "passing"))]
            for key, values in row["series"].items():
                series[key].extend(int(num(v)) if key in _COUNTED else num(v) for v in values)
        for row in entry["gradcheck"]:
            stats.gradchecks[row["dtype"]].extend({**c, "rel_err": num(c["rel_err"])} for c in row.get("series", []))
        for f in entry["failures"]:
            _keep_smallest(stats, Failure.from_dict(f))
    _one_per_root(stats)
    return stats


def _one_per_root(stats: KernelStats) -> None:
    """One failure per root, as the unsharded run reports them (collector.Roots): the shards' failures whose
    signatures were found together on a case in any shard are one group, reported by its most frequent
    signature (the smallest minimal case among equals), the others its companions."""
    roots = Roots()
    for f in stats.failures:
        roots.add([f.signature, *f.companions])
    groups: dict = {}
    for f in stats.failures:
        groups.setdefault(roots._find(f.signature), []).append(f)
    kept = []
    for members in groups.values():
        best = min(members, key=lambda f: (-stats.signature_counts[f.signature], _size(f)))
        together = {s for f in members for s in (f.signature, *f.companions)} - {best.signature}
        best.companions = tuple(sorted(together))
        kept.append(best)
    stats.failures[:] = [f for f in stats.failures if f in kept]


def _keep_smallest(stats: KernelStats, failure: Failure) -> None:
    stats.signature_counts[failure.signature] += failure.occurrences
    for i, f in enumerate(stats.failures):
        if f.signature == failure.signature:
            if _size(failure) < _size(f):
                stats.failures[i] = failure
            return
    stats.failures.append(failure)


__all__ = ["merge_runs", "parse_shard"]
