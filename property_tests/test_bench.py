"""faverify bench's timing of one row (bench.time_row), on any device: the timer is replaced by one that
calls the timed function a few times, as do_bench would, and reports a fixed time; the rows' sizes are
shrunk to a CPU's (bench.TOKENS, WIDTH)."""
import dataclasses

import pytest
import torch

from faverify.commands import bench
from faverify.subjects import resolve


@pytest.fixture(autouse=True)
def small_rows(monkeypatch):
    monkeypatch.setattr(bench, "TOKENS", 256)
    monkeypatch.setattr(bench, "WIDTH", 64)


class _OncePerGraph(torch.autograd.Function):
    """Identity whose backward refuses a second run over the same graph, as a compiled backward with
    donated buffers does (flex's)."""

    @staticmethod
    def forward(ctx, out):
        ctx.ran = False
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        if ctx.ran:
            raise RuntimeError("This backward function was compiled with non-empty donated buffers which requires "
                               "create_graph=False and retain_graph=False")
        ctx.ran = True
        return grad


def _once_per_graph_subject():
    math = resolve("sdpa-math")

    def fn(q, k, v, **kwargs):
        out = math.fn(q, k, v, **kwargs)
        return _OncePerGraph.apply(out[0] if isinstance(out, tuple) else out)
    return dataclasses.replace(math, name="once-per-graph", fn=fn, caps=dataclasses.replace(math.caps, lse=False))


@pytest.mark.parametrize("modes", [("fwd", "bwd"), ("bwd",)])
def test_a_backward_that_runs_once_per_graph_is_timed_with_its_forward_less_the_forward(modes, monkeypatch):
    """Timed over one retained graph, such a backward raises; the row then times forward and backward on a
    fresh graph each call and subtracts the forward (3 ms - 1 ms here), and says so."""
    calls = []

    def fake_time(fn):
        with_grad = torch.is_grad_enabled()
        for _ in range(3):
            fn()
        calls.append(with_grad)
        return 1.0 if not with_grad else 3.0
    monkeypatch.setattr(bench, "_time", fake_time)
    config = bench.Config("fp32", 16, False, 64)
    row = bench.time_row(_once_per_graph_subject(), config, "cpu", modes=modes)
    assert row["validated"] == "pass" and "note" not in row, row
    assert row["bwd_ms"] == pytest.approx(2.0) and "less the forward" in row["bwd_timing"]
    assert ("fwd_ms" in row) == ("fwd" in modes)


def test_a_backward_that_retains_its_graph_is_timed_alone(monkeypatch):
    monkeypatch.setattr(bench, "_time", lambda fn: (fn(), fn(), 2.5)[-1])
    row = bench.time_row(resolve("sdpa-math"), bench.Config("fp32", 16, True, 64), "cpu")
    assert row["bwd_ms"] == 2.5 and row["fwd_ms"] == 2.5 and "bwd_timing" not in row, row


def test_a_subject_without_a_backward_is_timed_forward_only_and_says_so(monkeypatch):
    monkeypatch.setattr(bench, "_time", lambda fn: (fn(), 1.5)[-1])
    math = resolve("sdpa-math")
    forward_only = dataclasses.replace(math, name="forward-only", caps=dataclasses.replace(math.caps, backward=False))
    row = bench.time_row(forward_only, bench.Config("fp32", 16, True, 64), "cpu")
    assert row["validated"] == "pass" and row["fwd_ms"] == 1.5 and "bwd_ms" not in row, row
    assert row["note"] == "forward only: the subject has no backward"


def test_a_row_names_the_code_paths_its_timed_calls_ran_and_only_those(monkeypatch):
    """A variant the Hopper forward declines is timed on the portable kernels: the row says which ran. The
    validation's launches (with grad, here) are not the timed ones (under no_grad)."""
    monkeypatch.setattr(bench, "_time", lambda fn: (fn(), fn(), 1.0)[-1])
    math, launched = resolve("sdpa-math"), []

    def fn(q, k, v, **kwargs):
        launched.append("fwd timed" if not torch.is_grad_enabled() else "fwd validated")
        return math.fn(q, k, v, **kwargs)

    def paths():
        taken = list(launched)
        launched.clear()
        return taken
    subject = dataclasses.replace(math, name="with-paths", fn=fn, paths=paths)
    row = bench.time_row(subject, bench.Config("fp32", 16, True, 64), "cpu", modes=("fwd",))
    assert row["validated"] == "pass" and row["paths"] == ["fwd timed"], row
    assert bench.table_rows([row])[0][-1] == "fwd timed"
