"""The keywords a subject is called with beyond (q, k, v, causal, softmax_scale): each variant feature's, in
flash-attn's names, passed only when the case uses the feature; and which of them a function cannot take.
`caps` is the subject's base.Capabilities."""
from __future__ import annotations

import inspect
from typing import Callable

from faverify.cases.case import Case

# The keywords each variant feature is passed by (flash-attn's names); head_dim_v has none: v's shape says it.
KEYWORDS = {"window": ("window_size",), "softcap": ("softcap",), "alibi": ("alibi_slopes",), "sinks": ("sinks",),
            "varlen": ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
            "paged": ("block_table", "cache_seqlens"), "splits": ("num_splits",), "mask": ("attn_mask",),
            "bias": ("attn_mask",), "score_mod": ("score_mod",), "mask_mod": ("mask_mod",),
            "block_mask": ("block_mask", "block_size"), "fp8": ("q_descale", "k_descale", "v_descale"),
            "sparse": ("indices",)}


def variant_keywords(case: Case, extras: dict, caps) -> dict:
    """The keywords of the variant features the case uses, and only those (a dense case calls a subject
    exactly as before); a mask in the form the subject takes (Capabilities.mask_form)."""
    used = case.features()
    kwargs = {}
    if "window" in used:
        kwargs["window_size"] = case.window
    if "softcap" in used:
        kwargs["softcap"] = case.softcap
    for feature, name in (("alibi", "alibi_slopes"), ("sinks", "sinks")):
        if feature in used:
            if name not in extras:  # faverify's own mistake: the case would run without its slopes or sinks
                raise KeyError(f"the case uses {feature} but its {name} were not passed (Inputs.extras())")
            kwargs[name] = extras[name]
    if "varlen" in used:
        kwargs.update(cu_seqlens_q=extras["cu_seqlens_q"], cu_seqlens_k=extras["cu_seqlens_k"],
                      max_seqlen_q=case.seqlen_q, max_seqlen_k=case.seqlen_k)
    if "paged" in used:
        kwargs.update(block_table=extras["block_table"], cache_seqlens=extras["cache_seqlens"])
    if "splits" in used:
        kwargs["num_splits"] = case.splits
    if "mask" in used:
        form = caps.mask_form(case)
        if form == "block_mask":
            kwargs.update(block_mask=extras["block_mask"], block_size=case.mask.block)
        elif form is not None:  # attn_mask or mask_mod: extras holds each by its keyword
            kwargs[form] = extras[form]
    if "bias" in used:
        kwargs["attn_mask"] = extras["bias"]
    if "score_mod" in used:
        kwargs["score_mod"] = extras["score_mod"]
    for feature in ("fp8", "sparse"):  # tensors passed by their own keywords
        if feature in used:
            kwargs.update({name: extras[name] for name in KEYWORDS[feature]})
    return kwargs


def missing_keywords(fn: Callable, caps) -> list:
    """The keywords of declared features that fn cannot take (none when it takes **kwargs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    if caps.ragged.combine:  # called as fn(out_splits, lse_splits)
        return []
    wanted = [w for f in caps.features() if f != "mask" for w in KEYWORDS.get(f, ())]
    wanted += [w for form in ("mask", "mask_mod", "block_mask") if getattr(caps.masks, form) for w in KEYWORDS[form]]
    if caps.out_buffer:
        wanted.append("out")
    return [w for w in wanted if w not in params]


def takes_init(fn: Callable) -> bool:
    try:
        return "init" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
