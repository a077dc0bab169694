"""faverify repro."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cases.case import Case
from faverify.cli.app import app
from faverify.cli.common import AtolOpt, DeviceOpt, FactorOpt, Mode, TightOpt, TimeoutOpt, show
from faverify.errors import EnvironmentProblem, UsageError


@app.command()
def repro(
    kernel: Annotated[str, typer.Option(help="The subject to run")],
    case: Annotated[str, typer.Option(help="The case as JSON, or @FILE holding it")],
    device: DeviceOpt = "auto",
    mode: Annotated[Mode, typer.Option()] = Mode.both,
    factor: FactorOpt = None,
    atol: AtolOpt = None,
    tight: TightOpt = None,
    timeout: TimeoutOpt = 300.0,
    gradcheck: Annotated[bool, typer.Option(
        "--gradcheck", help="Also run the finite-difference gradient check (fuzz runs it every --gradcheck-every "
                            "cases)")] = False,
    repeat: Annotated[int, typer.Option(help="Run the case N times; outputs that differ in any bit fail it "
                                             "(\"nondeterministic\")", min=1, max=1000)] = 1,
    isolate: Annotated[bool, typer.Option(help="Run the subject in a worker process, as fuzz does: a crash, a "
                                               "hang or an exit of the subject is a failing case")] = True,
    standalone: Annotated[Optional[Path], typer.Option(
        help="Also write FILE.py (and its inputs, FILE.pt) that runs this case with torch and the subject alone, "
             "without faverify: exit 1 while the error is past faverify's tolerance, 0 once fixed")] = None,
    plot: Annotated[Optional[Path], typer.Option(
        help="Also draw FILE.svg or FILE.png: the error of the tensor that failed, over (row, head-dim column), "
             "a panel per head, the subject's tile edges marked (needs matplotlib: pip install 'faverify[plot]')")]
    = None,
) -> int:
    """Run one case (as printed by fuzz) and print its error table. A case with `before` is a call sequence:
    those calls run first, in the same process, each judged."""
    from faverify import devices
    from faverify.judge.verdict import parse_tolerance
    from faverify.reports.case_result import own_error
    from faverify.run.evaluate import evaluate
    from faverify.run.guard import blame_lost_context
    from faverify.run.isolation import check_imports
    from faverify.subjects import resolve

    tolerance = parse_tolerance(factor, atol, tight)
    the_case = Case.from_json(_text("--case", case))
    check_imports(kernel, timeout)  # a module that ends its process at import ends a worker's, not this one
    subject = resolve(kernel)
    target = devices.resolve(device)[0]
    _check_files(standalone, plot, subject, the_case)
    if isolate:
        from faverify.run.isolation import Worker
        from faverify.run.plan import Judging
        from faverify.run.signals import sigterm_interrupts
        worker = Worker(kernel, str(target), Judging(mode.value, tolerance, repeat, timeout=timeout))
        try:
            with sigterm_interrupts():  # a stop ends the worker too, and what the kernel started
                result = worker.evaluate(the_case, gradcheck)
        finally:
            worker.stop()
    else:
        try:
            result = evaluate(subject, the_case, target, mode=mode.value, tolerance=tolerance,
                              gradcheck=gradcheck, repeat=repeat)
        except Exception as e:
            result = own_error(kernel, the_case, e, str(target))
            if not blame_lost_context(result):  # faverify's own bug: raised as every other command's is
                raise
        else:
            blame_lost_context(result)
    wrote, problem = [], None
    try:  # the files asked for first: a report that cannot be printed loses none of them
        if standalone is not None and result.status != "skip":
            from faverify.commands.standalone import write
            inputs = write(standalone, subject, the_case, result, target)
            wrote.append(f"wrote {standalone} and its inputs {inputs}: python {standalone} runs it without faverify")
        if plot is not None and result.metrics and result.status not in ("crash", "timeout"):
            # in this process: the worker showed it does not crash
            wrote.append(f"wrote {plot}: {_draw(plot, subject, the_case, target, mode.value, tolerance)}")
    except (UsageError, EnvironmentProblem) as e:
        problem = e
    show("\n".join(_report(kernel, target, the_case, result) + wrote))
    if problem is not None:
        raise problem
    if result.status == "skip":
        raise EnvironmentProblem(f"the case was skipped: {result.reason}")
    return 1 if result.failed else 0


def _report(kernel: str, target, the_case: Case, result) -> list:
    """The lines of repro's report: the calls, the error table, the gradient check and the verdict."""
    from faverify.reports.report import METRIC_HEADERS, metrics_rows, table
    calls = len(the_case.before)
    lines = [f"earlier call {i + 1} of {calls}: {call.short()}" for i, call in enumerate(the_case.before)]
    lines.append(f"{kernel} on {target}: {the_case.short()}")
    if the_case.before and result.case != the_case:  # an earlier call failed: the sequence ended there
        lines.append(f"failed at call {len(result.case.before) + 1} of {calls + 1}: {result.case.short()}")
    if result.metrics:
        lines.append(table(metrics_rows(result.metrics), METRIC_HEADERS, "table"))
    if result.gradcheck and not result.gradcheck["skipped"]:
        g = result.gradcheck
        lines.append(f"gradient check ({g['dtype']}): relative error {g['rel_err']:.3g}, allowed {g['allowed']:.3g}")
    lines.append(f"verdict: {result.status}" + (f" ({result.reason})" if result.reason else ""))
    return lines


def _text(option: str, value: str) -> str:
    """The option's value, or the file's text for @FILE (a regular file, read to files.READ_LIMIT)."""
    from faverify.files import Unreadable, read_bounded
    if not value.startswith("@"):
        return value
    try:
        return read_bounded(value[1:]).decode()
    except Unreadable as e:
        raise UsageError(option, value, f"the file {e}") from None
    except UnicodeDecodeError:
        raise UsageError(option, value, "the file is not text (it must hold JSON)") from None


def _draw(path: Path, subject, case, device, mode: str, tolerance) -> str:
    """Run the case in this process, keep its tensors and the reference's, and draw the tensor that failed
    by the most (or, in a passing case, came nearest its allowance): what was drawn, in words."""
    from faverify.reports.plot import error_map, write
    from faverify.run.evaluate import evaluate
    kept: dict = {}
    result = evaluate(subject, case, device, mode=mode, tolerance=tolerance, keep=kept)
    judged = {t: m for t, m in result.metrics.items() if t in kept.get("reference", {}) and m.allowed > 0
              and kept.get("got", {}).get(t) is not None}
    if not judged:
        raise EnvironmentProblem(f"--plot: no judged tensor to draw ({result.status}: {result.reason})")
    tensor, m = max(judged.items(), key=lambda tm: (not tm[1].passed, tm[1].max_abs / tm[1].allowed))
    ratio = error_map(kept["got"][tensor], kept["reference"][tensor], tensor, m.allowed)
    verdict = "fails" if not m.passed else "passes"
    write(path, ratio, tensor, f"{subject.name}: {case.short()}: {tensor} {verdict}", subject.caps.tile)
    return f"{tensor} ({verdict}, error {m.max_abs:.3g}, allowed {m.allowed:.3g})"


def _check_files(standalone, plot, subject, case) -> None:
    """The files asked for, refused before anything runs where they cannot be written for this case."""
    from faverify.files import check_writable
    if standalone is not None:
        from faverify.commands.standalone import inputs_of, refusal
        why = refusal(subject, case)
        if why:
            raise UsageError("--standalone", str(standalone), why)
        check_writable("--standalone", standalone)
        check_writable("--standalone", inputs_of(standalone))  # the inputs beside it: not a directory, say
    if plot is not None:
        from faverify.reports.plot import format_refusal
        from faverify.reports.plot import refusal as plot_refusal
        why = format_refusal(plot) or plot_refusal(case)
        if why:
            raise UsageError("--plot", str(plot), why)
        check_writable("--plot", plot)
