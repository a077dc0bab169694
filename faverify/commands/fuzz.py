"""`faverify fuzz`: the command's options as one typed request (FuzzRequest), the command line it stands for,
and the checks that prepare it into what runs (run.request.FuzzRun), before any case or folder.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from faverify.errors import EnvironmentProblem, OwnError, UsageError

if TYPE_CHECKING:  # the command line imports this module: what runs loads torch, and only once it runs
    from faverify.run.request import FuzzRun

ALWAYS, SET, CHANGED = "always", "set", "changed"  # when an option shows in the command line (FuzzRequest.command)


def _option(default, flag: str, shown: str = "", show: Callable[[object], str] = str):
    """A field of FuzzRequest: its flag, when the command line shows it (ALWAYS; SET: given at all; CHANGED:
    other than its default; "": never, as the outputs and the run's resources) and how (show)."""
    return field(default=default, metadata={"flag": flag, "shown": shown, "show": show})


def _dtypes(text: str) -> str:
    from faverify.dtypes import parse_fuzz_dtypes
    dtypes, fp8_only = parse_fuzz_dtypes(text)
    return ",".join(("fp8",) if fp8_only else dtypes)


def _shard(text: str) -> str:
    from faverify.reports.merge import parse_shard
    return "{}/{}".format(*parse_shard(text))


@dataclass(frozen=True)
class FuzzRequest:
    """The options of `faverify fuzz` as given, in the order its command line shows them (command)."""
    kernel: str = _option("triton", "--kernel", ALWAYS)
    iters: int = _option(100, "--iters", ALWAYS)
    seed: int = _option(0, "--seed", ALWAYS)
    dtype: str = _option("bf16,fp16", "--dtype", ALWAYS, _dtypes)
    mode: str = _option("both", "--mode", ALWAYS)
    device: str = _option("auto", "--device", ALWAYS)
    max_seqlen: int | None = _option(None, "--max-seqlen", SET)
    features: str | None = _option(None, "--features", SET)
    regimes: str | None = _option(None, "--regimes", SET)
    layouts: str | None = _option(None, "--layouts", SET)
    shard: str | None = _option(None, "--shard", SET, _shard)
    repeat: int = _option(1, "--repeat", CHANGED)
    sequence: int = _option(0, "--sequence", CHANGED)
    relations: str | None = _option(None, "--relations", SET)
    shapes: int | None = _option(None, "--shapes", SET)
    all_failures: bool = _option(False, "--all-failures", CHANGED)
    scale: str = _option("normal", "--scale", CHANGED)
    json: Path | None = _option(None, "--json")
    markdown: Path | None = _option(None, "--markdown")
    factor: str | None = _option(None, "--factor")
    atol: str | None = _option(None, "--atol")
    tight: str | None = _option(None, "--tight")
    gradcheck_every: int = _option(25, "--gradcheck-every")
    db: Path = _option(Path(".faverify/examples"), "--db")
    no_db: bool = _option(False, "--no-db")
    shrink_budget: int = _option(300, "--shrink-budget")
    workers: int | None = _option(None, "--workers")
    timeout: float = _option(300.0, "--timeout")
    isolate: bool = _option(True, "--isolate")

    def command(self, only: tuple = ()) -> str:
        """The command line, normalized, for the run file and the report's heading: the options that say
        which cases ran and how they were judged, each shown as the field says (only: those fields alone)."""
        words = ["fuzz"]
        for f in fields(self):
            value, shown = getattr(self, f.name), f.metadata["shown"]
            if only and f.name not in only or not shown:
                continue
            if shown == SET and value in (None, "") or shown == CHANGED and value == f.default:
                continue
            words += [f.metadata["flag"]] if value is True else [f.metadata["flag"], f.metadata["show"](value)]
        return " ".join(words)


def parse_features(text: str | None) -> tuple | None:
    """--features: None (the kernel's own), () for "none", or the named features in FEATURES order."""
    from faverify.cases.vocabulary import FEATURES
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["none"]:
        return ()
    if not names:
        raise UsageError("--features", text, f"give none, or some of {', '.join(FEATURES)}")
    for n in names:
        if n not in FEATURES:
            raise UsageError("--features", n, f"each feature must be one of {', '.join(FEATURES)} (or none alone)")
    return tuple(f for f in FEATURES if f in names)


def prepare(request: FuzzRequest) -> FuzzRun:
    """The request checked, its options against each other, its subjects loaded (an unknown kernel fails
    here, before any work or folder) and its outputs writable: what runs."""
    from faverify import devices
    from faverify.cases.strategies import limits_for
    from faverify.dtypes import parse_fuzz_dtypes
    from faverify.judge.verdict import parse_tolerance
    from faverify.reports.merge import parse_shard
    from faverify.run.isolation import check_imports
    from faverify.run.plan import FuzzPlan, Judging
    from faverify.run.request import FuzzRun, subject_plan
    from faverify.run.signals import stop_if_early
    from faverify.subjects import resolve_many
    stop_if_early()  # a stop while the command was still importing
    r = request
    dtypes, fp8_only = parse_fuzz_dtypes(r.dtype)
    tolerance = parse_tolerance(r.factor, r.atol, r.tight)
    wanted = ("fp8",) if fp8_only else parse_features(r.features)
    if fp8_only and r.features is not None:
        raise UsageError("--features", r.features, "--dtype fp8 draws FP8 cases alone, which take no other feature: "
                                                   "leave --features out")
    shard = parse_shard(r.shard) if r.shard is not None else None
    if shard is not None and not r.isolate:
        raise UsageError("--no-isolate", True, "a shard runs its part of the seed's up-front draw in worker "
                                               "processes: leave --no-isolate out")
    check_imports(r.kernel, r.timeout)  # a module that ends its process at import ends a worker's
    narrow = _narrowed(r, fp8_only)
    subjects = resolve_many(r.kernel)
    if r.scale == "large":
        _check_large(r, fp8_only, narrow, subjects, wanted)
    _check_outputs(r)
    _check_subjects(r, subjects, wanted, fp8_only)
    targets = devices.resolve(r.device)
    workers = r.workers or (1 if r.scale == "large" else devices.default_workers(targets[0]))
    if not r.isolate and (workers > 1 or len(targets) > 1):
        raise UsageError("--no-isolate", True, "runs in this process: one device and one worker only")
    plan = FuzzPlan(iters=r.iters, seed=r.seed, dtypes=dtypes, limits=limits_for(targets[0].type, r.max_seqlen),
                    database=None if r.no_db else r.db, gradcheck_every=r.gradcheck_every,
                    shrink_budget=r.shrink_budget, narrow=narrow or None, shard=shard, shapes=r.shapes,
                    all_failures=r.all_failures, sequence=r.sequence, scale=r.scale)
    each = tuple(subject_plan(s, plan, s.caps.features() if wanted is None else wanted, s.caps.draw())
                 for s in subjects)
    return FuzzRun(r.command(), plan, each, tuple(targets), Judging(r.mode, tolerance, r.repeat, _measured(r),
                                                                     r.timeout), workers, r.isolate)


def _narrowed(r: FuzzRequest, fp8_only: bool) -> dict:
    """strategies.cases' arguments the options narrow the draw with: --regimes, --layouts, --dtype fp8."""
    from faverify.cases.vocabulary import LAYOUTS, REGIMES, parse_choice
    narrow = {name: parse_choice(text, allowed, f"--{name}") for name, text, allowed
              in (("regimes", r.regimes, REGIMES), ("layouts", r.layouts, LAYOUTS)) if text is not None}
    return {**narrow, **({"fp8_only": True} if fp8_only else {})}


def _measured(r: FuzzRequest) -> tuple:
    from faverify.cases.vocabulary import parse_choice
    from faverify.subjects.base import RELATIONS
    return parse_choice(r.relations, RELATIONS, "--relations") if r.relations is not None else ()


def _check_outputs(r: FuzzRequest) -> None:
    """The run file, the report and the example store can be written when the run ends."""
    from faverify.files import check_distinct, check_writable
    check_distinct(json=r.json, markdown=r.markdown)
    check_writable("--json", r.json)
    check_writable("--markdown", r.markdown)
    if not r.no_db:
        check_writable("--db", r.db, directory=True)


def _check_subjects(r: FuzzRequest, subjects: list, wanted: tuple | None, fp8_only: bool) -> None:
    """Each subject takes what the options draw: FP8 cases, the lengths, the features named."""
    for s in subjects if fp8_only else ():
        if not s.caps.fp8.granularities:
            raise UsageError("--dtype", "fp8", f"{s.name} does not declare fp8, so it takes no FP8 case")
    for s in subjects if r.max_seqlen is not None else ():
        if r.max_seqlen < s.caps.seqlen_multiple:
            raise UsageError("--max-seqlen", r.max_seqlen, f"{s.name} takes sequence lengths that are multiples "
                                                           f"of {s.caps.seqlen_multiple} alone (seqlen_multiple)")
    for s in subjects if wanted and not fp8_only else ():
        undeclared = [f for f in wanted if f not in s.caps.features()]
        if undeclared:
            raise UsageError("--features", r.features, f"{s.name} does not declare {', '.join(undeclared)}, so "
                                                       f"no case of it would draw that (it declares: "
                                                       f"{', '.join(s.caps.features()) or 'no feature'})")


def _check_large(r: FuzzRequest, fp8_only: bool, narrow: dict, subjects: list, wanted: tuple | None) -> None:
    """What a large case does not take: several calls in one example, a second call of the same case (the
    relations and --repeat: more copies of tensors past 2^31 elements), FP8 inputs, the regimes and layouts
    it does not draw, a subject with neither dense batches nor paged caches."""
    from faverify.cases import large
    for option, given, why in (("--sequence", r.sequence, "draws one call an example: leave --sequence out"),
                               ("--relations", r.relations, "calls each case once: leave --relations out"),
                               ("--repeat", r.repeat if r.repeat > 1 else None,
                                "calls each case once: leave --repeat out"),
                               ("--dtype", "fp8" if fp8_only else None, "draws bf16, fp16 and fp32 inputs")):
        if given:
            raise UsageError(option, given, f"--scale large {why}")
    for s in subjects:  # the draw's own checks, before any work
        large.cases(**{**narrow, **s.caps.draw(), "features": s.caps.features() if wanted is None else wanted})


def nothing_ran(request: FuzzRequest):
    """The run of a fuzz stopped before its first case: no case, marked interrupted."""
    from faverify import env as environment
    from faverify.judge.verdict import Tolerance
    from faverify.reports.collector import KernelStats
    from faverify.reports.results import Run
    names = [n.strip() for n in request.kernel.split(",") if n.strip()] or [request.kernel]
    return Run.from_stats(request.command(only=("kernel",)), environment.collect(), {"interrupted": True},
                          Tolerance().to_dict(), [KernelStats(kernel=n) for n in names])


def exit_code(result) -> int:
    """The exit code of a fuzz's run: 1 where it found a failure, 0 where every case passed; faverify's own
    error on a case, a stop before any failure, or no case run at all raise (exit 2)."""
    if result.errors:
        first = next(r for k in result.kernels for r in k["summary"].get("error_reasons", []))
        raise OwnError(f"faverify's own code raised on {result.errors} case(s), a bug in faverify, not in the "
                       f"kernel; the results were written; the first: {first.splitlines()[0]}")
    if result.settings.get("interrupted") and not result.failed:
        raise EnvironmentProblem(f"interrupted after {result.ran} cases with no failure; the results so far "
                                 "were written")
    if result.ran == 0:
        reasons = {r for k in result.kernels for r in k["summary"]["skip_reasons"]}
        raise EnvironmentProblem("no case ran: every case was skipped ("
                                 + "; ".join(sorted(reasons)[:3]) + ")")
    return 1 if result.failed else 0
