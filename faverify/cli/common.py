"""What the commands share: options, progress display, SIGTERM handling, tolerance flags."""
from __future__ import annotations

import math
import time
from enum import Enum
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from faverify.errors import UsageError
from faverify.streams import say, show, silence  # noqa: F401  (say and show: what the commands print)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """rich's own ends the process (exit 1) before the run is written: the progress goes quiet instead."""
        self.quiet = True
        silence("stderr")


stderr = _Console(stderr=True)


class Mode(str, Enum):
    fwd = "fwd"
    bwd = "bwd"
    both = "both"


class Scale(str, Enum):  # what a fuzz draws: the ordinary cases, or large ones (faverify/cases/large.py)
    normal = "normal"
    large = "large"


def write_outputs(outputs: list) -> None:
    """(option, path, text or a function giving it) each written whole or not at all (files.replace_whole,
    through a link to its target). A write that fails is told once every other output is written, as one
    exit-2 error naming each."""
    import os
    from pathlib import Path

    from faverify.errors import EnvironmentProblem
    from faverify.files import describe, replace_whole
    failed = []
    for option, path, text in outputs:
        if path is None:
            continue
        target = Path(os.path.realpath(path))
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            replace_whole(target, text() if callable(text) else text)
        except OSError as e:
            failed.append(f"{option} {target.parent}: cannot be made ({describe(e)})")
        except EnvironmentProblem as e:
            failed.append(f"{option} {e}")
    if failed:
        raise EnvironmentProblem("could not write " + "; ".join(failed) + "; the report on stdout holds the "
                                 "results")


def within(low=None, high=None):
    """A typer callback that refuses an option's value outside [low, high], in faverify's one-line form
    (--iters=0: must be >= 1); None passes (an option left unset), NaN never does."""
    def check(ctx: typer.Context, param: typer.CallbackParam, value):
        if value is None or ctx.resilient_parsing:
            return value
        option = max(param.opts, key=len)
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(option, value, "must be a finite number")
        if low is not None and value < low:
            raise UsageError(option, value, f"must be >= {low}" + (f" and <= {high}" if high is not None else ""))
        if high is not None and value > high:
            raise UsageError(option, value, f"must be <= {high}")
        return value
    return check


# The shortest --timeout: the workers are polled once a second (scheduler.POLL_SECONDS), so a shorter one
# is not kept, and a kernel's first call, which compiles, takes longer; below it a correct kernel times out.
MIN_TIMEOUT = 1.0


def check_timeout(timeout: float) -> None:
    if not math.isfinite(timeout) or timeout < MIN_TIMEOUT:  # NaN compares false with everything: test it first
        raise UsageError("--timeout", timeout, f"must be a finite number of seconds >= {MIN_TIMEOUT:g} (a case's "
                                               "first call compiles, and workers are polled once a second)")


def check_shrink_budget(budget: int) -> None:
    if budget < 0:
        raise UsageError("--shrink-budget", budget, "must be >= 0")


def _positive_seconds(ctx: typer.Context, param: typer.CallbackParam, value):
    if value is not None and not ctx.resilient_parsing:
        check_timeout(value)
    return value


MAX_WORKERS = 256  # worker processes per device
TimeoutOpt = Annotated[float, typer.Option(help="Seconds one case may take before its worker is killed",
                                           callback=_positive_seconds)]
MaxSeqlenOpt = Annotated[Optional[int], typer.Option(help="Longest seqlen drawn (default 256 on CPU, 2048 on GPU)",
                                                     callback=within(1, 1 << 20))]


def check_max_seqlen(max_seqlen: Optional[int]) -> None:
    if max_seqlen is not None and max_seqlen < 1:
        raise UsageError("--max-seqlen", max_seqlen, "must be >= 1")


FactorOpt = Annotated[Optional[str], typer.Option(help="Allowed multiple of the baseline error: NUMBER or "
                                                       "TENSOR=NUMBER,... (defaults out=2,lse=2,dq=3,dk=3,dv=3)")]
AtolOpt = Annotated[Optional[str], typer.Option(help="Floor in units of u(dtype)*scale_T: NUMBER or TENSOR=NUMBER,... "
                                                     "(default 1 for every tensor)")]
TightOpt = Annotated[Optional[str], typer.Option(help="The floor beside an informative baseline, in the same unit: "
                                                      "NUMBER or TENSOR=NUMBER,... (default 0.25; set it to the "
                                                      "--atol value for a floor that never shrinks)")]
DeviceOpt = Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:INDEX | all")]
ScaleOpt = Annotated[Scale, typer.Option(help="normal: the ordinary cases; large: cases whose flattened offsets "
                                              "cross 2^31 - 1 (inputs past 2^31 elements, a padded dq accumulator "
                                              "past it, a paged pool whose page ids pass it), judged on the batch "
                                              "entries around the boundary, one worker a device by default "
                                              "(docs/design.md, \"Offsets past 2^31\")")]


class _Speed(ProgressColumn):
    def render(self, task) -> Text:
        return Text(f"{task.speed:6.1f} cases/s" if task.speed else "     - cases/s")


class _Lines:
    """Progress when stderr is not a terminal (CI logs, a remote run): a line every 10 seconds, on stderr."""

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
            say(f"{task['name']}: {task['done']}/{task['total']} cases, {rate:.1f} cases/s, failed {task['failed']}")


def progress_bar():
    if not stderr.is_terminal:
        return _Lines()
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _Speed(),
                    TextColumn("failed {task.fields[failed]}"), TimeElapsedColumn(), console=stderr)


def progress_factory(progress, total: int):
    def factory(name: str):
        task = progress.add_task(name, total=total, failed=0)
        failed = 0

        def update(result) -> None:
            nonlocal failed
            failed += result.failed
            progress.update(task, advance=1, failed=failed)
        return update
    return factory
