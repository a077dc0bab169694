"""Decode speed: one query token per sequence against a KV cache, where the cache read is all the work.

A decode configuration is a cache length L, a page size and a dtype at head dim d, with GQA 8 (32 query
heads over 4 kv heads) and batch * L = DECODE_TOKENS, so every configuration reads the same cache bytes
(268 MB at d128 bf16). A subject that declares paged caches reads it through a block table (pages in a
random order, as a cache that has run a while holds them; its split count its own rule, the SMs and the
cache length: kernels/triton/interface.num_splits_for); any other subject reads the same keys as
contiguous [batch, L, 4, d] tensors, the dense path. Each configuration passes the FP64 verdict on a
smaller instance (batch 1, the same L and heads) before it is timed. A call is timed as a serving engine
runs its decode steps, replayed from a CUDA graph (bench.graphed): the GPU's time, without the host's cost
of a call, which is of the order of the whole cache read here; a subject whose call cannot be captured is
timed eagerly, and its row says so.

The figure of merit is the bandwidth of the cache read: cache bytes / time, and its fraction of the
device's copy bandwidth measured in the same run (a device-to-device copy of 2 GiB: read plus write bytes
over its time), the most a kernel that reads the cache once can reach.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.commands.bench import _time, time_forward
from faverify.reports.tables import fmt
from faverify.run.evaluate import evaluate
from faverify.subjects.base import Subject

DECODE_TOKENS = 131072  # batch * cache length
NHEADS, NHEADS_K = 32, 4  # GQA 8
CACHE_LENS = (4096, 16384, 65536, 131072)


@dataclass(frozen=True)
class DecodeConfig:
    dtype: str
    head_dim: int
    cache_len: int
    page_size: int
    tokens: int = DECODE_TOKENS  # batch * cache length

    @property
    def batch(self) -> int:
        return max(1, self.tokens // self.cache_len)

    def case(self, *, paged: bool, splits: int = 1, small: bool = False) -> Case:
        batch = 1 if small else self.batch
        ragged = dict(cache_seqlens=(self.cache_len,) * batch, page_size=self.page_size, pages="random",
                      splits=splits) if paged else {}
        return Case.of(batch=batch, seqlen_q=1, seqlen_k=self.cache_len, nheads=NHEADS, nheads_k=NHEADS_K,
                       head_dim=self.head_dim, dtype=self.dtype, seed=1, **ragged)

    def cache_bytes(self, elem: int) -> float:
        """Bytes of k and v the decode reads: every key of every sequence, each kv head once."""
        return 2.0 * self.batch * self.cache_len * NHEADS_K * self.head_dim * elem


def configs(dtypes, head_dims, cache_lens, page_sizes) -> list:
    return [DecodeConfig(dt, d, n, p) for dt in dtypes for d in head_dims for n in cache_lens for p in page_sizes]


def copy_bandwidth(device) -> float:
    """Bytes per second of a device-to-device copy of 2 GiB (read and write counted)."""
    src = torch.empty(1 << 30, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    ms = _time(lambda: dst.copy_(src))
    return 2.0 * src.numel() * src.element_size() / (ms * 1e-3)


def _splits(subject: Subject, case: Case, device) -> int:
    """The split count a split-KV subject is timed with: flash_attn_with_kvcache's rule."""
    if not subject.caps.ragged.splits:
        return 1
    from faverify.kernels.triton.build.target import sm_count
    from faverify.kernels.triton.interface import num_splits_for
    return num_splits_for(case.batch, case.nheads, case.seqlen_q, case.seqlen_k, sm_count(device), case.nheads_k)


def time_row(subject: Subject, config: DecodeConfig, device, peak: float) -> dict:
    """Validate on a smaller instance, then time one subject's decode; a configuration it cannot run has
    the reason as its note."""
    paged = subject.caps.ragged.paged
    row = {"kernel": subject.name, **dataclasses.asdict(config), "batch": config.batch, "nheads": NHEADS,
           "nheads_k": NHEADS_K, "layout": "paged" if paged else "contiguous"}
    if not paged:
        row["page_size"] = 0  # the dense path has no pages: one row per cache length
    case = config.case(paged=paged)
    case = dataclasses.replace(case, splits=_splits(subject, case, device)) if paged else case
    small = config.case(paged=paged, splits=case.splits, small=True)
    reason = subject.unsupported(small, torch.device(device))
    if reason:
        row.update(validated="skip", note=reason[:200])
        return row
    check = evaluate(subject, small, device, mode="fwd")
    row["validated"] = check.status
    if check.status != "pass":
        row["note"] = check.reason[:200]
        return row
    row["splits"] = case.splits
    x = make_inputs(case, device)
    subject.take()  # the validation's launches are not the timed ones
    try:
        ms, row["timing"] = time_forward(subject, x, case, device)
    except (RuntimeError, ValueError, NotImplementedError) as e:
        row["note"] = f"{type(e).__name__}: {str(e)[:200]}"
        return row
    tbps = config.cache_bytes(x.q.element_size()) / (ms * 1e-3) * 1e-12
    row.update(ms=ms, cache_tbps=tbps, of_copy=tbps * 1e12 / peak, paths=sorted(set(subject.take().paths)))
    if row["timing"].startswith("eager ("):
        row["note"] = row["timing"]
    return row


def ratios(rows: list) -> list:
    """Each row's time against flex's and sdpa-flash's (the dense path) at the same dtype, head dim and
    cache length: their time over this row's, above 1 when this row is faster."""
    def key(r, kernel):
        return (kernel, r["dtype"], r["head_dim"], r["cache_len"])
    by_key = {key(r, r["kernel"]): r for r in rows if r.get("ms")}
    for r in rows:
        for base in ("sdpa-flash", "flex"):
            theirs = by_key.get(key(r, base))
            r[f"vs_{base}"] = theirs["ms"] / r["ms"] if theirs and r.get("ms") else math.nan
    return rows


HEADERS = ["kernel", "dtype", "d", "cache", "batch", "page", "splits", "ms", "cache TB/s", "of copy", "vs sdpa-flash",
           "vs flex", "FP64 check", "note / code paths"]


def table_rows(rows: list) -> list:
    return [[r["kernel"], r["dtype"], str(r["head_dim"]), str(r["cache_len"]), str(r["batch"]),
             str(r["page_size"] or "-"), str(r.get("splits", "-")), fmt(r.get("ms"), ".3f"),
             fmt(r.get("cache_tbps"), ".2f"), fmt(r.get("of_copy"), ".2f"), fmt(r.get("vs_sdpa-flash"), ".2f"),
             fmt(r.get("vs_flex"), ".2f"), r["validated"], r.get("note") or ", ".join(r.get("paths", []))]
            for r in rows]
