"""For your own pytest suite: faverify's strategies, inputs, reference and verdict in one assertion.

README.md, "In your tests", shows the use: `cases` draws a Case, `make_inputs(case, DEVICE)` its tensors on
the device this machine has (a GPU where torch sees one, else the CPU), and `assert_attention_close` judges
what the kernel returned. `LIMITS` are that device's largest shapes, and `kernel_settings` is the Hypothesis
settings a kernel's test needs (no deadline: a kernel's first call compiles, and a CPU case takes longer
than Hypothesis's 200 ms). It decorates a test, or is the parent of your own: `settings(kernel_settings,
max_examples=500)`, `settings.register_profile("kernels", kernel_settings)`.

Gradients are checked too when given in a dict: compute them with grad_output = x.dout, from inputs made
with make_inputs(case, device, requires_grad=True). Variants: `cases(features=("window", "sinks"))` draws
them, `x.extras()` holds the case's alibi_slopes and sinks by keyword (pass window_size=case.window,
softcap=case.softcap when the case uses them), dsinks goes in the dict with the other gradients, and
`conventions=` names what the kernel follows (a preset such as "flashinfer", or a dict).
"""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings

from faverify import devices
from faverify.cases.case import Case
from faverify.cases.conventions import PRESETS
from faverify.cases.conventions import parse as parse_conventions
from faverify.cases.inputs import Inputs, make_inputs
from faverify.cases.strategies import CPU_LIMITS, GPU_LIMITS, Limits, cases, limits_for
from faverify.cases.vocabulary import FEATURES, TENSORS
from faverify.judge.verdict import Tolerance
from faverify.reports.collector import repro_command
from faverify.reports.report import METRIC_HEADERS, metrics_rows, table
from faverify.run.evaluate import judge

__all__ = ["assert_attention_close", "cases", "make_inputs", "Case", "Inputs", "Limits", "CPU_LIMITS",
           "GPU_LIMITS", "Tolerance", "FEATURES", "PRESETS", "DEVICE", "LIMITS", "kernel_settings"]

DEVICE = devices.resolve("auto")[0]  # the first GPU torch sees, else the CPU: what `faverify fuzz` runs on
LIMITS = limits_for(DEVICE.type)
# no deadline: a JIT kernel compiles on its first call, and one case on the CPU takes longer than 200 ms;
# the draw of a large case may be slow or large, which is no fault of the test
kernel_settings = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def assert_attention_close(subject_output, case: Case, *, kernel: str = "package.module:function",
                           tolerance: Tolerance | None = None, conventions="flash-attn-3") -> dict:
    """Raise AssertionError (with the error table and a reproducer) unless the output passes the verdict.

    subject_output: out, (out, lse), or a dict with any of out, lse, dq, dk, dv. Inputs are rebuilt from
    the case's seed on the output's device, so they must have come from make_inputs(case, that device).
    Returns the per-tensor metrics when it passes.
    """
    if isinstance(subject_output, dict):
        got = dict(subject_output)
    elif isinstance(subject_output, (tuple, list)):
        got = {"out": subject_output[0], "lse": subject_output[1] if len(subject_output) > 1 else None}
    else:
        got = {"out": subject_output}
    unknown = set(got) - set(TENSORS)
    if unknown:
        raise ValueError(f"subject_output has unknown tensor(s) {sorted(unknown)}; use {', '.join(TENSORS)}")
    first = next((t for t in got.values() if isinstance(t, torch.Tensor)), None)
    if first is None:
        raise ValueError("subject_output holds no tensor")
    x = make_inputs(case, first.device)
    names = tuple(t for t in TENSORS if got.get(t) is not None)
    metrics = judge(case, x, got, tolerance or Tolerance(), names, conventions=parse_conventions(conventions))
    failed = {t: m for t, m in metrics.items() if not m.passed}
    if failed:
        device = first.device.type
        raise AssertionError(
            f"attention output is not close to the FP64 reference for {case.short()}\n"
            + "; ".join(f"{t}: {m.reason}" for t, m in failed.items()) + "\n"
            + table(metrics_rows(metrics), METRIC_HEADERS, "table") + "\n"
            + f"case: {case.to_json()}\n"
            + f"reproduce: {repro_command(kernel, case.to_json(), device)}")
    return metrics
