"""torch's FlexAttention as a subject: a production kernel generator, compiled, and the first real client
of the variant contract.

Softcap and ALiBi are a score_mod, causal masks and windows a mask_mod and its block mask, bottom-right aligned like
the rest of faverify. A case's own mask and score_mod (masks.py, mods.py) are passed to it as the functions the
reference applies. Varlen and paged cases run one sequence at a time (per_sequence.py). Their parameters live in
tensors the mods read, so a new softcap, slope or window does not recompile; on a GPU sizes are dynamic, so a new
head dim or dtype is what compiles; on the CPU each shape compiles (see _flex's caller for why). On the CPU torch
compiles FlexAttention for inference only and without lse: the subject runs the forward there under no_grad and says
so per case; on a GPU it runs forward and backward and returns lse. The first call for each (device, dtype, head
dims, grad) is counted as compile time, reported apart from the kernel's.
"""
from __future__ import annotations

import time

import torch

from faverify.subjects.base import Capabilities, Subject

_UNBOUNDED = 1 << 30  # a window side with no bound
_PARAMS: dict = {}  # what the mods read: set before each call (tensors, so new values do not recompile)
_COMPILED: dict = {}
_COMPILES = {"seconds": 0.0, "count": 0}  # since the last take: what dynamo compiled, and the time of its calls


def _score_mod(score, b, h, i, j):
    cap = _PARAMS["softcap"]
    capped = torch.where(cap > 0, cap * torch.tanh(score / torch.where(cap > 0, cap, 1.0)), score)
    return capped - _PARAMS["slopes"][b, h] * (i + _PARAMS["offset"] - j).abs()


def _mask_mod(b, h, i, j):
    diag = i + _PARAMS["offset"]
    return (j <= diag + _PARAMS["right"]) & (j >= diag - _PARAMS["left"]) & (j < _PARAMS["keys"])


def _bucket(n: int) -> int:
    """The length a ragged batch's sequence is padded to on the CPU: a power of 4, 16 at least (powers of 2
    left 58 configurations of 110 to the sequences of a 200-case run)."""
    size = 16
    while size < n:
        size *= 4
    return size


def flex_sequence(q, k, v, **kwargs):
    """One sequence of a ragged batch: on the CPU, where each shape compiles, q, k and v padded to the bucket
    of the longer of seqlen_q and seqlen_k, the padded keys masked and the padded rows dropped, so the
    sequences of a run compile a few shapes, not one each (the dense cases keep their own lengths)."""
    if q.device.type != "cpu":
        return flex(q, k, v, **kwargs)
    sq, sk = q.shape[1], k.shape[1]
    size = _bucket(max(sq, sk))

    def pad(t):
        return torch.nn.functional.pad(t, (0, 0, 0, 0, 0, size - t.shape[1]))
    out = flex(pad(q), pad(k), pad(v), lengths=(sq, sk), **kwargs)
    return out[:, :sq]


def _flex(dynamic: bool):
    if dynamic not in _COMPILED:
        from torch.nn.attention.flex_attention import flex_attention
        # every case may compile anew (static shapes on the CPU): past dynamo's limit of 8 it would fall
        # back to running FlexAttention eagerly, which is not the kernel under test
        for limit in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 1 << 16))
        _COMPILED[dynamic] = torch.compile(flex_attention, dynamic=dynamic)
    return _COMPILED[dynamic]


def flex(q, k, v, *, causal: bool, softmax_scale, window_size=None, softcap=None, alibi_slopes=None, score_mod=None,
         mask_mod=None, lengths=None):
    """score_mod, mask_mod: the case's own (masks.py, mods.py), compiled as given; a mask_mod joins the
    causal and window mask, and then its block mask is built per batch element and head. lengths: the
    (seqlen_q, seqlen_k) of a padded sequence (flex_sequence), whose keys past seqlen_k are masked."""
    from torch.nn.attention.flex_attention import and_masks, create_block_mask

    b, sq, h, d = q.shape
    sk = k.shape[1]
    dev = q.device
    true_q, true_k = lengths or (sq, sk)
    left, right = window_size if window_size is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    slopes = torch.zeros(b, h, device=dev) if alibi_slopes is None else alibi_slopes.float().expand(b, h)
    _PARAMS.update(softcap=torch.tensor(float(softcap or 0.0), device=dev), slopes=slopes.contiguous(),
                   offset=torch.tensor(true_k - true_q, device=dev), keys=torch.tensor(true_k, device=dev),
                   left=torch.tensor(_UNBOUNDED if left < 0 else left, device=dev),
                   right=torch.tensor(_UNBOUNDED if right < 0 else right, device=dev))
    if mask_mod is None:
        block_mask = create_block_mask(_mask_mod, None, None, sq, sk, device=dev)
    else:
        block_mask = create_block_mask(and_masks(_mask_mod, mask_mod), b, h, sq, sk, device=dev)
    cpu = dev.type == "cpu"
    qt, kt, vt = (t.transpose(1, 2).detach() if cpu else t.transpose(1, 2) for t in (q, k, v))
    # Dynamic sizes on the GPU; static on the CPU, where inductor's C++ template for fp16 with symbolic
    # sizes fails to compile ("cur_kvSplitSize9 was not declared", torch 2.13; docs/torch-backends.md)
    start, graphs = time.perf_counter(), _graphs()
    with torch.no_grad() if cpu else torch.enable_grad():
        result = _flex(not cpu)(qt, kt, vt, score_mod=score_mod or _score_mod, block_mask=block_mask,
                                scale=softmax_scale,
                         enable_gqa=kt.shape[1] != qt.shape[1], return_lse=not cpu)
    if _graphs() > graphs:  # this call compiled (dynamo made a graph): its time is the compiler's, not the kernel's
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        _COMPILES["count"] += _graphs() - graphs
        _COMPILES["seconds"] += time.perf_counter() - start
    if cpu:
        return result.transpose(1, 2)
    out, lse = result
    return out.transpose(1, 2), lse.float()


def _graphs() -> int:
    """The graphs dynamo has compiled in this process: one more for each compile of a new configuration."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def _take(what: str):
    value, _COMPILES[what] = _COMPILES[what], type(_COMPILES[what])()
    return value


def compile_key(case, device_type: str) -> tuple:
    """The configurations a case's calls compile: dtype, head dims, heads, the softmax scale (a Python float
    dynamo specializes on), the layout (dynamo guards on strides) and the case's own mask (with its shape
    and block size) and score_mod everywhere; on the CPU (static sizes) each call's batch and lengths too, a
    ragged case's one per sequence (per_sequence.py calls them one at a time), padded to its bucket
    (flex_sequence)."""
    # softcap, ALiBi and windows are values in tensors the adapter's own mods read: they compile nothing new
    m = case.mask
    base = (case.dtype, case.head_dim, case.dv, case.nheads, case.nheads_k, case.softmax_scale, case.layout,
            "off" if m is None else m.pattern, "" if m is None else m.shape,
            m.block if m is not None and m.pattern == "block" else 0, case.score_mod)
    if device_type != "cpu":
        return (base,)
    calls = [(case.batch, case.seqlen_q, case.seqlen_k)] if case.kind == "dense" else \
        [(1, _bucket(max(sq, sk))) for sq, sk in case.sequences if sq and sk]
    return tuple(dict.fromkeys(base + c for c in calls))


def make() -> Subject:
    from faverify.subjects.per_sequence import ragged
    # lse is returned on a GPU and judged there; not declared, since the CPU's compiled FlexAttention has none
    caps = Capabilities.of(window=True, softcap=True, alibi=True, head_dim_v=True, varlen=True, paged=True,
                           mask_mod=True, score_mod=True, backward_devices=("cuda",))
    return Subject(name="flex", fn=ragged(flex, flex_sequence), caps=caps,
                   description="torch FlexAttention, compiled (forward only on "
                   "the CPU)", compile_seconds=lambda: _take("seconds"), compiles=lambda: _take("count"),
                   compile_key=compile_key)
