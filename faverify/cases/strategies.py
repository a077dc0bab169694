"""Hypothesis strategies that draw Cases.

Every strategy shrinks toward the simplest case that still fails: batch 1, one head, no GQA, seqlen 1,
the first head dim of HEAD_DIMS, regime "normal", layout "contiguous", init "-inf", default scale,
seed 0. Sequence lengths come from block-boundary values most of the time (where tail handling breaks)
and from the whole range otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from faverify.cases.case import Case
from faverify.cases.mask_draws import masked
from faverify.cases.ragged_draws import ragged
from faverify.cases.vocabulary import (
    DTYPES,
    FEATURES,
    FP8_DRAWN,
    FP8_OWN_REGIMES,
    FP8_REGIMES,
    INITS,
    LAYOUTS,
    MASKS,
    MAX_HEAD_DIM,
    MAX_HEAD_DIM_V,
    MAX_TOPK,
    REGIMES,
    SHARDS,
    SPARSE,
    VARIANT_FEATURES,
)
from faverify.errors import UsageError

# Block boundaries of common tile sizes (16..128) and their neighbours, odd lengths, one-row cases, and the
# tail tiles the trackers' bugs need: n % 32 == 1, n % 128 == 64 (a half tile), n % 128 == 127.
SEQLENS = (1, 2, 17, 33, 63, 64, 65, 97, 113, 127, 128, 129, 192, 203, 255, 256, 257, 320, 383, 448, 511, 512,
           513, 704, 1000, 1023, 1024, 1025, 1088, 1089, 1344, 2047, 2048)
ONE_KEY_ODDS = 16  # one case in this many more has seqlen_k = 1 (one key, every row on it): 17% of cases, 12% without
# Powers of two and the non-powers real models use (40, 72, 80, 96, 160, 192).
HEAD_DIMS = (16, 32, 40, 64, 72, 80, 96, 128, 160, 192, 256)
COMMON_HEAD_DIMS = (64, 128)
GROUPS = (1, 2, 4, 8)  # query heads per kv head: 1 is MHA, the rest GQA, nheads_k == 1 is MQA
SCALES = (None, 1e-3, 2.0)  # default d^-0.5, tiny (near-uniform attention), large (sharp attention)
# Caps small enough that typical logits reach them, and the ones models use (Gemma 2: 50, 30)
SOFTCAPS = (0.5, 1.0, 5.0, 30.0, 50.0)
HEAD_DIMS_V = (64, 128, 512)  # MLA's 192/128 and 576/512 among the q/k head dims drawn
SPLITS = (2, 3, 4, 7, 16)
# How a case of a subject that declares features draws them: "plain", none (dense attention, the call users
# make most; the kernels' plain build); "one", a single feature alone (a window alone, ALiBi alone: each has a
# kernel path of its own); "each", every feature on or off by itself (the combinations). In a draw of many
# features "each" alone left plain attention to 2 cases in 200 (triton, CPU).
FEATURE_MIXES = ("plain", "one", "one", "one", "one", "each", "each", "each")
SUB_FEATURES = {"mask_nan": "mask", "bias_grad": "bias", "shards": "splits"}  # drawn only with the feature they qualify
EXCLUSIVE = ("varlen", "paged", "mask", "bias", "score_mod", "sparse")  # a case has at most one of them (and splits)
ON = (False, True, True)  # a variant feature of an "each" case is on two times in three (shrinks to off)


@dataclass(frozen=True)
class Limits:
    """Largest shapes drawn; they follow the device so a CPU run stays quick."""

    max_seqlen: int
    max_batch: int
    max_heads: int
    max_elements: int  # cap on batch * seqlen * nheads * head_dim of the largest of q, k
    max_cache: int = 0  # longest paged cache drawn (0: max_seqlen)
    # largest page pool, in elements of k_cache: a pool past 2^31 elements overflows 32-bit offset products
    # (vLLM tests 32768 pages for it); 0: no pool larger than its pages need
    max_pool_elements: int = 0

    def __post_init__(self) -> None:
        for name in ("max_seqlen", "max_batch", "max_heads", "max_elements"):
            if getattr(self, name) < 1:
                raise UsageError(name.replace("_", "-"), getattr(self, name), "must be >= 1")


CPU_LIMITS = Limits(max_seqlen=256, max_batch=2, max_heads=4, max_elements=1 << 17)
GPU_LIMITS = Limits(max_seqlen=2048, max_batch=4, max_heads=16, max_elements=1 << 22, max_cache=1 << 17,
                    max_pool_elements=1 << 33)


def limits_for(device_type: str, max_seqlen: int | None = None) -> Limits:
    base = GPU_LIMITS if device_type == "cuda" else CPU_LIMITS
    if max_seqlen is None:
        return base
    return Limits(max_seqlen, base.max_batch, base.max_heads, max(base.max_elements, max_seqlen * 16),
                  max(base.max_cache, max_seqlen), base.max_pool_elements)


def seqlens(*, max_seqlen: int) -> st.SearchStrategy[int]:
    """Block-boundary lengths first (shrinks to 1), then any length up to max_seqlen."""
    boundary = [s for s in SEQLENS if s <= max_seqlen] or [1]
    return st.one_of(st.sampled_from(boundary), st.integers(min_value=1, max_value=max_seqlen))


@st.composite
def cases(draw, *, dtypes: tuple = DTYPES, limits: Limits = CPU_LIMITS, regimes: tuple = REGIMES,
          layouts: tuple = LAYOUTS, inits: tuple = INITS, causal: bool | None = None,
          head_dims: tuple = HEAD_DIMS, exact_head_dims: bool = False, features: tuple = (),
          always_split: bool = False, ragged_only: bool = False, masks: tuple = MASKS[1:],
          speculative: bool = False, head_dim_multiple: int = 1, shapes: tuple = (),
          mixes: tuple = FEATURE_MIXES, max_head_dim_v: int = MAX_HEAD_DIM_V, mla: bool = False,
          fp8_formats: tuple = ("e4m3",), fp8_scales: tuple = FP8_DRAWN, fp8_only: bool = False,
          seqlen_multiple: int = 1, equal_seqlens: bool = False) -> Case:
    """A Case within `limits`. Arguments narrow the choices; each must be a non-empty subset. Head dims
    are drawn from head_dims or anywhere between its least and largest, or only from it (exact; v's head
    dim too, where head_dim_v is drawn).
    features: the variant features (vocabulary.FEATURES) drawn after every dense field, so a dense draw is the same
    whatever the features, in one of `mixes` per case (FEATURE_MIXES: none of them, one alone, or each on or off);
    each shrinks to off. "varlen" and "paged" replace the batch by sequences of their own lengths (ragged);
    always_split: every case has splits (a split-KV combine's cases); ragged_only: every case varlen or paged (of
    those in features); masks: the mask patterns drawn when features has "mask" (vocabulary.MASKS); speculative: GQA
    groups of 2 or more and, for paged cases, 2 to 16 query rows (a speculative decode: a packed decode tile then
    holds several queries of several heads); head_dim_multiple: q/k's and v's head dims rounded up to multiples of
    it (a subject's Capabilities.head_dim_multiple), the draw otherwise the same; shapes: a shape budget
    (shape_pool), each case taking the tensors' shape of one of them (SHAPE_FIELDS), its values, regime, layout and
    features its own, so a subject that compiles or plans per shape does so len(shapes) times; max_head_dim_v: the
    largest value head dim drawn (a subject's max_head_dim); mla: "kv_shared" cases may take MLA's head dims, 576
    for q/k and 512 for v, or 512 for both (K = V); fp8_formats: the FP8 formats drawn (e4m3 two times in three
    where e5m2 is among them); fp8_scales: the descale granularities drawn; fp8_only: every case an FP8 case
    (`--dtype fp8`); seqlen_multiple, equal_seqlens: the lengths a subject takes (Lengths)."""
    _check_choices(dtypes, regimes, layouts, inits, head_dims, features)
    dense, cap = _dense(draw, dtypes, limits, regimes, layouts, inits, causal, head_dims, exact_head_dims,
                        speculative, head_dim_multiple, shapes, fit := Lengths(seqlen_multiple, equal_seqlens))
    pooled = dense.pop("pooled")
    declared_fp8, features = "fp8" in features, tuple(f for f in features if f != "fp8")
    features, forced = draw(_mixture(() if fp8_only else features, mixes, ragged_only))
    # FP8 takes dense attention alone (checks._check_fp8), its output bf16: two in three of the cases the mix
    # leaves plain, so the other features keep the shares their edges were tuned for (edges.py)
    if fp8_only or (declared_fp8 and not features and "bf16" in dtypes and draw(st.sampled_from(ON))):
        return _fp8_case(draw, dense, regimes, fp8_formats, fp8_scales)
    variant = draw(variants(tuple(f for f in VARIANT_FEATURES if f in features), seqlen_k=dense["seqlen_k"],
                            forced=forced, max_head_dim_v=max_head_dim_v))
    if "head_dim_v" in variant:
        variant["head_dim_v"] = aligned(variant["head_dim_v"], head_dim_multiple, MAX_HEAD_DIM_V)
        if exact_head_dims:  # v's head dim one of them too (a draw of its own: the default draw is unchanged)
            variant["head_dim_v"] = draw(st.sampled_from(head_dims))
    if pooled:  # v's head dim is the shape's too
        variant.pop("head_dim_v", None)
        if pooled["head_dim_v"] is not None:
            variant["head_dim_v"] = pooled["head_dim_v"]
    if variant.get("sinks") and (always_split or "splits" in features):
        del variant["sinks"]  # split-KV partials take no sinks (a sink belongs to no key range)
    kinds = tuple(k for k in ("varlen", "paged") if k in features)
    # drawn only when asked for, so a draw without them is the same as it always was; masks and biases take
    # dense cases only, so a subject that declares them draws dense batches as often as ragged ones
    dense_weight = len(kinds) if set(features) & {"mask", "bias", "score_mod"} else 1
    shape = draw(ragged(kinds, dense, limits, cap, ragged_only=ragged_only or forced in kinds,
                        speculative=speculative, dense_weight=dense_weight, fit=fit)) if kinds else {}
    if always_split or "splits" in features:
        choices = SPLITS if always_split or forced == "splits" else (1,) + SPLITS
        shape["splits"] = draw(st.sampled_from(choices))
        ragged_batch = shape.get("seqlens") or shape.get("cache_seqlens")
        if "shards" in features and shape["splits"] > 1 and not ragged_batch:  # after splits: their draw as it was
            shape["shards"] = draw(st.sampled_from(SHARDS + SHARDS[1:]))  # shards four times in five
    dense_batch = not shape.get("seqlens") and not shape.get("cache_seqlens") and shape.get("splits", 1) == 1
    mask_features = set(features) & {"mask", "bias", "score_mod"}
    if mask_features and dense_batch:  # may drop softcap and ALiBi
        variant.update(draw(masked(tuple(features), dense, variant, masks, forced=forced)))
    # sparse indices say alone which keys a row sees: no causal mask, window, mask or bias beside them. A case
    # of its own, or one of "each" features that left those off (the others keep their shares: edges.py)
    plain_keys = not (dense["causal"] or mask_features & set(variant) or variant.get("window", (-1, -1)) != (-1, -1))
    sparse = "sparse" in features and dense_batch and (forced == "sparse" or (forced is None and plain_keys))
    if "lse_grad" in features and dense_batch:  # drawn last: the rest of the case as it was
        # a loss on lse beside out's twice as often as on lse alone (where dv must be exactly 0)
        variant["lse_grad"] = draw(st.sampled_from(("with", "alone", "with")))
    if "max_logit" in features and dense_batch:
        variant["max_logit"] = True
    if sparse:
        variant.update(draw(_sparse(dense["seqlen_k"])), window=(-1, -1))
        dense["causal"] = False  # where the case was forced to be sparse
    shared = forced == "kv_shared" or (forced is None and "kv_shared" in features and draw(st.sampled_from(ON)))
    if shared and dense_batch:
        _share_kv(draw, dense, variant, limits, mla and not mask_features, fit)
    return Case.of(**{**dense, **variant, **shape})


def _fp8_case(draw, dense: dict, regimes: tuple, fp8_formats: tuple, fp8_scales: tuple) -> Case:
    """The dense draw as an FP8 case: bf16 out, a descale granularity, an FP8 regime, and a format."""
    fp8_regimes = tuple(r for r in FP8_REGIMES if r in regimes or r in FP8_OWN_REGIMES)
    case = {**dense, "dtype": "bf16", "fp8": draw(st.sampled_from(fp8_scales)),
            "regime": draw(st.sampled_from(fp8_regimes))}
    if len(fp8_formats) > 1:  # drawn last: a draw of e4m3 alone is as it was
        case["fp8_format"] = draw(st.sampled_from(fp8_formats + ("e4m3",)))
    return Case.of(**case)


def _share_kv(draw, dense: dict, variant: dict, limits: Limits, mla: bool, fit: "Lengths") -> None:
    """v as k's leading columns: v's head dim no wider than k's; with mla, MLA's dims now and then (576 beside
    512, or K = V at 512), the sequences and the batch cut to the limits at that width."""
    dims = draw(st.sampled_from(("drawn", "mla", "k=v-512") if mla else ("drawn",)))
    if dims != "drawn":
        dense["head_dim"], variant["head_dim_v"] = (576, 512) if dims == "mla" else (512, None)
        cap = _seqlen_cap(limits, dense["nheads"], dense["head_dim"])
        dense["seqlen_q"], dense["seqlen_k"] = fit(min(dense["seqlen_q"], cap), min(dense["seqlen_k"], cap), cap)
        most = max(1, limits.max_elements // (max(dense["seqlen_q"], dense["seqlen_k"]) * dense["nheads"] * 576))
        dense["batch"] = min(dense["batch"], most)
    elif (variant.get("head_dim_v") or 0) >= dense["head_dim"]:
        variant.pop("head_dim_v")  # no wider than k: the same width
    variant["kv_shared"] = True


@st.composite
def _sparse(draw, seqlen_k: int) -> dict:
    """What the indices hold, beside valid keys (duplicates, -1 slots, indices past seqlen_k), and how many a
    row lists: one, as many as the keys, more (padded with -1), or any up to MAX_TOPK."""
    topk = draw(st.one_of(st.sampled_from(sorted({1, min(max(seqlen_k, 1), MAX_TOPK),
                                                   min(seqlen_k + 1, MAX_TOPK)})),
                          st.integers(1, MAX_TOPK)))
    # "distinct" keys are in each of them; duplicates as often as the invalid indices of both kinds
    return dict(sparse=draw(st.sampled_from(SPARSE[2:] + ("duplicates",))), topk=topk)


def _check_choices(dtypes, regimes, layouts, inits, head_dims, features) -> None:
    for name, chosen, allowed in (("dtypes", dtypes, DTYPES), ("regimes", regimes, REGIMES),
                                  ("layouts", layouts, LAYOUTS), ("inits", inits, INITS)):
        if not chosen or not set(chosen) <= set(allowed):
            raise UsageError(name, chosen, f"must be a non-empty subset of {', '.join(allowed)}")
    if not head_dims or not all(1 <= d <= MAX_HEAD_DIM for d in head_dims):
        raise UsageError("head_dims", head_dims, f"must be non-empty, each in 1..{MAX_HEAD_DIM}")
    if not set(features) <= set(FEATURES):
        raise UsageError("features", features, f"each must be one of {', '.join(FEATURES)}")


def _dense(draw, dtypes, limits, regimes, layouts, inits, causal, head_dims, exact_head_dims, speculative,
           head_dim_multiple, shapes, fit: "Lengths") -> tuple:
    """The dense fields of a case, drawn in the order every seed has drawn them: (fields, seqlen cap); the
    fields carry the shape taken from the budget (None without one) under "pooled"."""
    dtype = draw(st.sampled_from(dtypes))
    is_causal = draw(st.booleans()) if causal is None else causal
    if len(head_dims) == 1:
        head_dim = head_dims[0]
    elif exact_head_dims:
        head_dim = draw(st.sampled_from(head_dims))
    else:
        # the head dims models use most, a third of the time: the kernels' unpadded, aligned builds take them
        common = [d for d in COMMON_HEAD_DIMS if min(head_dims) <= d <= max(head_dims)] or list(head_dims)
        head_dim = draw(st.one_of(st.sampled_from(head_dims), st.integers(min(head_dims), max(head_dims)),
                                  st.sampled_from(common)))
    head_dim = aligned(head_dim, head_dim_multiple, MAX_HEAD_DIM)
    least = 2 if speculative else 1  # the group
    nheads_k = draw(st.integers(1, max(1, min(4, limits.max_heads // least))))
    # every group drawn from all of GROUPS, then halved to fit: a list that depends on nheads_k would draw no
    # choice where it has one element, and the shrinker cannot insert the choice that nheads_k 1 needs
    group = draw(st.sampled_from(GROUPS[1:] if least > 1 else GROUPS))
    while group > least and group * nheads_k > limits.max_heads:
        group //= 2
    nheads = nheads_k * group
    cap = _seqlen_cap(limits, nheads, head_dim)
    seqlen_q = draw(seqlens(max_seqlen=cap))
    seqlen_k = draw(seqlens(max_seqlen=cap))
    if draw(st.sampled_from(range(ONE_KEY_ODDS))) == 0:  # shrinks to 0: seqlen_k 1, the simpler case
        seqlen_k = 1
    seqlen_q, seqlen_k = fit(seqlen_q, seqlen_k, cap)
    most = max(1, min(limits.max_batch, limits.max_elements // (max(seqlen_q, seqlen_k) * nheads * head_dim)))
    # the most that fits, two times in three: a batch of several is where per-batch strides and masks show.
    # Drawn as a number and a choice, not a one_of: a shrink from just(most) to integers() would have to
    # insert a choice, which Hypothesis's shrinker does not do (batch 2 stayed in minimal cases)
    batch = draw(st.integers(1, most))
    batch = most if draw(st.sampled_from((False, True, True))) else batch
    pooled = shapes[draw(st.integers(0, len(shapes) - 1))] if shapes else None  # shrinks to the first shape
    if pooled:
        batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, is_causal = (
            pooled[f] for f in ("batch", "seqlen_q", "seqlen_k", "nheads", "nheads_k", "head_dim", "dtype", "causal"))
        cap = _seqlen_cap(limits, nheads, head_dim)
    fields = dict(
        batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, nheads=nheads, nheads_k=nheads_k, head_dim=head_dim,
        dtype=dtype, causal=is_causal,
        softmax_scale=draw(st.sampled_from(SCALES)),
        regime=draw(st.sampled_from(regimes)),
        layout=draw(st.sampled_from(layouts)),
        init=draw(st.sampled_from(inits)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
    if pooled:  # the strides and the scale are compiled for too: drawn above as ever, then the shape's
        fields.update(softmax_scale=pooled["softmax_scale"], layout=pooled["layout"])
    fields["pooled"] = pooled
    return fields, cap


@st.composite
def _mixture(draw, features: tuple, mixes: tuple, ragged_only: bool) -> tuple:
    """(the features this case draws, the one it must use or None): FEATURE_MIXES. A ragged-only subject's
    varlen or paged is not optional, nor are the features qualifying another (SUB_FEATURES)."""
    required = tuple(f for f in features if ragged_only and f in ("varlen", "paged"))
    optional = [f for f in features if f not in SUB_FEATURES and f not in required]
    if not optional:
        return features, None
    mix = draw(st.sampled_from(mixes))
    if mix == "each":
        return features, None
    if mix == "plain":
        return required, None
    # where ragged batches and masks compete for the cases (masks take dense batches alone), the features that
    # take a case of their own twice as often: they share the cases among them, where the others add to any
    competing = {"varlen", "paged"} & set(optional)
    # sparse, whose edges are its own cases' alone, thrice
    one = draw(st.sampled_from(optional + [f for f in optional if f in EXCLUSIVE and competing]
                               + [f for f in optional if f == "sparse"] * 2))
    return required + (one,) + tuple(f for f, of in SUB_FEATURES.items() if of == one and f in features), one


# What a shape budget keeps to its pool: the tensors' shapes, dtype and causal, their layout (strides) and
# the softmax scale (what a JIT compiles, or a cuDNN plan is built, for). A ragged case's sequences are drawn
# as ever, within the pooled batch.
SHAPE_FIELDS = ("batch", "seqlen_q", "seqlen_k", "nheads", "nheads_k", "head_dim", "head_dim_v", "dtype", "causal",
                "softmax_scale", "layout")


def shape_pool(drawn: list, budget: int) -> tuple:
    """`budget` distinct shapes (SHAPE_FIELDS) of the drawn cases, as dicts, spread evenly over the distinct
    ones in drawing order: Hypothesis draws small cases first (its very first at every least size) and
    larger ones later, so the pool holds both, without the least one. All of them where there are fewer.
    Dense cases' shapes alone: a ragged case's fields summarize its sequences (a paged one whose caches
    are all empty has seqlen_k 0), which no dense case may take."""
    distinct: list = []
    for case in drawn:
        if case.kind != "dense":
            continue
        shape = {f: getattr(case, f) for f in SHAPE_FIELDS}
        if shape not in distinct:
            distinct.append(shape)
    if len(distinct) <= budget:
        return tuple(distinct)
    return tuple(distinct[(i + 1) * len(distinct) // (budget + 1)] for i in range(budget))


@dataclass(frozen=True)
class Lengths:
    """The sequence lengths a subject takes (Capabilities.seqlen_multiple, equal_seqlens), as a draw makes
    them: a drawn length rounded to a multiple (`aligned`: up, or down where up passes the cap), and k's the
    same as q's where they must be equal. The tile edges drawn become edges in whole tiles: 1 to 128 rounds
    to one tile of 128, 129 to two. A subject that declares neither draws every length as it was drawn."""

    multiple: int = 1
    equal: bool = False

    def __call__(self, seqlen_q: int, seqlen_k: int, cap: int) -> tuple:
        if self.multiple > 1:  # 0, a ragged batch's empty sequence, stays 0
            seqlen_q, seqlen_k = aligned(seqlen_q, self.multiple, cap), aligned(seqlen_k, self.multiple, cap)
        return (seqlen_q, seqlen_q if self.equal else seqlen_k)


def _seqlen_cap(limits: Limits, nheads: int, head_dim: int) -> int:
    """The longest sequence a case of these heads may draw within the limits (the ragged draw's cap too)."""
    return max(1, min(limits.max_seqlen, limits.max_elements // (nheads * head_dim)))


def aligned(n: int, multiple: int, limit: int) -> int:
    """n (a head dim, a length) rounded up to a multiple of `multiple`, or down where up would pass limit."""
    up = -(-n // multiple) * multiple
    return up if up <= limit else max(multiple, n // multiple * multiple)


def _bound(seqlen_k: int) -> st.SearchStrategy[int]:
    """One side of a window, at its edges two times in three: no bound, 0 (the diagonal alone; twice as
    often), one key, one short of seqlen_k, wider than seqlen_k."""
    edges = st.sampled_from(sorted({-1, 0, 1, max(0, seqlen_k - 1), seqlen_k + 3}) + [0])
    return st.one_of(edges, edges, st.integers(-1, seqlen_k + 8))


@st.composite
def variants(draw, features: tuple, *, seqlen_k: int, forced: str | None = None,
             max_head_dim_v: int = MAX_HEAD_DIM_V) -> dict:
    """The variant fields for the features given, each on or off (off first: shrinking turns it off), the
    forced one on."""
    out = {}
    for f in features:
        if f != forced and not draw(st.sampled_from(ON)):
            continue
        if f == "window":
            out["window"] = (draw(_bound(seqlen_k)), draw(_bound(seqlen_k)))
        elif f == "softcap":
            out["softcap"] = draw(st.one_of(st.sampled_from(SOFTCAPS), st.floats(0.05, 100.0)))
        elif f == "alibi":
            out["alibi"] = draw(st.sampled_from(("head", "batch-head", "zero")))
        elif f == "sinks":
            # about the rows' lse (twice as often: there its gradient is largest), all the weight, none, and
            # the off-by-one sink's fixed 0
            out["sinks"] = draw(st.sampled_from(("around", "above", "below", "around", "zero")))
        elif f == "head_dim_v":
            # up to 256 like q/k's (what most kernels take), 512 (MLA) among the edges
            listed = [d for d in HEAD_DIMS_V + HEAD_DIMS if d <= max_head_dim_v]
            out["head_dim_v"] = draw(st.one_of(st.sampled_from(listed), st.integers(1, min(MAX_HEAD_DIM,
                                                                                           max_head_dim_v)),
                                               st.sampled_from(COMMON_HEAD_DIMS)))
    return out
