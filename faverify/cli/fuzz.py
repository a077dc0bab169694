"""faverify fuzz."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cases.checks import MAX_CALLS
from faverify.cases.vocabulary import FEATURES
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
    progress_bar,
    progress_factory,
    say,
    show,
    within,
    write_outputs,
)
from faverify.errors import EnvironmentProblem, OwnError
from faverify.run.signals import held, sigterm_interrupts

FeaturesOpt = Annotated[Optional[str], typer.Option(
    help="Features drawn, comma separated (faverify.cases.vocabulary.FEATURES: " + ", ".join(FEATURES) + "), or "
         "none (dense only); default: every feature the kernel declares")]
SequenceOpt = Annotated[int, typer.Option(
    help="Draw call sequences: each example up to N calls of the subject in one process, each call a step from the "
         "one before it (the same shapes in another layout or dtype, new values, overflowing logits, rows with no "
         "key...), every call judged; 0: one call an example", callback=within(0, MAX_CALLS))]
RelationsOpt = Annotated[Optional[str], typer.Option(
    help="Relations between calls to measure on every subject, comma separated (batch, decode, repeat, splits): "
         "each batch entry alone against its row, the last query row alone against its row, the same call twice, "
         "one split against the case's splits, bit for bit; reported, failing only a subject that promises them")]
ShapesOpt = Annotated[Optional[int], typer.Option(
    help="A shape budget: every case takes one of N shapes (sizes, head dims, dtype, causal, layout, softmax "
         "scale) drawn from the seed, its values and variants its own; for subjects that compile or plan per "
         "shape. Default: 4 for a subject that declares its compile key (flex), none for the others; 0 lifts it",
    callback=within(0))]
IsolateOpt = Annotated[bool, typer.Option(
    help="Run subjects in worker processes, so a crash or a hang is a failing case, not the end of the run; "
         "--no-isolate runs them in this process, where a subject that ends it (a segfault, libc _exit) ends the "
         "run with no report")]


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
    features: FeaturesOpt = None,
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
    sequence: SequenceOpt = 0,
    relations: RelationsOpt = None,
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
    shapes: ShapesOpt = None,
    workers: Annotated[Optional[int], typer.Option(help="Worker processes per device (default: 1 on the CPU, "
                                                        "6 per GPU: a GPU case is bound by launches)",
                                                   callback=within(1, MAX_WORKERS))] = None,
    timeout: TimeoutOpt = 300.0,
    scale: ScaleOpt = Scale.normal,
    isolate: IsolateOpt = True,
) -> int:
    """Fuzz kernels against the FP64 reference; shrink each failure to a minimal case."""
    from faverify.commands.fuzz import FuzzRequest, prepare
    from faverify.run.fuzz import run
    request = FuzzRequest(kernel=kernel, iters=iters, seed=seed, dtype=dtype, mode=mode.value, device=device,
                          max_seqlen=max_seqlen, features=features, regimes=regimes, layouts=layouts, shard=shard,
                          repeat=repeat, sequence=sequence, relations=relations, shapes=shapes,
                          all_failures=all_failures, scale=scale.value, json=json_path, markdown=markdown,
                          factor=factor, atol=atol, tight=tight, gradcheck_every=gradcheck_every, db=db,
                          no_db=no_db, shrink_budget=shrink_budget, workers=workers, timeout=timeout,
                          isolate=isolate)
    with sigterm_interrupts():  # from the first moment: a stop before the first case still writes the run
        try:
            prepared = prepare(request)
        except KeyboardInterrupt:
            return _stopped_before_any_case(request)
        with progress_bar() as progress:
            result = run(prepared, progress_factory(progress, request.iters))
    with held():  # a signal now waits until everything asked for is written
        report(result, request.json, request.markdown)
    return _exit_code(result)


def _stopped_before_any_case(request) -> int:
    """A stop (Ctrl-C, SIGTERM, SIGHUP) before the first case: a run of no case, marked interrupted, is
    written where it was asked for, and the exit is 2: nothing was proven."""
    from faverify.commands.fuzz import nothing_ran
    with held():
        try:
            _write_outputs(nothing_ran(request), request.json, request.markdown)
        except EnvironmentProblem as e:
            say(f"faverify: {e}")
    raise EnvironmentProblem("interrupted before the first case: nothing ran; the empty run was written")


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
    """commands.fuzz.exit_code; for a stopped run, the same code as a Stopped, its error told here."""
    from faverify.cli.app import Stopped, tell
    from faverify.commands.fuzz import exit_code
    if not result.settings.get("interrupted"):
        return exit_code(result)
    try:
        return Stopped(exit_code(result))
    except (OwnError, EnvironmentProblem) as e:
        return Stopped(tell(e))
