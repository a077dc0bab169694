"""What a run file must hold for report, compare and merge to read it, checked when it is loaded
(results.Run.read): a run file edited by hand, cut off or forged is refused with its first bad field named,
in one line, not a traceback in the middle of a table or a verdict drawn from impossible counts.

A field's kind is one of the names below, an object of named fields (a name ending in "?" is one an older
version lacks, docs/run-schema.md), an object whose every value is of one kind (Each), or a list whose every
item is of one kind (Items).
"""
from __future__ import annotations

import math
from typing import NamedTuple

COUNT = "a count (an integer >= 0)"
NUMBER = "a number"  # JSON's, or "nan", "inf", "-inf": JSON has no NaN
TEXT = "a string"
FLAG = "true or false"
ANY = "anything"


class Each(NamedTuple):
    """An object whose every value is of one kind; words: how many words each key must have (0: any)."""
    kind: object
    words: int = 0


class Items(NamedTuple):
    """A list whose every item is of one kind."""
    kind: object


_TALLY = {"cases": COUNT, "failed": COUNT}
SUMMARY = {
    "kernel": TEXT, "cases": COUNT, "passed": COUNT, "failed": COUNT, "crashed": COUNT, "timed_out": COUNT,
    "skipped": COUNT, "skip_reasons": Each(COUNT), "seconds": NUMBER, "cases_per_second": NUMBER,
    "errors?": COUNT, "error_reasons?": Items(TEXT), "partial_reasons?": Each(COUNT), "per_device?": Each(COUNT),
    "paths?": Each(COUNT), "features?": Each(COUNT), "by_feature?": Each({**_TALLY, "usage_max": NUMBER}),
    "relations?": Each({"checked": COUNT, "equal": COUNT, "max_diff": NUMBER, "promised?": FLAG}),
    "regimes?": Each(_TALLY), "layouts?": Each(_TALLY), "masks?": Each(_TALLY), "fp8?": Each(_TALLY, words=3),
    "edges?": Each(COUNT), "conventions?": TEXT, "worker_restarts?": COUNT, "calls?": COUNT, "compiles?": COUNT,
    "configurations?": Items(TEXT), "shapes?": COUNT, "warmup?": {"cases": COUNT, "seconds": NUMBER},
    "memory_retried?": COUNT, "replayed?": {"cases": COUNT, "failed": COUNT, "signatures?": Each(COUNT)},
    "ms_per_case?": Each(NUMBER)}
STATS_ROW = {"kernel": TEXT, "dtype": TEXT, "tensor": TEXT, "outcome?": TEXT, "cases": COUNT, "failed": COUNT,
             "waived": COUNT, "nan": COUNT, "inf": COUNT,
             **{name: NUMBER for name in ("max_abs", "mean_abs", "max_rel", "max_ulp", "ratio_p50", "ratio_p99",
                                          "ratio_max")},
             **{f"{name}?": NUMBER for name in ("rmse_max", "ref_max", "usage_p50", "usage_p99", "usage_max",
                                                "floor_share_p50")}}
GRADCHECK_ROW = {"kernel": TEXT, "dtype": TEXT, "checks": COUNT, "failed": COUNT, "rel_err_p50": NUMBER,
                 "rel_err_max": NUMBER, "allowed": NUMBER, "usage_max?": NUMBER}
_RESULT = {"kernel": TEXT, "status": TEXT, "reason": TEXT, "signatures": Items(TEXT), "seconds": NUMBER,
           "metrics": Each(ANY)}
FAILURE = {"kernel": TEXT, "signature": TEXT, "occurrences": COUNT, "shrink_steps": COUNT, "note?": TEXT,
           "reproducer?": TEXT, "flags?": Items(TEXT), "replay_reason?": TEXT, "companions?": Items(TEXT),
           "first": _RESULT, "minimal": _RESULT}
KERNEL = {"summary": SUMMARY, "stats": Items(STATS_ROW), "gradcheck": Items(GRADCHECK_ROW),
          "failures": Items(FAILURE)}
_GPU = {"index": ANY, "name": TEXT, "capability": ANY, "memory_gib": ANY}
RUN = {"command": TEXT, "environment": {"gpus?": Items(_GPU), "variables?": Each(ANY), "torch_flags?": Each(ANY)},
       "settings": {"shard_environments?": Items({"shard": ANY})}, "tolerance": {"rule?": TEXT},
       "kernels": Items(KERNEL)}


def problem(data: dict) -> str | None:
    """The first thing wrong with a run file's fields (data: its JSON object), in words naming the field, or
    None. Past the kinds: each kernel's counts add up (passed, failed, skipped and errors make its cases)."""
    wrong = _wrong(data, RUN, "")
    if wrong:
        return wrong
    if not data["kernels"]:
        return "kernels must be a non-empty list"
    for i, k in enumerate(data["kernels"]):
        s = k["summary"]
        if s["passed"] + s["failed"] + s["skipped"] + s.get("errors", 0) != s["cases"]:
            return (f"kernels[{i}].summary's passed, failed, skipped and errors add up to "
                    f"{s['passed'] + s['failed'] + s['skipped'] + s.get('errors', 0)}, not its {s['cases']} cases")
        if s["crashed"] + s["timed_out"] > s["failed"]:
            return f"kernels[{i}].summary counts more crashed and timed out cases than failed ones"
        for j, row in enumerate(k["stats"]):
            if row["failed"] > row["cases"] or row["waived"] > row["cases"]:
                return f"kernels[{i}].stats[{j}] counts more failed or waived cases than cases"
    return None


def _wrong(value, kind, where: str) -> str | None:
    """What is wrong with `value` as `kind`, at `where` (a field's path), or None."""
    if isinstance(kind, dict):
        if not isinstance(value, dict):
            return f"{where or 'the file'} must be an object, got {_named(value)}"
        for name, inner in kind.items():
            field = name.rstrip("?")
            if field not in value:
                if name.endswith("?"):
                    continue
                return f"{where or 'the file'} is missing a field the schema requires: {field}"
            problem_ = _wrong(value[field], inner, f"{where}.{field}" if where else field)
            if problem_:
                return problem_
        return None
    if isinstance(kind, Each):
        if not isinstance(value, dict):
            return f"{where} must be an object, got {_named(value)}"
        for key, inner in value.items():
            if kind.words and len(key.split(" ")) != kind.words:
                return f"{where} has the key {key[:80]!r}, which is not {kind.words} words"
            problem_ = _wrong(inner, kind.kind, f"{where}[{key[:80]!r}]")
            if problem_:
                return problem_
        return None
    if isinstance(kind, Items):
        if not isinstance(value, list):
            return f"{where} must be a list, got {_named(value)}"
        return next((p for i, item in enumerate(value) if (p := _wrong(item, kind.kind, f"{where}[{i}]"))), None)
    return None if _is(value, kind) else f"{where} must be {kind}, got {_named(value)}"


def _is(value, kind: str) -> bool:
    if kind == COUNT:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if kind == NUMBER:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)) or value in ("nan", "inf", "-inf")
    if kind == TEXT:
        return isinstance(value, str)
    if kind == FLAG:
        return isinstance(value, bool)
    return True


def _named(value) -> str:
    """A value as a field's complaint shows it: short, and printable."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}..."
