"""Aggregate case results into what the reports show: counts, error distributions, failures."""
from __future__ import annotations

import json
import math
import shlex
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from faverify.cases.case import Case
from faverify.cases.edges import edges_of
from faverify.cases.vocabulary import FEATURES, SPLIT_TENSORS, TENSORS
from faverify.reports.case_result import CaseResult


def repro_command(kernel: str, case_json: str, device: str = "", flags: tuple = ()) -> str:
    """The `faverify repro` line of a case, every word quoted for a POSIX shell: a kernel name or a flag
    value pasted into a terminal runs nothing but faverify."""
    words = ["faverify", "repro", "--kernel", kernel] + (["--device", device] if device else []) + list(flags)
    return " ".join(shlex.quote(w) for w in words + ["--case", case_json])


# Failure.replayed: what the minimal case did when replayed alone, by its reproducer's settings, in a
# fresh worker process (confirm.py); its reproducer is printed only after it failed there
REPLAY_FAILED, REPLAY_PASSED, NOT_REPLAYED = "failed", "passed", ""


@dataclass
class Failure:
    kernel: str
    signature: str
    first: CaseResult  # the case that found it
    minimal: CaseResult  # after shrinking
    occurrences: int = 1  # cases of the run that failed with this signature
    shrink_steps: int = 0
    note: str = ""
    flags: tuple = ()  # the reproducer's options beyond kernel, device and case (confirm.repro_flags)
    replayed: str = NOT_REPLAYED  # REPLAY_FAILED, REPLAY_PASSED, or not replayed (an interrupted run's)
    replay_reason: str = ""  # what the replay said: its failure's reason, or why it was not replayed
    companions: tuple = ()  # the other signatures of the same root, found with it and not shrunk apart
    # a failure that passes alone: the call sequence that fails again in one fresh process, as Case JSON
    # whose `before` holds the earlier calls (confirm.earlier_calls); its reproducer replays them all
    sequence: str = ""

    @property
    def reproducer(self) -> str:
        device = self.minimal.device.split(":")[0] if self.minimal.device else ""
        return repro_command(self.kernel, self.sequence or self.minimal.case.to_json(), device, self.flags)

    @property
    def earlier_calls(self) -> int:
        """The calls its reproducer makes before the one that fails."""
        return len(Case.from_json(self.sequence).before) if self.sequence else len(self.minimal.case.before)

    @property
    def reproduced(self) -> bool:
        return self.replayed == REPLAY_FAILED

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "signature": self.signature, "occurrences": self.occurrences,
                "shrink_steps": self.shrink_steps, "note": self.note, "reproducer": self.reproducer,
                "flags": list(self.flags), "replayed": self.replayed, "replay_reason": self.replay_reason,
                "companions": list(self.companions), "first": self.first.to_dict(), "minimal": self.minimal.to_dict(),
                "sequence": json.loads(self.sequence) if self.sequence else None}

    @classmethod
    def from_dict(cls, d: dict) -> "Failure":
        # before run schema 6 nothing was replayed: a file of then reads as not replayed
        return cls(kernel=d["kernel"], signature=d["signature"], first=CaseResult.from_dict(d["first"]),
                   minimal=CaseResult.from_dict(d["minimal"]), occurrences=d["occurrences"],
                   shrink_steps=d["shrink_steps"], note=d.get("note", ""), flags=tuple(d.get("flags", ())),
                   replayed=d.get("replayed", NOT_REPLAYED), replay_reason=d.get("replay_reason", ""),
                   companions=tuple(d.get("companions", ())), sequence=_sequence_of(d))


def _sequence_of(d: dict) -> str:
    """A failure's call sequence as Case JSON: schema 8's `sequence`, or schema 7's `after` (the earlier
    calls) and `after_case` (the failing one)."""
    if d.get("sequence"):
        return Case.from_dict(d["sequence"]).to_json()
    if d.get("after_case"):
        return Case.from_dict({**d["after_case"], "before": list(d.get("after", ()))}).to_json()
    return ""


def _quantile(values: list, q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


@dataclass
class KernelStats:
    kernel: str
    counts: Counter = field(default_factory=Counter)  # status -> cases
    skipped: Counter = field(default_factory=Counter)  # reason -> cases
    # (dtype, tensor, outcome) -> stat -> values
    series: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    gradchecks: dict = field(default_factory=lambda: defaultdict(list))  # dtype used -> GradCheck dicts
    failures: list = field(default_factory=list)
    per_device: Counter = field(default_factory=Counter)
    phases: Counter = field(default_factory=Counter)  # seconds per phase, summed over cases
    signature_counts: Counter = field(default_factory=Counter)  # failure signature -> cases
    paths: Counter = field(default_factory=Counter)  # the subject's code path -> cases that took it
    # relation -> {checked, equal, max_diff}: the relations the subject promises, over the cases they apply to
    relations: dict = field(default_factory=dict)
    features: Counter = field(default_factory=Counter)  # variant feature -> cases that used it (run or skipped)
    # regime / layout -> {cases run, failed}: which triggers the subject met, and which it failed on
    regimes: dict = field(default_factory=dict)
    layouts: dict = field(default_factory=dict)
    masks: dict = field(default_factory=dict)  # the same per mask pattern, bias and score_mod (Case.mask_kinds)
    fp8: dict = field(default_factory=dict)  # the same per FP8 case's "format granularity regime"
    conventions: str = ""  # what the subject declares and the reference followed (conventions.Conventions)
    partial: Counter = field(default_factory=Counter)  # reason -> cases that passed on their forward alone
    # feature (or "dense") -> cases run, failed, and the largest error over allowed of any tensor
    by_feature: dict = field(default_factory=dict)
    restarts: int = 0  # worker processes started again after a crash or a timeout
    calls: int = 0  # the subject's calls judged: a case's, or each call of a sequence (Case.before) up to its end
    compiles: int = 0  # what the subject compiled, over the cases (Subject.compiles)
    configurations: set = field(default_factory=set)  # the distinct compile keys of the cases run
    shapes: int = 0  # the shape budget its cases were drawn under (--shapes; 0: none)
    warmup_cases: int = 0  # unjudged cases run first so each compiled variant compiles once (warmup.warm_up)
    warmup_seconds: float = 0.0
    warmup_compiles: int = 0  # of compiles: those the warm-up's cases made (Subject.compiles)
    # what the warm-up process compiled ahead of the cases (warmup.Warmup.compiled): target, builds, compiled,
    # cached, failed, jobs, seconds; empty where none ran
    warmup_builds: dict = field(default_factory=dict)
    memory_retried: int = 0  # cases skipped for memory beside other workers, run again alone (parallel.py)
    seconds: float = 0.0
    # the example store's cases, replayed before the draw (fuzz.replay): counted here alone
    replay: dict = field(default_factory=lambda: {"cases": 0, "failed": 0, "signatures": {}})
    replayed_failures: list = field(default_factory=list)  # Failure per signature a replayed case showed
    still_failing: list = field(default_factory=list)  # the replayed cases that still fail (kept in the store)
    keep_series: bool = False  # the run file keeps the per-case values too (a shard's, for merge.py)
    own_errors: list = field(default_factory=list)  # the first reasons of cases faverify's own code raised on
    # 'feature: edge' (edges.py) -> cases run that lay on it, over the edges of the features the run draws
    edges_listed: tuple = ()
    edges: Counter = field(default_factory=Counter)

    def merge_replayed(self) -> None:
        """List each replayed failure whose signature the draw did not find too (the draw's own, shrunk,
        stands for the others); once."""
        found = {f.signature for f in self.failures}
        for f in self.replayed_failures:
            if f.signature not in found:
                self.failures.append(f)
                found.add(f.signature)
        self.replayed_failures = []

    def add(self, r: CaseResult) -> None:
        self.counts[r.status] += 1
        self.calls += 1 + len(r.case.before)
        self.compiles += r.compiles
        self.configurations.update(r.compile_keys)
        used = r.case.features() or ("dense",)
        self.features.update(used)
        if r.status != "skip":
            usage = max((m.max_abs / m.allowed for m in r.metrics.values() if not m.waived and m.allowed > 0),
                        default=float("nan"))
            for f in used:
                row = self.by_feature.setdefault(f, {"cases": 0, "failed": 0, "usage_max": float("nan")})
                row["cases"] += 1
                row["failed"] += int(r.failed)
                if usage == usage and not usage <= row["usage_max"]:
                    row["usage_max"] = usage
        if r.status != "skip":
            self.edges.update(edges_of(r.case))
            keys = [(self.regimes, r.case.regime), (self.layouts, r.case.layout)]
            keys += [(self.masks, kind) for kind in r.case.mask_kinds()]
            if r.case.fp8 is not None:
                keys.append((self.fp8, f"{r.case.fp8.format} {r.case.fp8.granularity} {r.case.regime}"))
            for counts, key in keys:
                row = counts.setdefault(key, {"cases": 0, "failed": 0})
                row["cases"] += 1
                row["failed"] += int(r.failed)
        self.phases.update(r.phases)
        if r.device:
            self.per_device[r.device] += 1
        if r.status == "skip":
            self.skipped[r.reason] += 1
        elif r.status == "error" and len(self.own_errors) < 3:
            self.own_errors.append(r.reason)
        elif r.status == "pass" and r.reason:  # passed on less than was asked (evaluate._what_runs)
            self.partial[r.reason] += 1
        outcome = "failing" if r.failed else "passing"  # apart: the good cases' margin is not hidden by the bad
        for t, m in r.metrics.items():
            s = self.series[(r.case.dtype, t, outcome)]
            s["cases"].append(1)
            if not m.waived:  # an ill-conditioned case's errors mean nothing: counted as waived only
                for stat in ("max_abs", "mean_abs", "rmse", "max_rel", "max_ulp", "ratio", "ref_max"):
                    s[stat].append(getattr(m, stat))
                s["usage"].append(m.max_abs / m.allowed if m.allowed > 0 else 0.0)
                s["floor_share"].append(m.floor / m.allowed if m.allowed > 0 else 1.0)
            s["nan"].append(m.nan)
            s["inf"].append(m.inf)
            s["failed"].append(0 if m.passed else 1)
            s["waived"].append(1 if m.waived else 0)
        if r.gradcheck and not r.gradcheck["skipped"]:
            self.gradchecks[r.gradcheck["dtype"]].append(r.gradcheck)
        self.signature_counts.update(r.signatures)
        self.paths.update(r.paths)
        for name, found in r.relations.items():
            if found.get("checked"):
                self.tally_relation(name, found["promised"], 1, int(found["equal"]), found["max_diff"])
            else:
                self.tally_relation(name, found["promised"], 0, 0, 0.0)

    def tally_relation(self, name: str, promised: bool, checked: int, equal: int, max_diff: float) -> None:
        """Add cases a relation was checked on (one case's record, or a shard's totals: merge.py)."""
        total = self.relations.setdefault(name, {"checked": 0, "equal": 0, "max_diff": 0.0, "promised": promised})
        total["checked"] += checked
        total["equal"] += equal
        total["max_diff"] = max(total["max_diff"], float(max_diff))

    @property
    def cases(self) -> int:
        return sum(self.counts.values())

    @property
    def ran(self) -> int:
        return self.cases - self.counts["skip"]

    @property
    def failed(self) -> int:
        return self.counts["fail"] + self.counts["crash"] + self.counts["timeout"]

    @property
    def errors(self) -> int:
        """Cases faverify's own code raised on (case_result.own_error): neither passed nor failed by the subject."""
        return self.counts["error"]

    def stat_rows(self) -> list:
        rows = []
        for (dtype, tensor, outcome), s in sorted(self.series.items(),
                                                  key=lambda kv: (kv[0][2] == "failing", kv[0][0], _ORDER[kv[0][1]])):
            finite = [x for x in s["ratio"] if x == x]  # drop NaN (baseline non-finite)
            usage = [x for x in s["usage"] if x == x]
            floor_share = [x for x in s["floor_share"] if x == x]
            judged = len(s["max_abs"])

            def top(stat):
                return max(s[stat]) if judged else float("nan")
            rows.append({
                "kernel": self.kernel, "dtype": dtype, "tensor": tensor, "outcome": outcome, "cases": len(s["cases"]),
                "failed": sum(s["failed"]), "waived": sum(s["waived"]), "max_abs": top("max_abs"),
                "mean_abs": sum(s["mean_abs"]) / judged if judged else float("nan"), "rmse_max": top("rmse"),
                "max_rel": top("max_rel"), "max_ulp": top("max_ulp"),
                "nan": sum(s["nan"]), "inf": sum(s["inf"]),
                "ratio_p50": _quantile(finite, 0.5), "ratio_p99": _quantile(finite, 0.99),
                "ratio_max": max(finite) if finite else float("nan"),
                "usage_p50": _quantile(usage, 0.5), "usage_p99": _quantile(usage, 0.99),
                "usage_max": max(usage) if usage else float("nan"), "ref_max": top("ref_max"),
                "floor_share_p50": _quantile(floor_share, 0.5),
            })
            if self.keep_series:
                rows[-1]["series"] = {k: list(v) for k, v in s.items()}
        return rows

    def gradcheck_rows(self) -> list:
        rows = []
        for dtype, checks in sorted(self.gradchecks.items()):
            rel = [c["rel_err"] for c in checks]
            # each check's allowance has its own truncation and rounding terms (judge/gradcheck.py): the row
            # names the one its closest check had, and how close that came
            usage = [c["rel_err"] / c["allowed"] if c["allowed"] > 0 else math.inf for c in checks]
            closest = max(range(len(checks)), key=lambda i: usage[i])
            rows.append({"kernel": self.kernel, "dtype": dtype, "checks": len(checks),
                         "failed": sum(not c["passed"] for c in checks), "rel_err_p50": _quantile(rel, 0.5),
                         "rel_err_max": max(rel), "allowed": checks[closest]["allowed"],
                         "usage_max": usage[closest]})
            if self.keep_series:
                rows[-1]["series"] = [{k: c[k] for k in ("rel_err", "allowed", "passed")} for c in checks]
        return rows

    def summary(self) -> dict:
        return {"kernel": self.kernel, "cases": self.cases, "passed": self.counts["pass"], "failed": self.failed,
                "crashed": self.counts["crash"], "timed_out": self.counts["timeout"], "skipped": self.counts["skip"],
                "errors": self.counts["error"], "error_reasons": list(self.own_errors),
                "skip_reasons": dict(self.skipped.most_common()),
                "partial_reasons": dict(self.partial.most_common()), "per_device": dict(self.per_device),
                "paths": dict(self.paths),  # in the order first taken: fwd before bwd
                "relations": self.relations,
                "features": {f: self.features[f] for f in ("dense",) + FEATURES if self.features[f]},
                "regimes": self.regimes, "layouts": self.layouts, "masks": self.masks, "fp8": self.fp8,
                "edges": {e: self.edges[e] for e in self.edges_listed},
                "conventions": self.conventions,
                "by_feature": {f: self.by_feature[f] for f in ("dense",) + FEATURES if f in self.by_feature},
                "worker_restarts": self.restarts, "calls": self.calls, "compiles": self.compiles,
                "configurations": sorted(self.configurations), "shapes": self.shapes,
                "warmup": {"cases": self.warmup_cases, "seconds": round(self.warmup_seconds, 2),
                           "compiles": self.warmup_compiles,
                           **({"builds": self.warmup_builds} if self.warmup_builds else {})},
                "memory_retried": self.memory_retried,
                "replayed": {"cases": self.replay["cases"], "failed": self.replay["failed"],
                             "signatures": dict(self.replay["signatures"])},
                "seconds": self.seconds, "cases_per_second": self.cases / self.seconds if self.seconds else 0.0,
                "ms_per_case": {k: round(1e3 * v / max(1, self.cases), 3) for k, v in sorted(self.phases.items())}}


_ORDER = {name: i for i, name in enumerate(TENSORS + SPLIT_TENSORS)}


class Roots:
    """One failure per root cause. The signatures of one failing case belong together (one wrong kernel gives
    out:tolerance, dq:tolerance, dk:masked-rows... on the same cases), and so, through them, do those of every
    case that shares one: the groups are the connected parts of "found on one case". A case whose signatures
    are all new starts a root, its first tensor's; a root whose group later joins an earlier root's is that
    root's companion. One failure to shrink, not nine. With `every`, each signature is a root of its own."""

    def __init__(self, every: bool = False):
        self.every = every
        self.parent: dict = {}  # signature -> a signature of its group (union-find)
        self.started: list = []  # the roots, in the order they were started

    def _find(self, s: str) -> str:
        while self.parent[s] != s:
            self.parent[s] = self.parent[self.parent[s]]
            s = self.parent[s]
        return s

    def add(self, signatures: list) -> str | None:
        """Record one failing case's signatures: the new root they start, or None."""
        if self.every:
            new = [s for s in signatures if s not in self.parent]
            for s in new:
                self.parent[s] = s
                self.started.append(s)
            return new[0] if new else None
        if not signatures:
            return None
        known = any(s in self.parent for s in signatures)
        for s in signatures:
            self.parent.setdefault(s, s)
        first = self._find(signatures[0])
        for s in signatures[1:]:
            other = self._find(s)
            if other != first:  # the group of the earlier root stays the group's name
                keep, gone = sorted((first, other), key=self._order)
                self.parent[gone] = keep
                first = keep
        if known:
            return None
        self.started.append(signatures[0])
        return signatures[0]

    def _order(self, s: str) -> int:
        found = [i for i, r in enumerate(self.started) if self._find(r) == s or r == s]
        return found[0] if found else len(self.started)

    def primary(self, signature: str) -> bool:
        """Whether the failure of this root stands in the report (no earlier root's group took it in)."""
        if self.every:
            return True
        group = self._find(signature)
        return next(r for r in self.started if self._find(r) == group) == signature

    def companions(self, root: str) -> tuple:
        if self.every:
            return ()
        group = self._find(root)
        return tuple(s for s in self.parent if s != root and self._find(s) == group)
