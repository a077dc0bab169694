"""The checks a Case passes when it is made: each field's type, range and consistency with the others, so a
case no kernel call could mean is refused with the field, its value and the rule (UsageError)."""
from __future__ import annotations

import math

from faverify.cases.groups import GROUPS, Bias, Mask, flattened, is_off
from faverify.cases.vocabulary import (
    ALIBI,
    BIAS_DTYPES,
    BIASES,
    DTYPES,
    FP8,
    FP8_FORMATS,
    FP8_OWN_REGIMES,
    INITS,
    KEY_MASKS,
    LAYOUTS,
    LSE_GRADS,
    MASK_SHAPES,
    MASKS,
    MAX_HEAD_DIM_V,
    MAX_INT,
    MAX_SCALE,
    MAX_SEED,
    MAX_SEQUENCES,
    MAX_SPLITS,
    MAX_TOPK,
    MLA_HEAD_DIM,
    PAGE_ORDERS,
    REGIMES_ALL,
    SCORE_MODS,
    SHARDS,
    SINKS,
    SPARSE,
)
from faverify.errors import UsageError

FP8_FORMAT_RULE = f"must be one of {', '.join(FP8_FORMATS)}, with fp8 on"

def check(case) -> None:
    """Refuse a case no kernel call could mean (UsageError names the field, its value and the rule);
    normalize the fields JSON gives as lists."""
    for name in ("batch", "nheads", "nheads_k", "head_dim"):
        _require_int(name, getattr(case, name), minimum=1)
    for name in ("seqlen_q", "seqlen_k"):
        _require_int(name, getattr(case, name), minimum=0)
    _require_int("seed", case.seed, minimum=0, maximum=MAX_SEED - 1)  # torch.Generator.manual_seed: 64 bits
    if case.seqlen_q == 0:
        raise UsageError("seqlen_q", 0, "must be >= 1 (a case with no query rows checks nothing)")
    if case.head_dim > MLA_HEAD_DIM:
        raise UsageError("head_dim", case.head_dim, f"must be <= {MLA_HEAD_DIM}")
    if case.nheads % case.nheads_k:
        raise UsageError("nheads_k", case.nheads_k,
                         f"number of heads in key/value must divide nheads={case.nheads}")
    for name, allowed in (("dtype", DTYPES), ("regime", REGIMES_ALL), ("layout", LAYOUTS), ("init", INITS)):
        if getattr(case, name) not in allowed:
            raise UsageError(name, getattr(case, name), f"must be one of {', '.join(allowed)}")
    if not isinstance(case.causal, bool):
        raise UsageError("causal", case.causal, "must be true or false")
    if case.softmax_scale is not None:
        s = case.softmax_scale
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or not 0 < s <= MAX_SCALE:
            raise UsageError("softmax_scale", s, f"must be a number in (0, {MAX_SCALE:g}], or null for "
                                                 "head_dim ** -0.5 (past it fp32 logits overflow)")
    _check_variants(case)
    _check_fp8(case)
    _check_outputs(case)
    _check_sparse(case)
    _check_kv_shared(case)
    _check_before(case)


def _check_kv_shared(case) -> None:
    """v as the leading head_dim_v columns of k's storage: v no wider than k, one dense batch."""
    if not isinstance(case.kv_shared, bool):
        raise UsageError("kv_shared", case.kv_shared, "must be true or false")
    if case.kv_shared and (case.dv > case.head_dim or case.kind != "dense" or case.fp8 is not None):
        raise UsageError("kv_shared", True, f"needs head_dim_v <= head_dim (got {case.dv} > {case.head_dim})"
                         if case.dv > case.head_dim else "takes a dense batch of 16-bit or fp32 inputs")


def _check_outputs(case) -> None:
    """The outputs a case asks for beside out and lse: a loss on lse, the max logit."""
    if case.lse_grad not in LSE_GRADS:
        raise UsageError("lse_grad", case.lse_grad, f"must be one of {', '.join(LSE_GRADS)}")
    if not isinstance(case.max_logit, bool):
        raise UsageError("max_logit", case.max_logit, "must be true or false")
    for name, on in (("lse_grad", case.lse_grad != "off"), ("max_logit", case.max_logit)):
        if on and (case.kind != "dense" or case.splits > 1 or case.fp8 is not None):
            raise UsageError(name, getattr(case, name), "takes dense cases with one split and no FP8 (a value of "
                                                        "each whole row of a dense batch); this case is "
                                                        + (case.kind if case.kind != "dense" else "split or FP8"))


def _check_sparse(case) -> None:
    if case.sparse is None:
        return
    if case.sparse.indices not in SPARSE:
        raise UsageError("sparse", case.sparse.indices, f"must be one of {', '.join(SPARSE)}")
    _require_int("topk", case.sparse.topk, minimum=1, maximum=MAX_TOPK)
    others = [f for f in case.features() if f in ("window", "varlen", "paged", "splits", "mask", "bias",
                                                  "score_mod", "fp8")]
    if case.causal or others:
        raise UsageError("sparse", case.sparse.indices, "the indices alone say which keys a row sees: no causal "
                                                        "mask, window, mask, bias or ragged batch beside them; this "
                                                        "case has " + ", ".join((["causal"] if case.causal else [])
                                                                                + others))


def _check_fp8(case) -> None:
    if case.fp8 is None:
        if case.regime in FP8_OWN_REGIMES:
            raise UsageError("regime", case.regime, "is an FP8 case's regime (fp8 is off)")
        return
    if case.fp8.granularity not in FP8:
        raise UsageError("fp8", case.fp8.granularity, f"must be one of {', '.join(FP8)}")
    if case.fp8.format not in FP8_FORMATS:
        raise UsageError("fp8_format", case.fp8.format, FP8_FORMAT_RULE)
    if case.dtype != "bf16":
        raise UsageError("dtype", case.dtype, "an FP8 case's output is bf16, as flash-attn 3 and 4 return it")
    others = [f for f in case.features() if f != "fp8"]
    if others or case.kind != "dense":
        raise UsageError("fp8", case.fp8.granularity, "takes dense attention alone; this case has "
                                                      + (", ".join(others) or case.kind))


# the most calls a sequence makes before its last (`fuzz --sequence`: 1..MAX_CALLS calls in all)
MAX_CALLS = 64


def _check_before(case) -> None:
    before = case.before
    if not isinstance(before, tuple) or not all(type(c) is type(case) for c in before):
        raise UsageError("before", before, "must be a list of cases (the calls made before this one)")
    if len(before) >= MAX_CALLS:
        raise UsageError("before", f"{len(before)} calls", f"a sequence makes at most {MAX_CALLS} calls in all")
    if any(c.before for c in before):
        raise UsageError("before", "a call with calls before it", "the earlier calls of a sequence have none of "
                                                                  "their own: list them all in one `before`")


def _check_variants(case) -> None:
    w = case.window
    if not isinstance(w, (list, tuple)) or len(w) != 2:
        raise UsageError("window", w, "must be [left, right]")
    for side, bound in zip(("left", "right"), w):
        if isinstance(bound, bool) or not isinstance(bound, int) or not -1 <= bound <= MAX_INT:
            raise UsageError("window", f"[{side} bound of {_digits(bound)}]",
                             f"the {side} bound must be an integer in -1..{MAX_INT} (-1: no bound)")
    object.__setattr__(case, "window", tuple(w))  # JSON gives a list
    c = case.softcap
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or not 0 <= c <= MAX_SCALE:
        raise UsageError("softcap", c, f"must be a number in [0, {MAX_SCALE:g}] (0: off; a larger cap leaves "
                                       "every logit as it is)")
    for name, allowed in (("alibi", ALIBI), ("sinks", SINKS)):
        if getattr(case, name) not in allowed:
            raise UsageError(name, getattr(case, name), f"must be one of {', '.join(allowed)}")
    if case.head_dim_v is not None:
        _require_int("head_dim_v", case.head_dim_v, minimum=1)
        if case.head_dim_v > MAX_HEAD_DIM_V:
            raise UsageError("head_dim_v", case.head_dim_v, f"must be in 1..{MAX_HEAD_DIM_V}, or null for head_dim")
    _check_groups(case)
    _check_ragged(case)
    _check_masks(case)


def _check_masks(case) -> None:
    m, b = case.mask, case.bias
    flat = {**flattened(Mask, m), **flattened(Bias, b), "score_mod": case.score_mod}
    for name, allowed in (("mask", MASKS), ("mask_shape", MASK_SHAPES), ("bias", BIASES),
                          ("bias_shape", MASK_SHAPES[:-1]), ("bias_dtype", BIAS_DTYPES), ("score_mod", SCORE_MODS)):
        if flat[name] not in allowed:
            raise UsageError(name, flat[name], f"must be one of {', '.join(allowed)}")
    for name in ("mask_nan", "bias_grad"):
        if not isinstance(flat[name], bool):
            raise UsageError(name, flat[name], "must be true or false")
    _require_int("mask_block", flat["mask_block"], minimum=0)
    _require_int("mask_rate", flat["mask_rate"], minimum=0)
    if flat["mask_rate"] > 100:
        raise UsageError("mask_rate", flat["mask_rate"], "must be a percent in 0..100")
    used = [n for n in ("mask", "bias", "score_mod") if flat[n] != "off"]
    if used and (case.kind != "dense" or case.splits > 1):
        raise UsageError(used[0], flat[used[0]], "is for dense cases only (not varlen, paged or split)")
    if m is not None and b is not None:
        raise UsageError("bias", b.values, "a case has a mask or a bias, not both (SDPA takes one attn_mask)")
    if case.score_mod != "off" and (case.softcap or case.alibi != "off"):
        raise UsageError("score_mod", case.score_mod, "replaces softcap and alibi: leave those off")
    if m is None:
        return
    if m.shape == "keys" and m.pattern not in KEY_MASKS:
        raise UsageError("mask_shape", "keys", f"takes a key mask: mask must be one of {', '.join(KEY_MASKS)}")
    if m.pattern == "block":
        _require_int("mask_block", m.block, minimum=1)
    elif m.block:
        raise UsageError("mask_block", m.block, "is for mask \"block\" only")
    if m.rate and m.pattern not in ("block", "random"):
        raise UsageError("mask_rate", m.rate, "is for masks \"block\" and \"random\" only")
    _check_mask_lengths(case, m)


def _check_mask_lengths(case, m) -> None:
    """padding: [q_len, k_len] per batch element; document: [q_len, k_len] per document; prefix: [n]."""
    lengths = m.lengths
    if m.pattern not in ("padding", "document", "prefix"):
        if lengths is not None:
            raise UsageError("mask_lengths", lengths, "is for masks padding, document and prefix only")
        return
    width = 1 if m.pattern == "prefix" else 2
    rule = "[prefix]" if width == 1 else "a list of [q_len, k_len] pairs"
    if not isinstance(lengths, (list, tuple)) or not lengths or not all(
            isinstance(p, (list, tuple)) and len(p) == width for p in lengths):
        raise UsageError("mask_lengths", lengths, f"must be {rule} for mask {m.pattern}"
                         if width == 2 else "must be [[prefix]] for mask prefix")
    for pair in lengths:
        for n in pair:
            _require_int("mask_lengths", n, minimum=0)
    lengths = tuple(tuple(p) for p in lengths)
    object.__setattr__(m, "lengths", lengths)
    if m.pattern == "padding" and len(lengths) != case.batch:
        raise UsageError("mask_lengths", list(map(list, lengths)),
                         f"must have one pair per batch element ({case.batch})")
    if m.pattern == "padding" and any(a > case.seqlen_q or b > case.seqlen_k for a, b in lengths):
        raise UsageError("mask_lengths", list(map(list, lengths)),
                         f"each [q_len, k_len] must be within [{case.seqlen_q}, {case.seqlen_k}]")
    if m.pattern == "prefix" and len(lengths) != 1:
        raise UsageError("mask_lengths", list(map(list, lengths)), "must be [[prefix]] for mask prefix")


# what a group whose feature is off says of its other fields (Case.of makes one where any of them is set)
OFF_RULES = {"varlen": "is for varlen cases only (seqlens is not set)",
             "paged": "is for paged cases only (cache_seqlens is not set)",
             "mask": "is for cases with a mask (mask is off)", "bias": "is for cases with a bias (bias is off)",
             "fp8": FP8_FORMAT_RULE, "sparse": "is a sparse case's (sparse is off)"}


def _check_groups(case) -> None:
    """Each group is of its class, and on: its first field is not at its off value (a case without the feature
    has None there), so a flat field set without the feature it qualifies is refused by its name."""
    for name, group in GROUPS.items():
        value = getattr(case, name)
        if value is None:
            continue
        if type(value) is not group:
            raise UsageError(name, value, f"must be a {group.__name__} or None (Case.of makes it from the flat "
                                          "fields)")
        key, *rest = group.FLAT
        flat = flattened(group, value)
        if not is_off(key, flat[key]):
            continue
        for field in rest:
            if not is_off(field, flat[field]):
                raise UsageError(field, flat[field], OFF_RULES[name])
        raise UsageError(key, flat[key], f"is off: a case without {name} has {name} None, not a {group.__name__}")


def _check_ragged(case) -> None:
    varlen, paged = case.varlen, case.paged
    if varlen is not None and paged is not None:
        raise UsageError("seqlens", list(varlen.seqlens), "a case is varlen or paged, not both (cache_seqlens is set)")
    _require_int("splits", case.splits, minimum=1)
    if case.splits > MAX_SPLITS:
        raise UsageError("splits", case.splits, f"must be in 1..{MAX_SPLITS}")
    if case.splits > 1 and case.sinks != "off":
        raise UsageError("splits", case.splits, "split-KV partials do not take sinks (a sink belongs to no key range)")
    if case.shards not in SHARDS:
        raise UsageError("shards", case.shards, f"must be one of {', '.join(SHARDS)}")
    if case.shards != "off" and (case.splits < 2 or case.kind != "dense"):
        raise UsageError("shards", case.shards, "needs splits >= 2 (the shard count) and a dense batch")
    if varlen is not None:
        _check_varlen(case, varlen)
    if paged is not None:
        _check_paged(case, paged)


def _check_varlen(case, varlen) -> None:
    _require_int("tail", varlen.tail, minimum=0)
    pairs = varlen.seqlens
    if not isinstance(pairs, (list, tuple)) or not pairs or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
        raise UsageError("seqlens", pairs, "must be a non-empty list of [seqlen_q, seqlen_k] pairs")
    for pair in pairs:
        for n in pair:
            _require_int("seqlens", n, minimum=0)
    pairs = tuple(tuple(p) for p in pairs)
    object.__setattr__(varlen, "seqlens", pairs)
    _require_shape(case, "seqlens", list(map(list, pairs)), len(pairs), max(p[0] for p in pairs),
                   max(p[1] for p in pairs))


def _check_paged(case, paged) -> None:
    lengths = paged.cache_seqlens
    if not isinstance(lengths, (list, tuple)) or not lengths:
        raise UsageError("cache_seqlens", lengths, "must be a non-empty list of key counts, one per sequence")
    for n in lengths:
        _require_int("cache_seqlens", n, minimum=0)
    object.__setattr__(paged, "cache_seqlens", tuple(lengths))
    _require_shape(case, "cache_seqlens", list(lengths), len(lengths), case.seqlen_q, max(lengths))
    _require_int("page_size", paged.page_size, minimum=1)
    if paged.pages not in PAGE_ORDERS:
        raise UsageError("pages", paged.pages, f"must be one of {', '.join(PAGE_ORDERS)}")
    _require_int("pool", paged.pool, minimum=0)
    need = case.pages_used + 1
    if paged.pool and paged.pool < need:
        raise UsageError("pool", paged.pool, f"must be 0 or at least {need} (the pages used, and one unused)")


def _require_shape(case, name: str, value: list, batch: int, seqlen_q: int, seqlen_k: int) -> None:
    """batch, seqlen_q and seqlen_k of a varlen or paged case are what its sequences give."""
    if batch > MAX_SEQUENCES:
        raise UsageError(name, f"[{batch} sequences]", f"must have at most {MAX_SEQUENCES} sequences (the FP64 "
                                                       "reference takes them one at a time)")
    if case.layout != "contiguous":
        raise UsageError("layout", case.layout, f"must be contiguous for a case with {name}")
    want = {"batch": batch, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k}
    for field, n in want.items():
        if getattr(case, field) != n:
            raise UsageError(field, getattr(case, field), f"must be {n}, as {name} {value} gives")


def _digits(value) -> str:
    """A value for an error message: a huge integer by its size, not its thousands of digits."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() >= 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)[:40]


def _require_int(name: str, value: object, *, minimum: int, maximum: int = MAX_INT) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(name, value, "must be an integer")
    if value < minimum:
        raise UsageError(name, value, f"must be >= {minimum}")
    if value > maximum:
        raise UsageError(name, value if value.bit_length() < 64 else f"an integer of {value.bit_length()} bits",
                         f"must be <= {maximum}")
