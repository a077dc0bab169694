"""Hypothesis strategies that draw Cases.

Every strategy shrinks toward the simplest case that still fails: batch 1, one head, no GQA, seqlen 1,
the first head dim of HEAD_DIMS, regime "normal", layout "contiguous", init "-inf", default scale,
seed 0. Sequence lengths come from block-boundary values most of the time (where tail handling breaks)
and from the whole range otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from faverify.case import DTYPES, FEATURES, INITS, LAYOUTS, MAX_HEAD_DIM, REGIMES, Case
from faverify.errors import UsageError

# Block boundaries of common tile sizes (16..128) and their neighbours, odd lengths, one-row cases, and the
# tail tiles the trackers' bugs need: n % 32 == 1, n % 128 == 64 (a half tile), n % 128 == 127.
SEQLENS = (1, 2, 17, 33, 63, 64, 65, 97, 113, 127, 128, 129, 192, 203, 255, 256, 257, 320, 383, 448, 511, 512,
           513, 1000, 1023, 1024, 1025, 1088, 1089, 2047, 2048)
ONE_KEY_ODDS = 16  # one case in this many more has seqlen_k = 1 (one key, every row on it): 17% of cases, 12% without
# Powers of two and the non-powers real models use (40, 72, 80, 96, 160, 192).
HEAD_DIMS = (16, 32, 40, 64, 72, 80, 96, 128, 160, 192, 256)
GROUPS = (1, 2, 4, 8)  # query heads per kv head: 1 is MHA, the rest GQA, nheads_k == 1 is MQA
SCALES = (None, 1e-3, 2.0)  # default d^-0.5, tiny (near-uniform attention), large (sharp attention)
# Caps small enough that typical logits reach them, and the ones models use (Gemma 2: 50, 30)
SOFTCAPS = (0.5, 1.0, 5.0, 30.0, 50.0)
HEAD_DIMS_V = (64, 128, 512)  # MLA's 192/128 and 576/512 among the q/k head dims drawn


@dataclass(frozen=True)
class Limits:
    """Largest shapes drawn; they follow the device so a CPU run stays quick."""

    max_seqlen: int
    max_batch: int
    max_heads: int
    max_elements: int  # cap on batch * seqlen * nheads * head_dim of the largest of q, k

    def __post_init__(self) -> None:
        for name in ("max_seqlen", "max_batch", "max_heads", "max_elements"):
            if getattr(self, name) < 1:
                raise UsageError(name.replace("_", "-"), getattr(self, name), "must be >= 1")


CPU_LIMITS = Limits(max_seqlen=256, max_batch=2, max_heads=4, max_elements=1 << 17)
GPU_LIMITS = Limits(max_seqlen=2048, max_batch=4, max_heads=16, max_elements=1 << 22)


def limits_for(device_type: str, max_seqlen: int | None = None) -> Limits:
    base = GPU_LIMITS if device_type == "cuda" else CPU_LIMITS
    if max_seqlen is None:
        return base
    return Limits(max_seqlen, base.max_batch, base.max_heads, max(base.max_elements, max_seqlen * 16))


def seqlens(*, max_seqlen: int) -> st.SearchStrategy[int]:
    """Block-boundary lengths first (shrinks to 1), then any length up to max_seqlen."""
    boundary = [s for s in SEQLENS if s <= max_seqlen] or [1]
    return st.one_of(st.sampled_from(boundary), st.integers(min_value=1, max_value=max_seqlen))


@st.composite
def cases(draw, *, dtypes: tuple = DTYPES, limits: Limits = CPU_LIMITS, regimes: tuple = REGIMES,
          layouts: tuple = LAYOUTS, inits: tuple = INITS, causal: bool | None = None,
          head_dims: tuple = HEAD_DIMS, exact_head_dims: bool = False, features: tuple = ()) -> Case:
    """A Case within `limits`. Arguments narrow the choices; each must be a non-empty subset. Head dims
    are drawn from head_dims or anywhere between its least and largest, or only from it (exact).
    features: the variant features (case.FEATURES) drawn, each on or off per case, after every dense
    field, so a dense draw is the same whatever the features; each shrinks to off."""
    for name, chosen, allowed in (("dtypes", dtypes, DTYPES), ("regimes", regimes, REGIMES),
                                  ("layouts", layouts, LAYOUTS), ("inits", inits, INITS)):
        if not chosen or not set(chosen) <= set(allowed):
            raise UsageError(name, chosen, f"must be a non-empty subset of {', '.join(allowed)}")
    if not head_dims or not all(1 <= d <= MAX_HEAD_DIM for d in head_dims):
        raise UsageError("head_dims", head_dims, f"must be non-empty, each in 1..{MAX_HEAD_DIM}")
    if not set(features) <= set(FEATURES):
        raise UsageError("features", features, f"each must be one of {', '.join(FEATURES)}")

    dtype = draw(st.sampled_from(dtypes))
    is_causal = draw(st.booleans()) if causal is None else causal
    if len(head_dims) == 1:
        head_dim = head_dims[0]
    elif exact_head_dims:
        head_dim = draw(st.sampled_from(head_dims))
    else:
        head_dim = draw(st.one_of(st.sampled_from(head_dims), st.integers(min(head_dims), max(head_dims))))
    nheads_k = draw(st.integers(1, max(1, min(4, limits.max_heads))))
    group = draw(st.sampled_from([g for g in GROUPS if g * nheads_k <= limits.max_heads] or [1]))
    nheads = nheads_k * group
    cap = max(1, min(limits.max_seqlen, limits.max_elements // (nheads * head_dim)))
    seqlen_q = draw(seqlens(max_seqlen=cap))
    seqlen_k = draw(seqlens(max_seqlen=cap))
    if draw(st.sampled_from(range(ONE_KEY_ODDS))) == 0:  # shrinks to 0: seqlen_k 1, the simpler case
        seqlen_k = 1
    batch = draw(st.integers(1, max(1, min(limits.max_batch,
                                           limits.max_elements // (max(seqlen_q, seqlen_k) * nheads * head_dim)))))
    dense = dict(
        batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, nheads=nheads, nheads_k=nheads_k, head_dim=head_dim,
        dtype=dtype, causal=is_causal,
        softmax_scale=draw(st.sampled_from(SCALES)),
        regime=draw(st.sampled_from(regimes)),
        layout=draw(st.sampled_from(layouts)),
        init=draw(st.sampled_from(inits)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
    return Case(**dense, **draw(variants(tuple(f for f in FEATURES if f in features), seqlen_k=seqlen_k)))


def _bound(seqlen_k: int) -> st.SearchStrategy[int]:
    """One side of a window, at its edges most of the time: no bound, 0 (the diagonal alone), one key,
    one short of seqlen_k, wider than seqlen_k."""
    edges = st.sampled_from(sorted({-1, 0, 1, max(0, seqlen_k - 1), seqlen_k + 3}))
    return st.one_of(edges, st.integers(-1, seqlen_k + 8))


@st.composite
def variants(draw, features: tuple, *, seqlen_k: int) -> dict:
    """The variant fields for the features given, each on or off (off first: shrinking turns it off)."""
    out = {}
    for f in features:
        if not draw(st.booleans()):
            continue
        if f == "window":
            out["window"] = (draw(_bound(seqlen_k)), draw(_bound(seqlen_k)))
        elif f == "softcap":
            out["softcap"] = draw(st.one_of(st.sampled_from(SOFTCAPS), st.floats(0.05, 100.0)))
        elif f == "alibi":
            out["alibi"] = draw(st.sampled_from(("head", "batch-head", "zero")))
        elif f == "sinks":
            out["sinks"] = draw(st.sampled_from(("around", "above", "below")))
        elif f == "head_dim_v":
            # up to 256 like q/k's (what most kernels take), 512 (MLA) among the edges
            out["head_dim_v"] = draw(st.one_of(st.sampled_from(HEAD_DIMS_V + HEAD_DIMS),
                                               st.integers(1, MAX_HEAD_DIM)))
    return out
