"""faverify fuzz."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cli.app import app
from faverify.cli.common import (AtolOpt, TightOpt, DeviceOpt, FactorOpt, MaxSeqlenOpt, Mode, TimeoutOpt,
                                 check_distinct, check_max_seqlen, check_shrink_budget, check_timeout, check_writable,
                                 progress_bar, write_outputs,
                                 parse_choice, progress_factory, say, tolerance_from)
from faverify.case import FEATURES, LAYOUTS, REGIMES
from faverify.errors import EnvironmentProblem, OwnError, UsageError
from faverify.signals import held, sigterm_interrupts


@app.command()
def fuzz(
    kernel: Annotated[str, typer.Option(help="Subjects, comma separated: built-in names (faverify kernels), "
                                             "package.module:function, or mutant:NAME")] = "triton",
    iters: Annotated[int, typer.Option(help="Cases per kernel")] = 100,
    seed: Annotated[int, typer.Option(help="Same seed, same cases")] = 0,
    dtype: Annotated[str, typer.Option(help="Comma separated: bf16, fp16, fp32")] = "bf16,fp16",
    mode: Annotated[Mode, typer.Option(help="Check the forward (out, lse), the backward (dq, dk, dv) or both")] = Mode.both,
    device: DeviceOpt = "auto",
    max_seqlen: MaxSeqlenOpt = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the full results as JSON")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="Write the report as Markdown")] = None,
    features: Annotated[Optional[str], typer.Option(help="Features drawn, comma separated (faverify.case.FEATURES: "
                                                         + ", ".join(FEATURES) + "), or none (dense only); "
                                                         "default: every feature the kernel declares")] = None,
    regimes: Annotated[Optional[str], typer.Option(help="Value regimes drawn, comma separated (faverify.case.REGIMES), "
                                                        "or each with a leading - to draw all but those")] = None,
    layouts: Annotated[Optional[str], typer.Option(help="Memory layouts drawn, comma separated "
                                                        "(faverify.case.LAYOUTS), or all but those given with -")] = None,
    shard: Annotated[Optional[str], typer.Option(help="I/N: run shard I (0-based) of N of the seed's cases; "
                                                     "`faverify merge` makes one run of the N run files")] = None,
    repeat: Annotated[int, typer.Option(help="Run each case N times; outputs that differ in any bit fail it "
                                             "(\"nondeterministic\")")] = 1,
    factor: FactorOpt = None,
    atol: AtolOpt = None,
    tight: TightOpt = None,
    gradcheck_every: Annotated[int, typer.Option(help="Finite-difference gradient check every N cases (0: never)")] = 25,
    db: Annotated[Optional[Path], typer.Option(help="Example store: the failures found are replayed first next "
                                                    "time, reported apart; the seeded draw never depends on it")]
    = Path(".faverify/examples"),
    no_db: Annotated[bool, typer.Option("--no-db", help="Use no example store")] = False,
    shrink_budget: Annotated[int, typer.Option(help="Evaluations spent shrinking each distinct failure")] = 300,
    shapes: Annotated[Optional[int], typer.Option(help="A shape budget: every case takes one of N shapes "
                                                  "(sizes, head dims, dtype, causal) drawn from the seed, its "
                                                  "values, layout and variants its own; for subjects that compile "
                                                  "or plan per shape (flex, sdpa-cudnn)")] = None,
    workers: Annotated[Optional[int], typer.Option(help="Worker processes per device (default: 1 on the CPU, "
                                                        "6 per GPU: a GPU case is bound by launches)")] = None,
    timeout: TimeoutOpt = 300.0,
    isolate: Annotated[bool, typer.Option(help="Run subjects in worker processes, so a crash or a hang is a "
                                               "failing case, not the end of the run")] = True,
) -> int:
    """Fuzz kernels against the FP64 reference; shrink each failure to a minimal case."""
    from faverify import devices
    from faverify.dtypes import parse_dtypes
    from faverify.fuzz import run
    from faverify.plan import FuzzPlan
    from faverify.report import render
    from faverify.strategies import limits_for
    from faverify.subjects import resolve_many

    if iters < 1:
        raise UsageError("--iters", iters, "must be >= 1")
    if not 0 <= seed < 2**63:
        raise UsageError("--seed", seed, "must be in 0..2^63-1")
    if gradcheck_every < 0:
        raise UsageError("--gradcheck-every", gradcheck_every, "must be >= 0")
    check_max_seqlen(max_seqlen)
    check_shrink_budget(shrink_budget)
    if workers is not None and workers < 1:
        raise UsageError("--workers", workers, "must be >= 1")
    check_timeout(timeout)
    if repeat < 1:
        raise UsageError("--repeat", repeat, "must be >= 1")
    if shapes is not None and shapes < 1:
        raise UsageError("--shapes", shapes, "must be >= 1")
    dtypes = parse_dtypes(dtype)
    tolerance = tolerance_from(factor, atol, tight)
    wanted = parse_features(features)
    from faverify.merge import parse_shard
    shard_of = parse_shard(shard) if shard is not None else None
    if shard_of is not None and not isolate:
        raise UsageError("--no-isolate", True, "a shard runs its part of the seed's up-front draw in worker "
                                               "processes: leave --no-isolate out")
    narrow = {name: parse_choice(text, allowed, f"--{name}") for name, text, allowed
              in (("regimes", regimes, REGIMES), ("layouts", layouts, LAYOUTS)) if text is not None}
    subjects = resolve_many(kernel)  # unknown kernels fail here, before any work or folder
    check_distinct(json=json_path, markdown=markdown)
    check_writable("--json", json_path)
    check_writable("--markdown", markdown)
    if not no_db:
        check_writable("--db", db, directory=True)
    for s in subjects if wanted else ():
        undeclared = [f for f in wanted if f not in s.caps.features()]
        if undeclared:
            raise UsageError("--features", features, f"{s.name} does not declare {', '.join(undeclared)}, so no "
                                                     f"case of it would draw that (it declares: "
                                                     f"{', '.join(s.caps.features()) or 'no feature'})")
    targets = devices.resolve(device)
    if workers is None:
        workers = devices.default_workers(targets[0])
    if not isolate and (workers > 1 or len(targets) > 1):
        raise UsageError("--no-isolate", True, "runs in this process: one device and one worker only")
    plan = FuzzPlan(iters=iters, seed=seed, dtypes=dtypes, limits=limits_for(targets[0].type, max_seqlen),
                    database=None if no_db else db, gradcheck_every=gradcheck_every, shrink_budget=shrink_budget,
                    narrow=narrow or None, shard=shard_of, shapes=shapes or 0)
    command = (f"fuzz --kernel {kernel} --iters {iters} --seed {seed} --dtype {','.join(dtypes)} "
               f"--mode {mode.value} --device {device}" + (f" --max-seqlen {max_seqlen}" if max_seqlen else "")
               + (f" --features {features}" if features else "")
               + (f" --regimes {regimes}" if regimes else "") + (f" --layouts {layouts}" if layouts else "")
               + (f" --shard {shard_of[0]}/{shard_of[1]}" if shard_of else "") + (f" --repeat {repeat}" if repeat > 1 else "")
               + (f" --shapes {shapes}" if shapes else ""))
    with progress_bar() as progress, sigterm_interrupts():
        result = run([s.name for s in subjects], plan, targets, mode=mode.value, tolerance=tolerance,
                     command=command, workers=workers, isolate=isolate, timeout=timeout,
                     progress_factory=progress_factory(progress, iters),
                     features={s.name: s.caps.features() if wanted is None else wanted for s in subjects},
                     conventions={s.name: s.caps.conventions.describe() for s in subjects}, repeat=repeat,
                     narrow_for={s.name: s.caps.draw() for s in subjects})
    with held():  # a signal now waits until everything asked for is written
        say(render(result, "table"))
        _write_outputs(result, json_path, markdown)
    return _exit_code(result)


def parse_features(text: Optional[str]) -> tuple | None:
    """--features: None (the kernel's own), () for "none", or the named features in FEATURES order."""
    from faverify.case import FEATURES
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


def _write_outputs(result, json_path: Optional[Path], markdown: Optional[Path]) -> None:
    """The run file and the Markdown report, after the terminal report was printed (check_writable made
    sure they can be written; a disk that fills up in between is told, exit 2)."""
    from faverify.report import render
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
