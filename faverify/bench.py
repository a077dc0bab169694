"""Speed of subjects next to torch's SDPA backends, each configuration validated against FP64 first.

Shapes follow FlashAttention's own benchmarks: batch * seqlen = 16384 tokens and nheads * head_dim =
2048, so every configuration moves the same amount of data. TFLOP/s: forward 4 * b * h * sq * sk * d (halved for
causal), backward 2.5x the forward. Times are medians of triton.testing.do_bench. A configuration is
timed only if a smaller instance of it (batch 1, two heads, same seqlen, head dim, causal, dtype) passes
the verdict against FP64; a configuration a subject cannot run is reported with the reason.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from faverify.case import Case
from faverify.runner import evaluate
from faverify.subjects.base import Subject

YARDSTICKS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
TOKENS, WIDTH = 16384, 2048


@dataclass(frozen=True)
class Config:
    dtype: str
    head_dim: int
    causal: bool
    seqlen: int

    @property
    def batch(self) -> int:
        return max(1, TOKENS // self.seqlen)

    @property
    def nheads(self) -> int:
        return max(1, WIDTH // self.head_dim)

    def case(self, *, small: bool = False) -> Case:
        return Case(batch=1 if small else self.batch, seqlen_q=self.seqlen, seqlen_k=self.seqlen,
                    nheads=min(2, self.nheads) if small else self.nheads,
                    nheads_k=min(2, self.nheads) if small else self.nheads, head_dim=self.head_dim,
                    dtype=self.dtype, causal=self.causal, seed=1)

    def flops(self, mode: str) -> float:
        f = 4.0 * self.batch * self.nheads * self.seqlen * self.seqlen * self.head_dim
        f = f / 2 if self.causal else f
        return f * 2.5 if mode == "bwd" else f


def configs(dtypes, head_dims, seqlens, causal=(False, True)) -> list:
    return [Config(dt, d, c, s) for dt in dtypes for d in head_dims for c in causal for s in seqlens]


def _time(fn) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def time_row(subject: Subject, config: Config, device, *, modes=("fwd", "bwd"), tune: bool = False) -> dict:
    """Validate, optionally tune (bundled Triton kernels), then time one subject on one configuration."""
    row = {"kernel": subject.name, **dataclasses.asdict(config), "batch": config.batch, "nheads": config.nheads}
    check = evaluate(subject, config.case(small=True), device, mode="both" if "bwd" in modes else "fwd")
    row["validated"] = check.status
    if check.status != "pass":
        row["note"] = check.reason[:200]
        return row
    from faverify.inputs import make_inputs
    case = config.case()
    x = make_inputs(case, device, requires_grad=True)
    if tune and subject.name == "triton":
        row["tiles"] = _tune_triton(x, case)
    try:
        if "fwd" in modes:
            with torch.no_grad():
                ms = _time(lambda: subject(x.q, x.k, x.v, case))
            row.update(fwd_ms=ms, fwd_tflops=config.flops("fwd") / ms * 1e-9)
        if "bwd" in modes:
            out, _ = subject(x.q, x.k, x.v, case)
            ms = _time(lambda: torch.autograd.grad(out, (x.q, x.k, x.v), x.dout, retain_graph=True))
            row.update(bwd_ms=ms, bwd_tflops=config.flops("bwd") / ms * 1e-9)
    except (RuntimeError, ValueError, NotImplementedError) as e:
        row["note"] = f"{type(e).__name__}: {str(e)[:200]}"
    return row


def _tune_triton(x, case) -> dict:
    """Time every kept candidate tile of each Triton kernel for this shape; record the fastest."""
    from faverify.kernels.triton import configs as tiles
    from faverify.kernels.triton import interface
    from faverify.kernels.triton.common import block_d

    bd, elem = block_d(case.head_dim), x.q.element_size()
    major = torch.cuda.get_device_capability(x.q.device)[0]
    q, k, v = (t.detach() for t in x.tensors())
    chosen = {}
    tma = interface._use_tma(q, k, v)
    best = _fastest(tiles.tuning_candidates("fwd", bd, elem, major, interface._use_hopper(q, tma)),
                    lambda t: interface.forward(q, k, v, case.scale, case.causal, "-inf", tile=t))
    chosen["fwd"] = best
    tiles.record("fwd", bd, elem, case.causal, case.seqlen_k, best, tma)
    out, _, rows = interface.forward(q, k, v, case.scale, case.causal, "-inf")
    for kind in ("dkdv", "dq"):
        best = _fastest(tiles.tuning_candidates(kind, bd, elem, major),
                        lambda t, kind=kind: interface.backward(x.dout, q, k, v, out, rows, case.scale, case.causal,
                                                                 tiles={kind: t}))
        chosen[kind] = best
        tiles.record(kind, bd, elem, case.causal, case.seqlen_k, best)
    return {k: str(t) for k, t in chosen.items()}


def _fastest(candidates: list, run) -> object:
    timed = []
    for tile in candidates:
        try:
            timed.append((_time(lambda: run(tile)), tile))
        except Exception:  # a tile that fails to compile or launch is not a candidate  # noqa: BLE001
            continue
    return min(timed, key=lambda p: p[0])[1]


def ratios(rows: list) -> list:
    """Add each row's ratio to sdpa-flash and sdpa-cudnn measured in the same run."""
    by_key = {(r["kernel"], r["dtype"], r["head_dim"], r["causal"], r["seqlen"]): r for r in rows}
    for r in rows:
        for base in ("sdpa-flash", "sdpa-cudnn"):
            b = by_key.get((base, r["dtype"], r["head_dim"], r["causal"], r["seqlen"]))
            for mode in ("fwd", "bwd"):
                mine, theirs = r.get(f"{mode}_tflops"), b.get(f"{mode}_tflops") if b else None
                r[f"{mode}_vs_{base}"] = mine / theirs if mine and theirs else math.nan
    return rows


HEADERS = ["kernel", "dtype", "d", "causal", "seqlen", "fwd TF/s", "vs flash", "vs cudnn", "bwd TF/s", "vs flash",
           "vs cudnn", "FP64 check", "tiles / note"]


def table_rows(rows: list) -> list:
    from faverify.report import fmt
    return [[r["kernel"], r["dtype"], str(r["head_dim"]), "yes" if r["causal"] else "no", str(r["seqlen"]),
             fmt(r.get("fwd_tflops"), ".1f"), fmt(r.get("fwd_vs_sdpa-flash"), ".2f"), fmt(r.get("fwd_vs_sdpa-cudnn"), ".2f"),
             fmt(r.get("bwd_tflops"), ".1f"), fmt(r.get("bwd_vs_sdpa-flash"), ".2f"), fmt(r.get("bwd_vs_sdpa-cudnn"), ".2f"),
             r["validated"], " ".join(f"{k}:{v}" for k, v in r.get("tiles", {}).items()) or r.get("note", "")]
            for r in rows]


def markdown(rows: list, command: str, environment: list, interrupted: bool = False) -> str:
    """The bench as a pull-request comment: what ran where, the table, and TF/s against seqlen per shape."""
    from faverify.charts import tflops_charts
    from faverify.report import table
    failed = [r for r in rows if r["validated"] == "fail"]
    verdict = ("**FAIL**: " + f"{len(failed)} configuration(s) failed the FP64 check first") if failed else \
        f"**{len(rows)} measurements**, each configuration checked against FP64 first"
    parts = [verdict + (" (interrupted)" if interrupted else ""), f"# faverify {command}",
             "\n".join("- " + line for line in environment), table(table_rows(rows), HEADERS, "md")]
    return "\n\n".join(parts + tflops_charts(rows)) + "\n"
