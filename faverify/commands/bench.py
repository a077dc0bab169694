"""Speed of subjects next to torch's SDPA backends, each configuration validated against FP64 first.

Shapes follow FlashAttention's own benchmarks: batch * seqlen = 16384 tokens and nheads * head_dim =
2048, so every configuration moves the same amount of data. TFLOP/s: forward 4 * b * h * sq * sk * d (halved for
causal), backward 2.5x the forward; a window counts the (query, key) pairs it keeps, exactly. Times are
medians of triton.testing.do_bench. A configuration is timed only if a smaller instance of it (batch 1,
two heads, same seqlen, head dim, causal, dtype, variant) passes the verdict against FP64; a configuration
a subject cannot run is reported with the reason.

Variants (`--variants`): dense, window=L (flash-attn's window_size (L, L), or (L, 0) with causal: L keys
before each query's diagonal, and as many after it without the causal mask), softcap=C, alibi (a slope per
head), sinks (one per head, about a row's log-sum-exp). A variant row's time is also given against the
same subject's dense row (what the feature costs) and its speed against flex's row of the same variant.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.errors import UsageError
from faverify.reports.charts import tflops_charts
from faverify.reports.tables import fmt, table
from faverify.run.evaluate import evaluate
from faverify.subjects.base import Subject

YARDSTICKS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
TOKENS, WIDTH = 16384, 2048
VARIANT_RULE = "each must be dense, window=L (an int >= 0), softcap=C (a number > 0), alibi or sinks"


def parse_variants(text: str) -> list:
    """`--variants` as a list of names, each validated (UsageError naming the one that is not)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        name, sep, value = part.partition("=")
        try:
            ok = (name in ("dense", "alibi", "sinks") and not sep) or (name == "window" and int(value) >= 0) or \
                (name == "softcap" and math.isfinite(float(value)) and float(value) > 0)
        except ValueError:
            ok = False
        if not ok:
            raise UsageError("--variants", part, VARIANT_RULE)
        out.append(part)
    if not out:
        raise UsageError("--variants", text, VARIANT_RULE)
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Config:
    dtype: str
    head_dim: int
    causal: bool
    seqlen: int
    variant: str = "dense"  # parse_variants' names

    def fields(self) -> dict:
        """The Case fields of the variant."""
        name, _, value = self.variant.partition("=")
        if name == "window":
            left = int(value)
            return {"window": (left, 0 if self.causal else left)}
        if name == "softcap":
            return {"softcap": float(value)}
        return {"alibi": "head"} if name == "alibi" else {"sinks": "around"} if name == "sinks" else {}

    def pairs(self) -> float:
        """(query, key) pairs computed: seqlen^2, halved with the causal mask (flash-attn's count); a
        window's exactly."""
        n = self.seqlen
        window = self.fields().get("window")
        if window is None:
            return n * n / 2 if self.causal else float(n * n)
        left, right = window
        i = np.arange(n)
        return float((np.minimum(n - 1, i + right) - np.maximum(0, i - left) + 1).clip(min=0).sum())

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
                    dtype=self.dtype, causal=self.causal, seed=1, **self.fields())

    def flops(self, mode: str) -> float:
        f = 4.0 * self.batch * self.nheads * self.pairs() * self.head_dim
        return f * 2.5 if mode == "bwd" else f


def configs(dtypes, head_dims, seqlens, causal=(False, True), variants=("dense",)) -> list:
    return [Config(dt, d, c, s, v) for dt in dtypes for d in head_dims for c in causal for s in seqlens
            for v in variants]


def _time(fn) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def graphed(fn, device) -> tuple:
    """(what to time, how): on a GPU, the replay of a CUDA graph that captured one call of fn, which times
    the GPU's work without the host's cost of a call (argument checks, allocations, launches: a serving
    engine captures its decode steps this way); where capture fails, or there is no GPU, fn itself, the
    reason in `how`. fn runs on a side stream first, once as it is (compiles and the allocator's pools stay
    out of the capture), then once with torch's sync debug mode raising, which names the reason when the
    capture then fails: a call that waits on the device outside a capture may not inside one (the bundled
    kernels' block-table check reads the device only where it can), so the capture is tried either way. A
    failed capture can leave the default CUDA generator marked as capturing; _release_generator undoes it."""
    if torch.device(device).type != "cuda":
        return fn, "eager"
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    mode = torch.cuda.get_sync_debug_mode()
    waits = ""
    try:
        with torch.cuda.stream(stream):
            fn()
            torch.cuda.set_sync_debug_mode("error")
            try:
                fn()
            except RuntimeError as e:
                if "synchronizing" not in str(e):  # torch's words for a call that waits on the device
                    raise
                waits = str(e)[:120]
    finally:
        torch.cuda.set_sync_debug_mode(mode)
        torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as e:  # noqa: BLE001 - a subject's capture may fail any way; it is then timed eagerly
        torch.cuda.synchronize()
        _release_generator(device)
        failed = f"CUDA graph capture failed: {type(e).__name__}: {str(e)[:120]}"
        return fn, f"eager (a call waits on the device: {waits}; {failed})" if waits else f"eager ({failed})"
    return graph.replay, "cuda graph"


def _release_generator(device) -> None:
    """Give the device's default generator a fresh state with its seed: a capture that failed before its
    end leaves the generator's state marked as capturing, and every later random draw on the device
    raises ("Offset increment outside graph capture")."""
    index = torch.device(device).index
    generator = torch.cuda.default_generators[torch.cuda.current_device() if index is None else index]
    try:
        fresh = torch.Generator(device=generator.device)
        fresh.manual_seed(generator.initial_seed())
        generator.graphsafe_set_state(fresh.graphsafe_get_state())
    except RuntimeError:  # a torch without graph-safe generator states; make_inputs draws with generators of its own
        pass


def time_row(subject: Subject, config: Config, device, *, modes=("fwd", "bwd"), tune: bool = False) -> dict:
    """Validate, optionally tune (bundled Triton kernels), then time one subject on one configuration; a
    subject without a backward (FlashInfer) times its forward only, and its row says so."""
    row = {"kernel": subject.name, **dataclasses.asdict(config), "batch": config.batch, "nheads": config.nheads}
    if "bwd" in modes and not subject.caps.backward:
        modes = tuple(m for m in modes if m != "bwd")
        row["note"] = "forward only: the subject has no backward"
    check = evaluate(subject, config.case(small=True), device, mode="both" if "bwd" in modes else "fwd")
    row["validated"] = check.status
    if check.status != "pass":
        row["note"] = check.reason[:200]
        return row
    case = config.case()
    x = make_inputs(case, device, requires_grad=True)
    if tune and subject.name == "triton":
        row["tiles"] = _tune_triton(x, case)
    subject.take()  # the validation's and the tuning's launches are not the timed ones
    try:
        if "fwd" in modes:
            ms, row["fwd_timing"] = time_forward(subject, x, case, device)
            row.update(fwd_ms=ms, fwd_tflops=config.flops("fwd") / ms * 1e-9)
            if row["fwd_timing"].startswith("eager ("):
                row["note"] = "forward " + row["fwd_timing"]
        if "bwd" in modes:
            ms = _time_backward(subject, x, case, row)
            row.update(bwd_ms=ms, bwd_tflops=config.flops("bwd") / ms * 1e-9)
    except (RuntimeError, ValueError, NotImplementedError) as e:
        row["note"] = f"{type(e).__name__}: {str(e)[:200]}"
    # which kernels the timed calls ran (a variant the Hopper forward declines times the portable one)
    row["paths"] = sorted(set(subject.take().paths))
    return row


def time_forward(subject: Subject, x, case, device) -> tuple:
    """(ms, how) of a forward call without gradients, replayed from a CUDA graph where it can be captured
    (graphed): a short window's forward, or a decode step, is shorter than a call's host work."""
    with torch.no_grad():
        timed, how = graphed(lambda: subject(x.q, x.k, x.v, case, x.extras()), device)
        return _time(timed), how


def _time_backward(subject: Subject, x, case, row: dict) -> float:
    """The backward alone, over one retained graph. A compiled backward that donates its buffers (flex's:
    "compiled with non-empty donated buffers") runs once per graph: there forward and backward are timed
    together, each on a fresh graph, less the forward (row["bwd_timing"] says so)."""
    out, _ = subject(x.q, x.k, x.v, case, x.extras())
    try:
        return _time(lambda: torch.autograd.grad(out, (x.q, x.k, x.v), x.dout, retain_graph=True))
    except RuntimeError as e:
        if "retain_graph" not in str(e):
            raise
    out = None  # the graph goes: a backward that runs once per graph is timed below, each on its own

    def forward_backward():
        torch.autograd.grad(subject(x.q, x.k, x.v, case, x.extras())[0], (x.q, x.k, x.v), x.dout)
    forward = row.get("fwd_ms")
    if forward is None:
        with torch.no_grad():
            forward = _time(lambda: subject(x.q, x.k, x.v, case, x.extras()))
    row["bwd_timing"] = "forward and backward, less the forward (a backward that runs once per graph)"
    return max(_time(forward_backward) - forward, 1e-6)


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


# Other libraries' kernels a run may time beside ours (the adapters): each row's speed against theirs of
# the same configuration and variant, where the run has it
ANCHORS = ("flash-attn-4", "flash-attn-3", "flash-attn", "flashinfer")


def anchors(rows: list) -> list:
    """The ANCHORS the run timed: a column each."""
    timed = {r["kernel"] for r in rows}
    return [a for a in ANCHORS if a in timed]


def ratios(rows: list) -> list:
    """Add each row's ratio to sdpa-flash and sdpa-cudnn measured in the same run (their dense rows: a
    variant's speed against dense attention's) and to each anchor library's row of the same variant, and
    a variant row's time over the same subject's dense row's and speed against flex's row of the same
    variant."""
    def key(r, kernel=None, variant=None):
        return (kernel or r["kernel"], r["dtype"], r["head_dim"], r["causal"], r["seqlen"],
                variant or r.get("variant", "dense"))
    by_key = {key(r): r for r in rows}
    for r in rows:
        dense = by_key.get(key(r, variant="dense"))
        flex = by_key.get(key(r, kernel="flex"))
        for mode in ("fwd", "bwd"):
            mine = r.get(f"{mode}_tflops")
            for base in ("sdpa-flash", "sdpa-cudnn"):
                b = by_key.get(key(r, kernel=base, variant="dense"))
                theirs = b.get(f"{mode}_tflops") if b else None
                r[f"{mode}_vs_{base}"] = mine / theirs if mine and theirs else math.nan
            for anchor in anchors(rows):
                a = by_key.get(key(r, kernel=anchor))
                theirs = a.get(f"{mode}_tflops") if a and a is not r else None
                r[f"{mode}_vs_{anchor}"] = mine / theirs if mine and theirs else math.nan
            if r.get("variant", "dense") != "dense":
                ms, dense_ms = r.get(f"{mode}_ms"), dense.get(f"{mode}_ms") if dense else None
                r[f"{mode}_time_vs_dense"] = ms / dense_ms if ms and dense_ms else math.nan
                flex_ms = flex.get(f"{mode}_ms") if flex and flex is not r else None
                r[f"{mode}_vs_flex"] = flex_ms / ms if ms and flex_ms else math.nan
    return rows


HEADERS = ["kernel", "dtype", "d", "causal", "seqlen", "fwd TF/s", "vs flash", "vs cudnn", "bwd TF/s", "vs flash",
           "vs cudnn", "FP64 check", "tiles / note / code paths"]
# with variants: after seqlen the variant, and after each direction's ratios its time over the dense row's
# and its speed against flex's
VARIANT_HEADERS = HEADERS[:5] + ["variant"] + HEADERS[5:8] + ["time / dense", "vs flex"] + HEADERS[8:11] + \
    ["time / dense", "vs flex"] + HEADERS[11:]


def table_rows(rows: list) -> list:
    variants, others = _varied(rows), anchors(rows)
    out = []
    for r in rows:
        row = [r["kernel"], r["dtype"], str(r["head_dim"]), "yes" if r["causal"] else "no", str(r["seqlen"])]
        row += [r.get("variant", "dense")] if variants else []
        for mode in ("fwd", "bwd"):
            row += [fmt(r.get(f"{mode}_tflops"), ".1f"), fmt(r.get(f"{mode}_vs_sdpa-flash"), ".2f"),
                    fmt(r.get(f"{mode}_vs_sdpa-cudnn"), ".2f")]
            row += [fmt(r.get(f"{mode}_vs_{a}"), ".2f") for a in others]
            row += [fmt(r.get(f"{mode}_time_vs_dense"), ".2f"), fmt(r.get(f"{mode}_vs_flex"),
                                                                    ".2f")] if variants else []
        out.append(row + [r["validated"], " ".join(f"{k}:{v}" for k, v in r.get("tiles", {}).items())
                          or r.get("note") or ", ".join(r.get("paths", []))])
    return out


def _varied(rows: list) -> bool:
    """Whether any row is of a variant: then the table has the variant columns."""
    return any(r.get("variant", "dense") != "dense" for r in rows)


def headers(rows: list) -> list:
    """HEADERS, with the variant's columns if a row is of one, and after each direction's "vs cudnn" a
    column per anchor library the run timed."""
    names = VARIANT_HEADERS if _varied(rows) else HEADERS
    extra = [f"vs {a}" for a in anchors(rows)]
    out = []
    for name in names:
        out += [name] + (extra if name == "vs cudnn" else [])
    return out


def markdown(rows: list, command: str, environment: list, interrupted: bool = False) -> str:
    """The bench as a pull-request comment: what ran where, the table, and TF/s against seqlen per shape."""
    failed = [r for r in rows if r["validated"] == "fail"]
    verdict = ("**FAIL**: " + f"{len(failed)} configuration(s) failed the FP64 check first") if failed else \
        f"**{len(rows)} measurements**, each configuration checked against FP64 first"
    parts = [verdict + (" (interrupted)" if interrupted else ""), f"# faverify {command}",
             "\n".join("- " + line for line in environment), table(table_rows(rows), headers(rows), "md")]
    return "\n\n".join(parts + tflops_charts(rows)) + "\n"
