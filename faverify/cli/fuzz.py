"""faverify fuzz | repro | kernels."""
from __future__ import annotations

import contextlib
import signal
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from faverify.case import Case
from faverify.cli import app
from faverify.errors import EnvironmentProblem, UsageError

stderr = Console(stderr=True)


class Mode(str, Enum):
    fwd = "fwd"
    bwd = "bwd"
    both = "both"


def tolerance_from(factor: Optional[str], atol: Optional[str]):
    from faverify.verdict import DEFAULT_ATOL, DEFAULT_FACTOR, Tolerance, parse_overrides
    return Tolerance(factor=parse_overrides(factor, DEFAULT_FACTOR, "--factor"),
                     atol=parse_overrides(atol, DEFAULT_ATOL, "--atol"))


FactorOpt = Annotated[Optional[str], typer.Option(help="Allowed multiple of the baseline error: NUMBER or "
                                                       "TENSOR=NUMBER,... (defaults out=2,lse=2,dq=3,dk=3,dv=3)")]
AtolOpt = Annotated[Optional[str], typer.Option(help="Floor in units of u(dtype)*scale_T: NUMBER or TENSOR=NUMBER,... "
                                                     "(default 1 for every tensor)")]
DeviceOpt = Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:INDEX | all")]


class _Speed(ProgressColumn):
    def render(self, task) -> Text:
        return Text(f"{task.speed:6.1f} cases/s" if task.speed else "     - cases/s")


class _Lines:
    """Progress when stderr is not a terminal (CI logs, a remote run): a line every 10 seconds."""

    def __init__(self, every: float = 10.0):
        self.every = every

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, name, total, failed=0):
        return {"name": name, "total": total, "done": 0, "failed": failed, "start": time.perf_counter(),
                "last": time.perf_counter()}

    def update(self, task, advance=1, failed=None):
        task["done"] += advance
        task["failed"] = task["failed"] if failed is None else failed
        now = time.perf_counter()
        if now - task["last"] >= self.every or task["done"] == task["total"]:
            task["last"] = now
            rate = task["done"] / max(now - task["start"], 1e-9)
            stderr.print(f"{task['name']}: {task['done']}/{task['total']} cases, {rate:.1f} cases/s, "
                         f"failed {task['failed']}", markup=False, highlight=False)


def progress_bar():
    if not stderr.is_terminal:
        return _Lines()
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _Speed(),
                    TextColumn("failed {task.fields[failed]}"), TimeElapsedColumn(), console=stderr)


def _progress_factory(progress, total: int):
    def factory(name: str):
        task = progress.add_task(name, total=total, failed=0)
        failed = 0

        def update(result) -> None:
            nonlocal failed
            failed += result.failed
            progress.update(task, advance=1, failed=failed)
        return update
    return factory


@app.command()
def fuzz(
    kernel: Annotated[str, typer.Option(help="Subjects, comma separated: built-in names or package.module:function")] = "sdpa-math",
    iters: Annotated[int, typer.Option(help="Cases per kernel")] = 200,
    seed: Annotated[int, typer.Option(help="Same seed, same cases")] = 0,
    dtype: Annotated[str, typer.Option(help="Comma separated: bf16, fp16, fp32")] = "bf16,fp16",
    mode: Annotated[Mode, typer.Option(help="Check the forward (out, lse), the backward (dq, dk, dv) or both")] = Mode.both,
    device: DeviceOpt = "auto",
    max_seqlen: Annotated[Optional[int], typer.Option(help="Longest seqlen drawn (default 256 on CPU, 2048 on GPU)")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the full results as JSON")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="Write the report as Markdown")] = None,
    factor: FactorOpt = None,
    atol: AtolOpt = None,
    gradcheck_every: Annotated[int, typer.Option(help="Finite-difference gradient check every N cases (0: never)")] = 25,
    db: Annotated[Optional[Path], typer.Option(help="Hypothesis example database (failures found are tried first "
                                                    "next time)")] = Path(".faverify/examples"),
    no_db: Annotated[bool, typer.Option("--no-db", help="Use no example database")] = False,
    shrink_budget: Annotated[int, typer.Option(help="Evaluations spent shrinking each distinct failure")] = 300,
    workers: Annotated[Optional[int], typer.Option(help="Worker processes per device (default: 1 on the CPU, "
                                                        "6 per GPU: a GPU case is bound by launches)")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds one case may take before its worker is killed")] = 300.0,
    isolate: Annotated[bool, typer.Option(help="Run subjects in worker processes, so a crash or a hang is a "
                                               "failing case, not the end of the run")] = True,
) -> int:
    """Fuzz kernels against the FP64 reference; shrink each failure to a minimal case."""
    from faverify import devices
    from faverify.dtypes import parse_dtypes
    from faverify.fuzz import FuzzPlan, run
    from faverify.report import render
    from faverify.strategies import limits_for
    from faverify.subjects import resolve_many

    if iters < 1:
        raise UsageError("--iters", iters, "must be >= 1")
    if gradcheck_every < 0:
        raise UsageError("--gradcheck-every", gradcheck_every, "must be >= 0")
    if max_seqlen is not None and max_seqlen < 1:
        raise UsageError("--max-seqlen", max_seqlen, "must be >= 1")
    if shrink_budget < 0:
        raise UsageError("--shrink-budget", shrink_budget, "must be >= 0")
    if workers is not None and workers < 1:
        raise UsageError("--workers", workers, "must be >= 1")
    if timeout <= 0:
        raise UsageError("--timeout", timeout, "must be > 0 seconds")
    dtypes = parse_dtypes(dtype)
    tolerance = tolerance_from(factor, atol)
    subjects = resolve_many(kernel)  # unknown kernels fail here, before any work
    targets = devices.resolve(device)
    if workers is None:
        workers = 1 if targets[0].type == "cpu" else 6
    if not isolate and (workers > 1 or len(targets) > 1):
        raise UsageError("--no-isolate", True, "runs in this process: one device and one worker only")
    plan = FuzzPlan(iters=iters, seed=seed, dtypes=dtypes, limits=limits_for(targets[0].type, max_seqlen),
                    database=None if no_db else db, gradcheck_every=gradcheck_every, shrink_budget=shrink_budget)
    command = (f"fuzz --kernel {kernel} --iters {iters} --seed {seed} --dtype {','.join(dtypes)} "
               f"--mode {mode.value} --device {device}" + (f" --max-seqlen {max_seqlen}" if max_seqlen else ""))
    with progress_bar() as progress, _sigterm_interrupts():
        result = run([s.name for s in subjects], plan, targets, mode=mode.value, tolerance=tolerance,
                     command=command, workers=workers, isolate=isolate, timeout=timeout,
                     progress_factory=_progress_factory(progress, iters))
    _write_outputs(result, json_path, markdown)
    stderr.print(render(result, "table"), markup=False, highlight=False, soft_wrap=True)
    return _exit_code(result)


def _write_outputs(result, json_path: Optional[Path], markdown: Optional[Path]) -> None:
    from faverify.report import render
    if json_path:
        result.write(json_path)
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(render(result, "md"))


@contextlib.contextmanager
def _sigterm_interrupts():
    """A run killed with SIGTERM (a CI timeout, `timeout`) stops like Ctrl-C: results so far are written."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread (some test runners): nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_code(result) -> int:
    if result.settings.get("interrupted") and not result.failed:
        raise EnvironmentProblem(f"interrupted after {result.ran} cases with no failure; the results so far "
                                 "were written")
    if result.ran == 0:
        reasons = {r for k in result.kernels for r in k["summary"]["skip_reasons"]}
        raise EnvironmentProblem("no case ran: every case was skipped ("
                                 + "; ".join(sorted(reasons)[:3]) + ")")
    return 1 if result.failed else 0


@app.command()
def repro(
    kernel: Annotated[str, typer.Option(help="The subject to run")],
    case: Annotated[str, typer.Option(help="The case as JSON, or @FILE holding it")],
    device: DeviceOpt = "auto",
    mode: Annotated[Mode, typer.Option()] = Mode.both,
    factor: FactorOpt = None,
    atol: AtolOpt = None,
) -> int:
    """Run one case (as printed by fuzz) and print its error table."""
    from faverify import devices
    from faverify.report import METRIC_HEADERS, metrics_rows, table
    from faverify.runner import evaluate
    from faverify.subjects import resolve

    text = case
    if case.startswith("@"):
        try:
            text = Path(case[1:]).read_text()
        except OSError as e:
            raise UsageError("--case", case, f"cannot read the file ({e.strerror})") from None
    the_case = Case.from_json(text)
    subject = resolve(kernel)
    target = devices.resolve(device)[0]
    result = evaluate(subject, the_case, target, mode=mode.value, tolerance=tolerance_from(factor, atol))
    stderr.print(f"{kernel} on {target}: {the_case.short()}", markup=False, highlight=False)
    if result.metrics:
        stderr.print(table(metrics_rows(result.metrics), METRIC_HEADERS, "table"), markup=False, highlight=False)
    stderr.print(f"verdict: {result.status}" + (f" ({result.reason})" if result.reason else ""), markup=False,
                 highlight=False)
    if result.status == "skip":
        raise EnvironmentProblem(f"the case was skipped: {result.reason}")
    return 1 if result.failed else 0


@app.command()
def kernels() -> int:
    """List the built-in subjects and what each supports."""
    from faverify.report import table
    from faverify.subjects import builtin_names, resolve

    rows = []
    for name in builtin_names():
        try:
            s = resolve(name)
        except Exception as e:  # a subject that cannot load is listed with the reason
            rows.append([name, "unavailable", "", "", "", "", f"{type(e).__name__}: {e}"])
            continue
        c = s.caps
        rows.append([name, ",".join(c.dtypes), ",".join(c.devices), f"{c.min_head_dim}..{c.max_head_dim}",
                     "yes" if c.gqa else "no", ",".join(c.init_modes) if c.init_modes else "n/a", s.description])
    typer.echo(table(rows, ["kernel", "dtypes", "devices", "head dims", "GQA", "init", "description"], "table"))
    return 0


@app.command()
def bench(
    kernel: Annotated[str, typer.Option(help="Subjects to time next to the SDPA backends, comma separated")] = "triton",
    seqlens: Annotated[str, typer.Option(help="Comma separated")] = "1024,4096,16384",
    headdims: Annotated[str, typer.Option(help="Comma separated")] = "64,128",
    dtype: Annotated[str, typer.Option(help="Comma separated: bf16, fp16")] = "bf16,fp16",
    causal: Annotated[str, typer.Option(help="both | true | false")] = "both",
    mode: Annotated[Mode, typer.Option(help="Time the forward, the backward, or both")] = Mode.both,
    tune: Annotated[bool, typer.Option(help="Try the candidate tiles of the bundled Triton kernels per shape")] = True,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the rows as JSON")] = None,
    device: DeviceOpt = "cuda",
) -> int:
    """TFLOP/s of kernels next to torch SDPA (flash, cuDNN, efficient), each validated against FP64 first."""
    import json

    from faverify import devices
    from faverify.bench import YARDSTICKS, configs, measure, ratios
    from faverify.dtypes import parse_dtypes
    from faverify.report import fmt, table
    from faverify.subjects import resolve_many

    def ints(text: str, argument: str) -> list:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise UsageError(argument, text, "must be comma separated integers") from None
        if not values or min(values) < 1:
            raise UsageError(argument, text, "must be integers >= 1")
        return values

    choices = {"both": (False, True), "true": (True,), "false": (False,)}
    if causal not in choices:
        raise UsageError("--causal", causal, "must be both, true or false")
    head_dims = ints(headdims, "--headdims")
    if max(head_dims) > 256:
        raise UsageError("--headdims", headdims, "each head dim must be <= 256")
    target = devices.resolve(device)[0]
    if target.type != "cuda":
        raise EnvironmentProblem("bench times GPU kernels: it needs --device cuda and a GPU")
    names = list(dict.fromkeys([s.strip() for s in kernel.split(",") if s.strip()] + list(YARDSTICKS)))
    subjects = resolve_many(",".join(names))
    modes = ("fwd", "bwd") if mode == Mode.both else (mode.value,)
    rows = []
    interrupted = False
    with progress_bar() as progress, _sigterm_interrupts():
        todo = configs(parse_dtypes(dtype), head_dims, ints(seqlens, "--seqlens"), choices[causal])
        task = progress.add_task("bench", total=len(todo) * len(subjects), failed=0)
        try:
            for config in todo:
                for subject in subjects:
                    # tiles tuned for one 16-bit dtype serve the other (same element size, same tiles)
                    tuned_already = config.dtype != todo[0].dtype
                    rows.append(measure(subject, config, target, modes=modes, tune=tune and not tuned_already))
                    progress.update(task, advance=1)
        except KeyboardInterrupt:  # the rows measured so far are still written
            interrupted = True
    rows = ratios(rows)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"schema": "faverify.bench", "version": 1, "interrupted": interrupted,
                                         "rows": rows}, indent=1, default=str))
    shown = [[r["kernel"], r["dtype"], str(r["head_dim"]), "yes" if r["causal"] else "no", str(r["seqlen"]),
              fmt(r.get("fwd_tflops"), ".1f"), fmt(r.get("fwd_vs_sdpa-flash"), ".2f"), fmt(r.get("fwd_vs_sdpa-cudnn"), ".2f"),
              fmt(r.get("bwd_tflops"), ".1f"), fmt(r.get("bwd_vs_sdpa-flash"), ".2f"), fmt(r.get("bwd_vs_sdpa-cudnn"), ".2f"),
              r["validated"], " ".join(f"{k}:{v}" for k, v in r.get("tiles", {}).items()) or r.get("note", "")]
             for r in rows]
    typer.echo(table(shown, ["kernel", "dtype", "d", "causal", "seqlen", "fwd TF/s", "vs flash", "vs cudnn",
                             "bwd TF/s", "vs flash", "vs cudnn", "FP64 check", "tiles / note"], "table"))
    failed = [r for r in rows if r["validated"] == "fail"]
    if interrupted and not failed:
        raise EnvironmentProblem(f"interrupted after {len(rows)} measurements; those were written")
    return 1 if failed else 0


@app.command()
def mutants(
    iters: Annotated[int, typer.Option(help="Cases each mutant may take to be caught (and the control's cases)")] = 200,
    seed: Annotated[int, typer.Option()] = 0,
    dtype: Annotated[str, typer.Option(help="Comma separated: bf16, fp16, fp32")] = "bf16,fp16",
    device: DeviceOpt = "auto",
    only: Annotated[Optional[str], typer.Option(help="Comma separated mutant names (default: all)")] = None,
    shrink_budget: Annotated[int, typer.Option(help="Evaluations spent shrinking each kill")] = 40,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the results as JSON")] = None,
    isolate: Annotated[Optional[bool], typer.Option(help="Worker processes (default: on a GPU, where a mutant "
                                                          "can fault the context)")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds one case may take")] = 300.0,
) -> int:
    """Prove the fuzzer catches real bugs: fuzz each seeded-bug mutant of the Triton kernels, then the
    unmutated kernels (which must pass). Exit 1 if a mutant survives or the control fails."""
    import json

    from faverify import devices
    from faverify.dtypes import parse_dtypes
    from faverify.fuzz import FuzzPlan
    from faverify.kernels.mutants.catalog import BY_NAME
    from faverify.mutants import run_mutants
    from faverify.report import fmt, table
    from faverify.strategies import limits_for
    from faverify.verdict import Tolerance

    if iters < 1:
        raise UsageError("--iters", iters, "must be >= 1")
    names = [n.strip() for n in (only or ",".join(BY_NAME)).split(",") if n.strip()]
    for n in names:
        if n not in BY_NAME:
            raise UsageError("--only", n, f"unknown mutant; mutants: {', '.join(BY_NAME)}")
    targets = devices.resolve(device)[:1]
    plan = FuzzPlan(iters=iters, seed=seed, dtypes=parse_dtypes(dtype), limits=limits_for(targets[0].type),
                    database=None, shrink_budget=shrink_budget)
    isolate = targets[0].type == "cuda" if isolate is None else isolate
    with progress_bar() as progress, _sigterm_interrupts():
        report = run_mutants(names, plan, targets, tolerance=Tolerance(), isolate=isolate, timeout=timeout,
                             progress_factory=_progress_factory(progress, iters))
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1, default=str))
    rows = [[r["mutant"], "killed" if r["killed"] else ("SURVIVED" if not r["signature"] else
                                                        "NOT ATTRIBUTABLE (the control fails there too)"),
             str(r["cases_to_kill"] or "-"), r["signature"],
             _short_case(r["minimal_case"]), fmt(r["seconds"], ".1f")] for r in report["mutants"]]
    typer.echo(table(rows, ["mutant", "result", "cases to kill", "caught as", "minimal case", "seconds"], "table"))
    c = report["control"]
    typer.echo(f"\nkilled {report['killed']} of {len(report['mutants'])}, median cases to kill "
               f"{report['median_cases_to_kill']}; control (unmutated triton): {c['cases']} cases, "
               f"{c['failed']} failed" + (f" ({'; '.join(c['failures'])})" if c["failures"] else ""))
    return 1 if report["survived"] or c["failed"] or len(report["mutants"]) < len(names) else 0


def _short_case(case: Optional[dict]) -> str:
    return Case.from_dict(case).short() if case else ""
