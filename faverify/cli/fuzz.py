"""faverify fuzz."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cases.checks import MAX_CALLS
from faverify.cases.vocabulary import FEATURES, LAYOUTS, REGIMES
from faverify.cli.app import app
from faverify.cli.common import (
    MAX_WORKERS,
    AtolOpt,
    DeviceOpt,
    FactorOpt,
    MaxSeqlenOpt,
    Mode,
    Scale,
    ScaleOpt,
    TightOpt,
    TimeoutOpt,
    check_distinct,
    check_writable,
    parse_choice,
    progress_bar,
    progress_factory,
    say,
    show,
    tolerance_from,
    within,
    write_outputs,
)
from faverify.errors import EnvironmentProblem, OwnError, UsageError
from faverify.run.signals import held, sigterm_interrupts, stop_if_early


@app.command()
def fuzz(
    kernel: Annotated[str, typer.Option(help="Subjects, comma separated: built-in names (faverify kernels), "
                                             "package.module:function, or mutant:NAME")] = "triton",
    iters: Annotated[int, typer.Option(help="Cases per kernel", callback=within(1, 10**9))] = 100,
    seed: Annotated[int, typer.Option(help="Same seed, same cases", callback=within(0, 2**63 - 1))] = 0,
    dtype: Annotated[str, typer.Option(help="Comma separated: bf16, fp16, fp32; or fp8 alone, every case "
                                                    "FP8 (q, k, v in e4m3 with descales, out bf16)")] = "bf16,fp16",
    mode: Annotated[Mode,
                    typer.Option(help="Check the forward (out, lse), the backward (dq, dk, dv) or both")] = Mode.both,
    device: DeviceOpt = "auto",
    max_seqlen: MaxSeqlenOpt = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the full results as JSON")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="Write the report as Markdown")] = None,
    features: Annotated[Optional[str],
                        typer.Option(help="Features drawn, comma separated (faverify.cases.vocabulary.FEATURES: "
                                                         + ", ".join(FEATURES) + "), or none (dense only); "
                                                         "default: every feature the kernel declares")] = None,
    regimes: Annotated[Optional[str],
                       typer.Option(help="Value regimes drawn, comma separated (faverify.cases.vocabulary.REGIMES), "
                                                        "or each with a leading - to draw all but those")] = None,
    layouts: Annotated[Optional[str], typer.Option(help="Memory layouts drawn, comma separated "
                                                        "(faverify.cases.vocabulary.LAYOUTS), or all but those "
                                                        "given with -")] = None,
    shard: Annotated[Optional[str], typer.Option(help="I/N: run shard I (0-based) of N of the seed's cases; "
                                                     "`faverify merge` makes one run of the N run files")] = None,
    repeat: Annotated[int, typer.Option(help="Run each case N times; outputs that differ in any bit fail it "
                                             "(\"nondeterministic\")", callback=within(1, 1000))] = 1,
    sequence: Annotated[int, typer.Option(
        help="Draw call sequences: each example up to N calls of the subject in one process, each call a step "
             "from the one before it (the same shapes in another layout or dtype, new values, overflowing "
             "logits, rows with no key...), every call judged; 0: one call an example",
        callback=within(0, MAX_CALLS))] = 0,
    relations: Annotated[Optional[str], typer.Option(
        help="Relations between calls to measure on every subject, comma separated (batch, decode, repeat, "
             "splits): each batch entry alone against its row, the last query row alone against its row, the "
             "same call twice, one split against the case's splits, bit for bit; reported, failing only a "
             "subject that promises them")] = None,
    factor: FactorOpt = None,
    atol: AtolOpt = None,
    tight: TightOpt = None,
    gradcheck_every: Annotated[int, typer.Option(help="Finite-difference gradient check every N cases (0: never)",
                                                 callback=within(0))] = 25,
    db: Annotated[Optional[Path], typer.Option(help="Example store: the failures found are replayed first next "
                                                    "time, reported apart; the seeded draw never depends on it")]
    = Path(".faverify/examples"),
    no_db: Annotated[bool, typer.Option("--no-db", help="Use no example store")] = False,
    shrink_budget: Annotated[int, typer.Option(help="Evaluations spent shrinking each distinct failure",
                                               callback=within(0, 10**6))] = 300,
    all_failures: Annotated[bool, typer.Option("--all-failures", help="Shrink every distinct signature as a "
                                               "failure of its own; by default one failure per root, the other "
                                               "signatures of its cases reported with it")] = False,
    shapes: Annotated[Optional[int], typer.Option(help="A shape budget: every case takes one of N shapes "
                                                  "(sizes, head dims, dtype, causal, layout, softmax scale) drawn "
                                                  "from the seed, its values and variants its own; for subjects "
                                                  "that compile or plan per shape. Default: 4 for a subject that "
                                                  "declares its compile key (flex), none for the others; 0 lifts "
                                                  "it", callback=within(0))] = None,
    workers: Annotated[Optional[int], typer.Option(help="Worker processes per device (default: 1 on the CPU, "
                                                        "6 per GPU: a GPU case is bound by launches)",
                                                   callback=within(1, MAX_WORKERS))] = None,
    timeout: TimeoutOpt = 300.0,
    scale: ScaleOpt = Scale.normal,
    isolate: Annotated[bool, typer.Option(help="Run subjects in worker processes, so a crash or a hang is a "
                                               "failing case, not the end of the run; --no-isolate runs them in "
                                               "this process, where a subject that ends it (a segfault, libc "
                                               "_exit) ends the run with no report")] = True,
) -> int:
    """Fuzz kernels against the FP64 reference; shrink each failure to a minimal case."""
    with sigterm_interrupts():  # from the first moment: a stop before the first case still writes the run
        try:
            subjects, plan, settings = _plan(locals())
        except KeyboardInterrupt:
            return _stopped_before_any_case(kernel, json_path, markdown)
        result = _run(subjects, plan, settings)
    with held():  # a signal now waits until everything asked for is written
        report(result, json_path, markdown)
    return _exit_code(result)


def _plan(given: dict) -> tuple:
    """The options checked against each other, the subjects loaded (an unknown kernel fails here, before any
    work or folder), the outputs checked writable: (subjects, FuzzPlan, the run's other settings)."""
    from faverify import devices
    from faverify.cases.strategies import limits_for
    from faverify.dtypes import parse_fuzz_dtypes
    from faverify.reports.merge import parse_shard
    from faverify.run.isolation import check_imports
    from faverify.run.plan import FuzzPlan
    from faverify.subjects import resolve_many
    from faverify.subjects.base import RELATIONS
    stop_if_early()  # a stop while the command was still importing
    g = dict(given)
    dtypes, fp8_only = parse_fuzz_dtypes(g["dtype"])
    tolerance = tolerance_from(g["factor"], g["atol"], g["tight"])
    wanted = ("fp8",) if fp8_only else parse_features(g["features"])
    if fp8_only and g["features"] is not None:
        raise UsageError("--features", g["features"], "--dtype fp8 draws FP8 cases alone, which take no other "
                                                      "feature: leave --features out")
    shard_of = parse_shard(g["shard"]) if g["shard"] is not None else None
    if shard_of is not None and not g["isolate"]:
        raise UsageError("--no-isolate", True, "a shard runs its part of the seed's up-front draw in worker "
                                               "processes: leave --no-isolate out")
    check_imports(g["kernel"], g["timeout"])  # a module that ends its process at import ends a worker's
    narrow = {name: parse_choice(text, allowed, f"--{name}") for name, text, allowed
              in (("regimes", g["regimes"], REGIMES), ("layouts", g["layouts"], LAYOUTS)) if text is not None}
    narrow.update({"fp8_only": True} if fp8_only else {})
    large = g["scale"] == Scale.large
    subjects = resolve_many(g["kernel"])
    if large:
        _check_large(g, fp8_only, narrow, subjects, wanted)
    check_distinct(json=g["json_path"], markdown=g["markdown"])
    check_writable("--json", g["json_path"])
    check_writable("--markdown", g["markdown"])
    if not g["no_db"]:
        check_writable("--db", g["db"], directory=True)
    for s in subjects if fp8_only else ():
        if not s.caps.fp8:
            raise UsageError("--dtype", "fp8", f"{s.name} does not declare fp8, so it takes no FP8 case")
    for s in subjects if g["max_seqlen"] is not None else ():
        if g["max_seqlen"] < s.caps.seqlen_multiple:
            raise UsageError("--max-seqlen", g["max_seqlen"], f"{s.name} takes sequence lengths that are multiples "
                                                              f"of {s.caps.seqlen_multiple} alone (seqlen_multiple)")
    for s in subjects if wanted and not fp8_only else ():
        undeclared = [f for f in wanted if f not in s.caps.features()]
        if undeclared:
            raise UsageError("--features", g["features"], f"{s.name} does not declare {', '.join(undeclared)}, so "
                                                          f"no case of it would draw that (it declares: "
                                                          f"{', '.join(s.caps.features()) or 'no feature'})")
    targets = devices.resolve(g["device"])
    workers = g["workers"] or (1 if large else devices.default_workers(targets[0]))
    if not g["isolate"] and (workers > 1 or len(targets) > 1):
        raise UsageError("--no-isolate", True, "runs in this process: one device and one worker only")
    plan = FuzzPlan(iters=g["iters"], seed=g["seed"], dtypes=dtypes, limits=limits_for(targets[0].type,
                                                                                       g["max_seqlen"]),
                    database=None if g["no_db"] else g["db"], gradcheck_every=g["gradcheck_every"],
                    shrink_budget=g["shrink_budget"], narrow=narrow or None, shard=shard_of, shapes=g["shapes"],
                    all_failures=g["all_failures"], sequence=g["sequence"], scale=g["scale"].value)
    measure = parse_choice(g["relations"], RELATIONS, "--relations") if g["relations"] is not None else ()
    settings = dict(targets=targets, workers=workers, tolerance=tolerance, wanted=wanted, mode=g["mode"].value,
                    isolate=g["isolate"], timeout=g["timeout"], repeat=g["repeat"], measure=measure,
                    command=_command(g, ("fp8",) if fp8_only else dtypes, shard_of))
    return subjects, plan, settings


def _command(g: dict, dtypes: tuple, shard_of) -> str:
    """The fuzz command line, normalized, for the run file and the report's heading."""
    return (f"fuzz --kernel {g['kernel']} --iters {g['iters']} --seed {g['seed']} --dtype {','.join(dtypes)} "
            f"--mode {g['mode'].value} --device {g['device']}"
            + (f" --max-seqlen {g['max_seqlen']}" if g["max_seqlen"] else "")
            + (f" --features {g['features']}" if g["features"] else "")
            + (f" --regimes {g['regimes']}" if g["regimes"] else "")
            + (f" --layouts {g['layouts']}" if g["layouts"] else "")
            + (f" --shard {shard_of[0]}/{shard_of[1]}" if shard_of else "")
            + (f" --repeat {g['repeat']}" if g["repeat"] > 1 else "")
            + (f" --sequence {g['sequence']}" if g["sequence"] else "")
            + (f" --relations {g['relations']}" if g["relations"] else "")
            + (f" --shapes {g['shapes']}" if g["shapes"] is not None else "")
            + (" --all-failures" if g["all_failures"] else "")
            + (f" --scale {g['scale'].value}" if g["scale"] != Scale.normal else ""))


def _check_large(g: dict, fp8_only: bool, narrow: dict, subjects: list, wanted: tuple | None) -> None:
    """What a large case does not take: several calls in one example, a second call of the same case (the
    relations and --repeat: more copies of tensors past 2^31 elements), FP8 inputs, the regimes and layouts
    it does not draw, a subject with neither dense batches nor paged caches."""
    from faverify.cases import large
    for option, given, why in (("--sequence", g["sequence"], "draws one call an example: leave --sequence out"),
                               ("--relations", g["relations"], "calls each case once: leave --relations out"),
                               ("--repeat", g["repeat"] if g["repeat"] > 1 else None,
                                "calls each case once: leave --repeat out"),
                               ("--dtype", "fp8" if fp8_only else None, "draws bf16, fp16 and fp32 inputs")):
        if given:
            raise UsageError(option, given, f"--scale large {why}")
    for s in subjects:  # the draw's own checks, before any work
        large.cases(**{**narrow, **s.caps.draw(), "features": s.caps.features() if wanted is None else wanted})


def _run(subjects: list, plan, settings: dict):
    from faverify.run.fuzz import run
    wanted = settings["wanted"]
    with progress_bar() as progress:
        return run([s.name for s in subjects], plan, settings["targets"], mode=settings["mode"],
                   tolerance=settings["tolerance"], command=settings["command"], workers=settings["workers"],
                   isolate=settings["isolate"], timeout=settings["timeout"],
                   progress_factory=progress_factory(progress, plan.iters),
                   features={s.name: s.caps.features() if wanted is None else wanted for s in subjects},
                   conventions={s.name: s.caps.conventions.describe() for s in subjects}, repeat=settings["repeat"],
                   narrow_for={s.name: s.caps.draw() for s in subjects}, measure=settings["measure"],
                   compile_keys={s.name: s.compile_key for s in subjects if s.compile_key is not None})


def _stopped_before_any_case(kernel: str, json_path, markdown) -> int:
    """A stop (Ctrl-C, SIGTERM, SIGHUP) before the first case: a run of no case, marked interrupted, is
    written where it was asked for, and the exit is 2: nothing was proven."""
    from faverify import env as environment
    from faverify.judge.verdict import Tolerance
    from faverify.reports.collector import KernelStats
    from faverify.reports.results import Run
    with held():
        names = [n.strip() for n in kernel.split(",") if n.strip()] or [kernel]
        result = Run.from_stats(f"fuzz --kernel {kernel}", environment.collect(), {"interrupted": True},
                                Tolerance().to_dict(), [KernelStats(kernel=n) for n in names])
        try:
            _write_outputs(result, json_path, markdown)
        except EnvironmentProblem as e:
            say(f"faverify: {e}")
    raise EnvironmentProblem("interrupted before the first case: nothing ran; the empty run was written")


def parse_features(text: Optional[str]) -> tuple | None:
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


def report(result, json_path: Optional[Path], markdown: Optional[Path]) -> None:
    """The run file and the Markdown report written, then the report printed on stdout: a report that cannot
    be printed (a closed stdout, a pipe into head) loses neither. A file that could not be written is told
    after the report (exit 2)."""
    from faverify.reports.report import render
    try:
        _write_outputs(result, json_path, markdown)
    finally:
        show(render(result, "table"))


def _write_outputs(result, json_path: Optional[Path], markdown: Optional[Path]) -> None:
    """The run file and the Markdown report (check_writable made sure they can be written; a disk that
    fills up in between is told, exit 2)."""
    from faverify.reports.report import render
    write_outputs([("--json", json_path, result.to_text), ("--markdown", markdown, lambda: render(result, "md"))])


def _exit_code(result) -> int:
    from faverify.cli.app import INTERRUPTED_RUN
    INTERRUPTED_RUN["set"] = bool(result.settings.get("interrupted"))
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
