"""The `triton` subject: the bundled Triton kernels under test. The kernels are imported inside the
functions that launch them, once _choose_interpreter has chosen the interpreter where there is no GPU."""
from __future__ import annotations

import dataclasses
import itertools
import os

import torch

from faverify.kernels.constants import HOPPER_CASES
from faverify.subjects.base import Capabilities, Subject


def _choose_interpreter() -> None:
    # Without a GPU the kernels run under the Triton interpreter, which must be chosen before the
    # kernels are defined (triton.jit reads it at decoration time).
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


# What each subject runs (docs/design.md, "Ragged and paged"): the variant features every kernel takes,
# then the ragged kinds. The paged decode takes no sinks (split partials take none) and has no backward.
VARIANTS = dict(window=True, softcap=True, alibi=True, head_dim_v=True)
# The dense subject also takes masks (block patterns as their blocks, which it skips when empty; any other
# as a bool attn_mask, run as a bias of 0 and -inf) and biases with their gradient.
KINDS = {"triton": dict(sinks=True, init_modes=("-inf", "-1e30"), mask=True, block_mask=True, bias=True,
                        bias_grad=True, lse_grad=True, max_logit=True, sparse=True, kv_shared=True),
         "triton-varlen": dict(sinks=True, init_modes=("-inf", "-1e30"), varlen=True, dense=False),
         "triton-paged": dict(paged=True, dense=False, splits=True, backward=False)}
# The warp-specialized Hopper backwards (hopper/backward.py, hopper/backward_fused.py) are opt-in
# (Launch.hopper_backward, Launch.fused_backward) until they are faster than the Triton one: these subjects
# ask for them, so a fuzz and the mutants reach them. Their cases are dense 16-bit attention without ALiBi,
# head dims that fill 16-byte rows, on sm_90; elsewhere (or in the "strided" layout) the Triton backward
# runs, and the path counts say so: the Hopper kernels' cases, which their mutants draw too
# (constants.HOPPER_CASES). Name -> the Launch's fields.
HOPPER_BACKWARDS = {"triton-hopper-bwd": dict(hopper_backward=True, deterministic=True),
                    "triton-hopper-bwd-fast": dict(hopper_backward=True, deterministic=False),
                    "triton-hopper-bwd-fused": dict(fused_backward=True)}
for _name in HOPPER_BACKWARDS:
    KINDS[_name] = dict(devices=("cuda",), dtypes=HOPPER_CASES["dtypes"], head_dims=HOPPER_CASES["head_dims"],
                        init_modes=("-inf", "-1e30"), window=False, softcap=False, alibi=False, head_dim_v=False)


def _wrap(name: str, interface, description: str, kind: str = "triton") -> Subject:
    from faverify.kernels.triton.build import clock
    from faverify.kernels.triton.common import INTERPRET

    if kind == "triton":
        def fn(q, k, v, **kwargs):
            return interface.flash_attn_func(q, k, v, return_lse=True, **kwargs)
    elif kind in HOPPER_BACKWARDS:
        launch = interface.Launch(**HOPPER_BACKWARDS[kind])

        def fn(q, k, v, **kwargs):
            return interface.flash_attn_func(q, k, v, return_lse=True, launch=launch, **kwargs)
    elif kind == "triton-varlen":
        def fn(q, k, v, **kwargs):
            return interface.flash_attn_varlen_func(q, k, v, return_lse=True, **kwargs)
    else:
        def fn(q, k, v, *, block_table, cache_seqlens, **kwargs):
            return interface.flash_attn_with_kvcache(q, k, v, cache_seqlens, block_table, return_splits=True,
                                                     **kwargs)
    extra = dict(split_block=interface._var.SPLIT_BLOCK) if kind == "triton-paged" else {}
    caps = Capabilities.of(**{"devices": ("cpu",) if INTERPRET else ("cuda",), "lse": True, **VARIANTS, **KINDS[kind],
                           **extra})
    mode = "under the Triton interpreter (CPU)" if INTERPRET else "compiled for the GPU"
    if kind in HOPPER_BACKWARDS:  # GPU only, whatever this machine has
        mode = "compiled for sm_90"
    clock.install()
    return Subject(name=name, fn=fn, caps=caps, description=f"{description}, {mode}",
                   warmup=None if INTERPRET else WARMUPS[kind], paths=interface.take_paths,
                   compile_seconds=clock.take)


def warmup_cases(dtypes: tuple) -> list:
    """One small case per compiled variant a fuzz of these dtypes can meet (Subject.warmup).

    A launch compiles per dtype, padded head dim (BLOCK_DS), causal, EVEN_D (head dim == its padding),
    and fast or generic build (interface._build: fast when every stride is a multiple of 16 and every
    pointer 16-byte aligned). Contiguous inputs take the fast build when the head dim is a multiple of
    16 (the padding itself, or e.g. 96 in 128), the generic one otherwise (e.g. 127); the "strided"
    layout (row pitch head_dim + 8) always takes the generic one. The tiles are the defaults, which do
    not depend on the shape, so one shape serves. Ordered so that concurrent workers start on different
    variants."""
    from faverify.cases.case import Case
    from faverify.kernels.triton.common import BLOCK_DS

    def head_dims(bd: int, layout: str) -> tuple:
        if layout == "strided":
            return (bd,)
        return (bd, bd - 1) + ((bd - 16,) if bd >= 64 else ())  # bd - 16: a multiple of 16 below bd

    variants = [(layout, head_dim) for layout in ("contiguous", "strided")
                for bd in BLOCK_DS for head_dim in head_dims(bd, layout)]
    # ALiBi alone (or with sinks) takes the dense backward's ALIBI build (KernelVariant.backward_is_dense): the same
    # builds again with it; a fuzz that draws no ALiBi drops them (for_features)
    cases = [Case(batch=1, seqlen_q=97, seqlen_k=97, nheads=2, nheads_k=1, head_dim=head_dim, dtype=dtype,
                  causal=causal, layout=layout, alibi=alibi)
             for alibi in ("off", "head") for layout, head_dim in variants for dtype in dtypes
             for causal in (False, True)]
    # the ones the Hopper forward takes (16-bit, aligned, padded head dim 64 or 128, no ALiBi) once more at
    # seqlens that are multiples of 16: its other build (hopper.forward.kernel)
    return cases + aligned_twins([c for c in cases if c.dtype in HOPPER_CASES["dtypes"] and c.alibi == "off"
                                  and c.layout == "contiguous" and c.head_dim in HOPPER_CASES["head_dims"]])


def aligned_twins(cases: list) -> list:
    """Each case again with seqlens 96: the Hopper forward has a build specialized on seqlens that are both
    multiples of 16 and one specialized on nothing (hopper.forward.kernel); a warm-up that ran only the
    second left the first to compile in every GPU worker whose case had such seqlens."""
    return [dataclasses.replace(c, seqlen_q=96, seqlen_k=96) for c in cases]


def variant_warmup_cases(dtypes: tuple, kind: str = "triton") -> list:
    """One small case per common build of the variant kernels (variant/forward.py: a build per dtype, padded
    head dim and switches SOFTCAP, VARLEN, PAGED, fast or generic; windows, causal, ALiBi and sinks are
    runtime values, q/k and v share one padding): each padded head dim, softcap on or off, the head dim
    that fills its padding (the fast build, variant.interface.fast_build) and one less (the generic); the
    paged decode's tiles of 16 query rows and its prefill's; for triton the bias and block-mask builds
    (generic whatever the head dim). The Hopper forward's builds are hopper_variant_warmup_cases'."""
    from faverify.cases.case import Case
    from faverify.cases.vocabulary import BIAS_DTYPES
    from faverify.kernels.triton.common import BLOCK_DS

    out = []
    for bd in BLOCK_DS:
        for dtype in dtypes:
            for softcap, extras in ((0.0, False), (5.0, True)):
                for head_dim in (bd, bd - 1):
                    common = dict(nheads=2, nheads_k=1, head_dim=head_dim, dtype=dtype, window=(16, -1),
                                  softcap=softcap, alibi="head")
                    if kind == "triton-paged":
                        out += [Case.of(batch=1, seqlen_q=sq, seqlen_k=97, cache_seqlens=(97,), page_size=16,
                                        splits=2, **common) for sq in (1, 97)]
                    elif kind == "triton-varlen":
                        out.append(Case.of(batch=1, seqlen_q=97, seqlen_k=97, seqlens=((97, 97),),
                                           sinks="around" if extras else "off", **common))
                    else:
                        out.append(Case(batch=1, seqlen_q=97, seqlen_k=97, sinks="around" if extras else "off",
                                        **common))
                        # the builds with a bias (BIAS; DBIAS in dq when it requires grad; a bool mask runs
                        # as an fp32 one), a build per dtype of the bias pointer, and with a block mask (BLOCKS)
                        out += [Case.of(batch=1, seqlen_q=97, seqlen_k=97, **common, **masks) for masks in (
                            *(dict(bias="normal", bias_grad=grad, bias_dtype=bias_dtype)
                              for bias_dtype in BIAS_DTYPES for grad in (True, False)),
                            dict(mask="block", mask_block=16, mask_rate=50, mask_shape="shared"))
                            if head_dim == bd]
    return out


def sparse_warmup_cases(dtypes: tuple) -> list:
    """The sparse-indices kernels' builds (sparse.py, specialized on nothing at run time): a build per dtype
    and padded head dims of q/k and of v; the group's rows pad to 16 for every group drawn."""
    from faverify.cases.case import Case
    from faverify.kernels.triton.common import BLOCK_DS
    return [Case.of(batch=1, seqlen_q=33, seqlen_k=97, nheads=2, nheads_k=1, head_dim=bd, dtype=dtype,
                    head_dim_v=None if bdv == bd else bdv, sparse="distinct", topk=40)
            for bd in BLOCK_DS for bdv in BLOCK_DS for dtype in dtypes]


def hopper_variant_warmup_cases(dtypes: tuple) -> list:
    """The Hopper forward's variant builds (hopper/forward.py's WINDOW, SOFTCAP, ALIBI, SINKS, each set of
    them a build a fuzz draws; CAUSAL orders the blocks where no window is set) at its head dims, 16-bit,
    seqlens that are no multiples of 16 (the build specialized on nothing; hopper.forward.kernel) and their
    aligned twins."""
    from faverify.cases.case import Case
    switches = []
    for window, softcap, alibi, sinks in itertools.product((False, True), repeat=4):
        on = dict(window=(16, 3) if window else (-1, -1), softcap=5.0 if softcap else 0.0,
                  alibi="head" if alibi else "off", sinks="around" if sinks else "off")
        if window or softcap or alibi or sinks:  # none: the dense forward's build (warmup_cases)
            switches += [on] if window else [on, dict(on, causal=True)]  # a window leaves CAUSAL unset
    cases = [Case(batch=1, seqlen_q=97, seqlen_k=97, nheads=2, nheads_k=1, head_dim=bd, dtype=dtype, **sw)
             for bd in (64, 128) for dtype in dtypes if dtype in ("bf16", "fp16") for sw in switches]
    return cases + aligned_twins(cases)


# The variant features the variant kernels take as runtime values, with no build of their own: a warm-up
# case wears them only to reach those kernels. Every other feature is a compile-time switch (softcap, a
# bias, a block mask) or the subject's batch layout; the Hopper forward compiles its window, ALiBi and
# sinks as well.
RUNTIME_FEATURES = {"window": (-1, -1), "alibi": "off", "sinks": "off", "head_dim_v": None}


def for_features(cases: list, features: tuple, runtime: tuple = tuple(RUNTIME_FEATURES)) -> list:
    """The warm-up cases a fuzz drawing `features` needs: the runtime features it does not draw turned off
    (a case may then take the dense kernels, whose warm-up it is), and the cases that still use a feature
    it does not draw left out. The batch layouts (varlen, paged, splits) are the subject's own."""
    from faverify.cases.vocabulary import BATCH_FEATURES
    drawn = set(features) | set(BATCH_FEATURES)
    out: list = []
    for case in cases:
        off = {f: RUNTIME_FEATURES[f] for f in runtime if f in case.features() and f not in drawn}
        case = dataclasses.replace(case, **off) if off else case
        if set(case.features()) <= drawn and case not in out:
            out.append(case)
    return out


WARMUPS = {"triton": lambda dtypes, features: list(dict.fromkeys(  # one case of ALiBi alone is in both
               for_features(warmup_cases(dtypes) + variant_warmup_cases(dtypes) + sparse_warmup_cases(dtypes), features)
               + for_features(hopper_variant_warmup_cases(dtypes), features, runtime=()))),
           "triton-varlen": lambda dtypes, features: for_features(variant_warmup_cases(dtypes, "triton-varlen"),
                                                                  features),
           "triton-paged": lambda dtypes, features: for_features(variant_warmup_cases(dtypes, "triton-paged"),
                                                                 features)}


def _hopper_backward_warmup(dtypes: tuple, features: tuple) -> list:
    """The dense subject's warm-up cases that the Hopper backward subjects draw: 16-bit, no ALiBi, their
    head dims."""
    caps = KINDS["triton-hopper-bwd"]
    return [c for c in for_features(warmup_cases(dtypes), features)
            if c.dtype in caps["dtypes"] and c.alibi == "off" and c.head_dim in caps["head_dims"]]


WARMUPS.update({name: _hopper_backward_warmup for name in HOPPER_BACKWARDS})


DESCRIPTIONS = {"triton": "bundled FlashAttention-2 in Triton, dense and every variant",
                "triton-varlen": "bundled FlashAttention-2 in Triton, varlen batches (flash_attn_varlen_func)",
                "triton-paged": "bundled FlashAttention-2 in Triton, paged KV-cache decode with split-KV "
                                "(flash_attn_with_kvcache)",
                "triton-hopper-bwd": "bundled FlashAttention-2 in Triton with the warp-specialized Hopper dK/dV "
                                     "(opt-in, sm_90), dQ from the Triton kernel: deterministic",
                "triton-hopper-bwd-fast": "bundled FlashAttention-2 in Triton with the warp-specialized Hopper "
                                          "backward (opt-in, sm_90), dQ fused by fp32 atomics: not deterministic",
                "triton-hopper-bwd-fused": "bundled FlashAttention-2 in Triton with the fused Hopper backward "
                                           "(opt-in, sm_90): one pass, dQ reduced by the copy engine, not "
                                           "deterministic"}


def make(kind: str = "triton") -> Subject:
    _choose_interpreter()
    if kind == "triton-fp8":
        return fp8_subject()
    from faverify.kernels.triton import interface
    return _wrap(kind, interface, DESCRIPTIONS[kind], kind)


def fp8_subject(name: str = "triton-fp8", attn=None, description: str = "bundled FP8 forward in Triton") -> Subject:
    """The `triton-fp8` subject: the FP8 forward (fp8.py; attn: a mutant's copy of fp8_attn_func), FP8 cases
    alone, forward only."""
    _choose_interpreter()
    from faverify.kernels.triton import fp8
    from faverify.kernels.triton.build import clock
    from faverify.kernels.triton.common import INTERPRET, take_paths
    attn = attn or fp8.fp8_attn_func

    def fn(q, k, v, *, causal, softmax_scale, q_descale, k_descale, v_descale):
        return attn(q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, causal=causal,
                    softmax_scale=softmax_scale)

    caps = Capabilities.of(dtypes=("bf16",), devices=("cpu",) if INTERPRET else ("cuda",), lse=True, backward=False,
                           fp8=("tensor", "head"), fp8_only=True, window=False, softcap=False, alibi=False,
                           head_dim_v=False, tile=(fp8.BLOCK_M, fp8.BLOCK_N))
    mode = "under the Triton interpreter (CPU)" if INTERPRET else "compiled for the GPU (sm_89 and later)"
    clock.install()
    return Subject(name=name, fn=fn, caps=caps, description=f"{description}, {mode}", paths=take_paths,
                   compile_seconds=clock.take)
