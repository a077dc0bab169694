"""The values of a case's tensors, per its regime, drawn from its seed: q, k, v and dO in float32 in their
logical layout, then the ALiBi slopes and the sinks (vocabulary.REGIMES says what each regime is for)."""
from __future__ import annotations

import math

import torch

from faverify.cases import fp8
from faverify.cases.case import Case

# Large-logit regime: q and k scaled by 32 give logits of standard deviation 32*32 = 1024 (at the default
# scale), so most exp(s - m) underflow to 0 and the max-logit gaps pass 1e3.
LARGE_SIGMA = 32.0
# A real NaN bug in a production kernel was triggered by every element equal to this bf16 value.
BF16_SCALE_VALUE = 133120.0
FP16_SCALE_VALUE = 32768.0  # 133120 overflows fp16; 2^15 is the same idea within range
OUTLIER_SIGMA, OUTLIER_RATE = 10.0, 0.001  # N(0,1) + N(0,100)*Bernoulli(0.001), as in the FA3 paper
TINY_SIGMA = 2.0**-10
PEAK_GAIN = 4.0  # dominant logit about PEAK_GAIN*sqrt(d) above the rest, about PEAK_GAIN*20 at d=32..256
# "negative": the row maxima drawn, past exp's fp32 range (-88.7, where exp(lse) underflows), FlashInfer's
# finite -inf sentinel (-5e4) and beyond
NEGATIVE_MAXIMA = (-1e2, -1e3, -6e4, -1e6)
KEY_SHIFT = 8.0  # every key gets this many units along one direction u, so q = -c u scores all of them < 0
LONE_KEY_SCORE = -5e5  # "lone-key": the one key a row sees scores this
FP16_LIMIT = 6e4  # the extreme regimes clamp fp16 values below its largest finite value (65504)


def generator(seed: int, device: torch.device | str) -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(seed)
    return g


def draw_values(case: Case, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout in float32, logical layout, values per the case's regime; then the ALiBi slopes and
    the sinks (None when off), drawn after them so a dense case's tensors do not depend on the variants."""
    g = generator(case.seed, device)
    b, sq, sk, h, hk, d = case.batch, case.seqlen_q, case.seqlen_k, case.nheads, case.nheads_k, case.head_dim
    dv = case.dv

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32)

    if dv == d:
        q, k, v, dout = normal(b, sq, h, d), normal(b, sk, hk, d), normal(b, sk, hk, d), normal(b, sq, h, d)
    else:
        q, k, v, dout = normal(b, sq, h, d), normal(b, sk, hk, d), normal(b, sk, hk, dv), normal(b, sq, h, dv)
    if case.layout == "broadcast":  # before the regimes, so those that relate q to k see the keys laid out
        k, v = _broadcast(k), _broadcast(v)
    regime = case.regime
    if regime == "large":
        q, k = q * LARGE_SIGMA, k * LARGE_SIGMA
    elif regime == "bf16-scale":
        value = FP16_SCALE_VALUE if case.dtype == "fp16" else BF16_SCALE_VALUE
        q, k, v = (torch.full_like(t, value) for t in (q, k, v))
    elif regime == "outliers":
        q, k, v = (_with_outliers(t, g) for t in (q, k, v))
    elif regime == "constant":
        # every key equal: each query row sees equal logits, uniform attention over all its blocks
        k = k[:, :1].expand_as(k).contiguous()
    elif regime == "peaked":
        q = _peaked_queries(case, q, k, g)
    elif regime == "tiny":
        q, k, v, dout = (t * TINY_SIGMA for t in (q, k, v, dout))
    elif regime == "negative":
        q, k = _negative_rows(case, q, k, g)
    elif regime == "lone-key":
        q, k = _lone_keys(case, q, k)
    elif regime == "tail-mass":
        q, k, v = fp8.tail_mass(case, q, k, v)
    elif regime == "limits":
        q, k, v = fp8.limits(g, q, k, v)
    elif regime == "block-spread":
        k, v = fp8.block_spread(k, v)
    if case.layout == "broadcast":  # again: "outliers" draws per element
        k, v = _broadcast(k), _broadcast(v)
    return q, k, v, dout, _alibi_slopes(case, g, device), _sinks(case, q, k, g, device)


def _broadcast(t: torch.Tensor) -> torch.Tensor:
    """The first batch element's first kv head, everywhere: what a stride-0 expand over both shows."""
    return t[:1, :, :1].expand_as(t)


def _in_range(case: Case, *tensors: torch.Tensor) -> tuple:
    if case.dtype != "fp16":
        return tensors
    return tuple(t.clamp(-FP16_LIMIT, FP16_LIMIT) for t in tensors)


def _negative_rows(case: Case, q: torch.Tensor, k: torch.Tensor, g: torch.Generator):
    """Half the query rows (drawn per batch, row and head) score every key far below zero: every key is
    shifted along one unit direction u (k + KEY_SHIFT u, so each projects on u by KEY_SHIFT +- 4) and those
    rows' queries are -c u, a row maximum about NEGATIVE_MAXIMA[seed's pick]; the other rows keep their
    draw. The magnitude is split between q and k so fp16 holds both."""
    b, sq, h, d = q.shape
    target = NEGATIVE_MAXIMA[int(torch.randint(len(NEGATIVE_MAXIMA), (1,), generator=g, device=q.device))]
    u = torch.randn(d, generator=g, device=q.device)
    u = u / u.norm().clamp(min=1e-6)
    product = abs(target) / (KEY_SHIFT * 0.625 * case.scale)  # c * gain: the row max is about -scale*c*gain*5
    gain = max(1.0, math.sqrt(product / (KEY_SHIFT + 4)))  # |k| elements reach about gain * 12, q's c
    k = gain * (k + KEY_SHIFT * u)
    rows = torch.rand(b, sq, h, 1, generator=g, device=q.device) < 0.5
    q = torch.where(rows, (-product / gain) * u, q)
    return _in_range(case, q, k)


def _lone_keys(case: Case, q: torch.Tensor, k: torch.Tensor):
    """Each row that sees exactly one key (causal with seqlen_q >= seqlen_k, windows of width 0, under the
    default bottom-right alignment) gets the query that scores it LONE_KEY_SCORE: the row's out must be
    that key's value and its lse that score. Keys are scaled so q and k share the magnitude."""
    sq, d = case.seqlen_q, case.head_dim
    k = k * math.sqrt(abs(LONE_KEY_SCORE) / (case.scale * d))
    left, right = case.bounds
    rows = [i for i in range(sq) if case.visible_keys(i) == 1]
    if not rows or case.seqlen_k == 0:
        return _in_range(case, q, k)
    diag = [i + case.seqlen_k - sq for i in rows]
    first = torch.tensor([max(0, j - left) if left is not None else 0 for j in diag], device=q.device)
    kv_head = torch.arange(case.nheads, device=q.device) // case.group
    key = k[:, first][:, :, kv_head]  # [b, rows, h, d]
    alpha = abs(LONE_KEY_SCORE) / (case.scale * (key * key).sum(-1, keepdim=True).clamp(min=1e-12))
    q = q.clone()
    q[:, torch.tensor(rows, device=q.device)] = -alpha * key
    return _in_range(case, q, k)


def _alibi_slopes(case: Case, g: torch.Generator, device: torch.device) -> torch.Tensor | None:
    """The geometric slopes of the ALiBi paper, 2^(-8 (i + 1) / h), each times a factor in [0.5, 2) from
    the seed; "zero": every slope 0."""
    if case.alibi == "off":
        return None
    h = case.nheads
    shape = (case.batch, h) if case.alibi == "batch-head" else (h,)
    base = 2.0 ** (-8.0 * torch.arange(1, h + 1, device=device, dtype=torch.float32) / h)
    slopes = base * (0.5 + 1.5 * torch.rand(shape, generator=g, device=device))
    return torch.zeros_like(slopes) if case.alibi == "zero" else slopes


def _sinks(case: Case, q, k, g: torch.Generator, device: torch.device) -> torch.Tensor | None:
    """One raw logit per head. "around": about the head's rows' log-sum-exp (_row_lse plus a normal draw),
    where sink and keys share the weight and the sink's gradient is as large as it gets; "above"/"below":
    30 past the largest logit the inputs can give, so the sink takes all the weight or none."""
    if case.sinks == "off":
        return None
    h = case.nheads
    if case.sinks == "zero":
        return torch.zeros(h, device=device)
    z = torch.randn(h, generator=g, device=device)
    if case.sinks == "around":
        return z + _row_lse(case, q, k)
    bound = 0.0
    if q.numel() and k.numel():  # both norms in one transfer
        q_norm, k_norm = torch.stack([q.norm(dim=-1).amax(), k.norm(dim=-1).amax()]).tolist()
        bound = case.scale * q_norm * k_norm
    if case.softcap:
        bound = min(bound, case.softcap)
    return (bound + 30.0 + z.abs()) * (1 if case.sinks == "above" else -1)


SINK_ROWS, SINK_KEYS = 64, 4096  # the rows and keys of the first batch element _row_lse samples


def _row_lse(case: Case, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[h] fp32: the median over rows of each head's log-sum-exp of its scaled (and capped) logits, over
    up to SINK_ROWS rows and SINK_KEYS keys of the first batch element, the sum scaled up by the keys left
    out. Windows, masks and ALiBi are left out: the sink lands within a few units of the rows' lse, not on
    it. With no key or no row, log(max(sk, 1)): a row's lse at logits of 0."""
    sq, sk, h = q.shape[1], k.shape[1], case.nheads
    if sq == 0 or sk == 0:
        return torch.full((h,), math.log(max(sk, 1)), device=q.device)
    rows = torch.linspace(0, sq - 1, min(sq, SINK_ROWS), device=q.device).long()
    keys = torch.linspace(0, sk - 1, min(sk, SINK_KEYS), device=q.device).long()
    kv_head = torch.arange(h, device=q.device) // case.group
    qs = q[0, rows].transpose(0, 1)  # [h, rows, d]
    ks = k[0, keys][:, kv_head].transpose(0, 1)  # [h, keys, d]
    s = case.scale * (qs @ ks.transpose(1, 2))
    if case.softcap:
        s = case.softcap * torch.tanh(s / case.softcap)
    lse = torch.logsumexp(s, dim=-1) + math.log(sk / len(keys))
    return lse.median(dim=1).values.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def _with_outliers(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    spikes = torch.randn(t.shape, generator=g, device=t.device) * OUTLIER_SIGMA
    hit = torch.rand(t.shape, generator=g, device=t.device) < OUTLIER_RATE
    return t + spikes * hit


def _peaked_queries(case: Case, q: torch.Tensor, k: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Point each query row at one key it can see, so one logit dominates the row."""
    b, sq, sk, h, d = case.batch, case.seqlen_q, case.seqlen_k, case.nheads, case.head_dim
    if sk == 0:
        return q
    rows = torch.arange(sq, device=q.device)
    limit = torch.full_like(rows, sk)  # keys visible to each row
    if case.causal:
        limit = (rows + sk - sq + 1).clamp(min=0, max=sk)
    pick = (torch.rand(b, sq, h, generator=g, device=q.device) * limit[None, :, None]).long()
    pick = torch.minimum(pick, (limit[None, :, None] - 1).clamp(min=0))
    kv_head = torch.arange(h, device=q.device) // case.group
    target = k[torch.arange(b, device=q.device)[:, None, None], pick, kv_head[None, None, :]]  # [b, sq, h, d]
    norm = target.norm(dim=-1, keepdim=True).clamp(min=1e-6)
    peaked = target / norm * (PEAK_GAIN * d**0.5) + 0.25 * q
    return torch.where((limit > 0)[None, :, None, None], peaked, q)
