"""The mutants: (file, marked site, replacement statement), each with the bug and why authors make it.

A site is a line of kernels/triton/ that carries `[mutant site: NAME]` in its comment (build.mutate
replaces its statement); several mutants may share one site."""
from __future__ import annotations

from dataclasses import dataclass

from faverify.kernels.constants import HOPPER_CASES


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # in kernels/triton/
    site: str  # the marker's name: exactly one line of the file carries it
    new: str  # the statement(s) that replace the marked one; "" deletes it
    bug: str
    why: str
    subject: str = "triton"  # the subject whose entry point runs the mutated code (kernels/triton/subject.py)
    runs_on: str = "any"  # "sm_90": the mutated code runs only there (the Hopper forward), a GPU of that kind
    # the draw narrowed to cases that run the mutated code (strategies.cases' arguments, FuzzPlan.narrow);
    # None: every case runs it. A default fuzz on an H200 sends about 1 case in 8 to the Hopper forward:
    # 100 cases of each of its mutants reached it 0 to 4 times (H200, 2026-11), too few to test the verdicts.
    cases: dict | None = None
    # the code paths that run the mutated code, where that is not every path of the file (_PATH_OF)
    paths: tuple | None = None
    # the longest sequence (and paged cache) drawn for it, where the bug shows on short ones and long ones
    # cost minutes: on the CPU, the paged mutants' 100-case runs took 99-115 s at 256 keys and 4-7 s at
    # 64, killed by their third case either way (2026-12-07); None: the run's own limit
    max_seqlen: int | None = None

    def reaches(self, path: str) -> bool:
        """Whether a case that took this code path (interface.PATHS) ran the mutated code."""
        return path.startswith(self.paths or _PATH_OF[self.file])  # a prefix or a tuple of them


# the prefix of interface.PATHS each kernel file's code runs under ("" : the launcher, every path)
_PATH_OF = {"dense/forward.py": "fwd triton", "hopper/forward.py": "fwd hopper", "dense/backward.py": "bwd triton",
            "hopper/backward.py": "bwd hopper", "hopper/backward_fused.py": "bwd fused hopper",
            "interface.py": "", "variant/forward.py": "fwd variant", "variant/decode.py": "fwd variant decode",
            "variant/backward.py": "bwd variant",
            "variant/interface.py": ("fwd variant", "bwd variant"), "sparse.py": ("fwd sparse", "bwd sparse"),
            "fp8.py": "fwd fp8"}


def left_out(mutant: Mutant, device, dtypes: tuple) -> str | None:
    """Why the mutated code cannot run on `device` for these dtypes (a mutant would survive for nothing
    there), or None."""
    if not applicable(mutant, device):
        return f"its code runs only on {mutant.runs_on} GPUs, not on {device}"
    wanted = (mutant.cases or {}).get("dtypes", dtypes)
    if not set(wanted) & set(dtypes):
        return f"its code runs only for {', '.join(wanted)}, not for {', '.join(dtypes)}"
    return None


def applicable(mutant: Mutant, device) -> bool:
    """Whether the mutated code runs on `device` (a torch.device): a mutant of code that never runs there
    would survive for nothing."""
    if mutant.runs_on == "any":
        return True
    import torch
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


MUTANTS = (
    Mutant("rescale-with-block-max", "dense/forward.py", "rescale",
           "alpha = tl.math.exp2((m_i - tl.max(qk, 1)) * qk_scale)",
           "the history is rescaled with the block's own max instead of exp(m_old - m_new)",
           "the two maxima look interchangeable in the algebra; they differ whenever a later block's max is "
           "below the running max"),
    Mutant("no-neg-inf-guard", "dense/forward.py", "neg-inf-guard", "m_use = m_new",
           "a running max started at -inf is subtracted unguarded: (-inf) - (-inf) = NaN on a row whose first "
           "block is fully masked",
           "with a -1e30 start it is harmless, and the NaN needs a masked first block to show"),
    Mutant("no-l-guard", "dense/forward.py", "final-division", "out = acc / l_i[:, None]",
           "no l == 0 guard: a row that sees no key divides 0 by 0",
           "no row is ever fully masked without causal masking and seqlen_q > seqlen_k"),
    Mutant("pv-fp16-accumulation", "dense/forward.py", "pv-accumulate",
           "acc = (acc * alpha[:, None] + mm(cast(p, v.dtype, INTERPRETED), v, INTERPRETED, IEEE))"
           ".to(tl.float16).to(tl.float32)",
           "the P V accumulator is kept in fp16",
           "it halves the accumulator's registers, and small cases stay inside fp16's range and precision",
           # drawn where the bug shows: values past fp16's range (a normal case's fp16 accumulator is a
           # rounding or two, which the verdict allows the result anyway)
           cases={"regimes": ("bf16-scale", "large", "outliers")}),
    Mutant("qk-fp16-accumulation", "dense/forward.py", "qk",
           "qk = mm(q, k, INTERPRETED, IEEE).to(tl.float16).to(tl.float32)",
           "the logits q k^T are kept in fp16 (as an fp16 accumulator leaves them)",
           "fp16 accumulation is the fast path on older tensor cores; logits stay small in normal data"),
    Mutant("causal-top-left", "dense/forward.py", "causal-diagonal",
           "diag = 0  # top-left alignment, as torch's is_causal",
           "causal mask aligned top-left instead of bottom-right",
           "the two agree whenever seqlen_q == seqlen_k, which is what most tests use"),
    # the shared mask inlined into the forward, comparison flipped
    Mutant("causal-reversed", "dense/forward.py", "mask",
           "keep = cols[None, :] < seqlen_k\n"
           "if CAUSAL:\n"
           "    keep = keep & (cols[None, :] >= offs_m[:, None] + diag)\n"
           "qk = tl.where(keep, qk, float(\"-inf\"))",
           "causal comparison reversed: rows see the future",
           "a sign or an operand order flipped in an index comparison"),
    Mutant("tail-not-masked", "dense/forward.py", "mask",
           "qk = mask_scores(qk, offs_m, cols, 1 << 30, diag, CAUSAL)",
           "the last key block is not masked when seqlen_k is not a multiple of the block",
           "benchmarks and most tests use seqlens that are multiples of 64 or 128"),
    Mutant("no-final-division", "dense/forward.py", "final-division", "out = acc",
           "the final division by l is missing",
           "a refactor of the epilogue drops it; with one key (l == 1) nothing changes"),
    Mutant("scale-inverse-d", "interface.py", "apply",
           "scale = 1.0 / q.shape[-1] if softmax_scale is None else scale\n"
           "out, lse, rowmax, log2l = FlashAttnFunction.apply(q, k, v, causal, scale, init, launch or DEFAULT)",
           "default softmax scale 1/d instead of 1/sqrt(d)",
           "both forms appear in papers; with an explicit scale the bug hides"),
    Mutant("lse-log2", "dense/forward.py", "lse",
           "lse = tl.where(seen, m_i * qk_scale + log2l, float(\"-inf\"))",
           "lse returned in log2 units",
           "the kernel works in log2 throughout and the conversion back to natural log is forgotten"),
    Mutant("bwd-delta-from-v", "interface.py", "delta-input", "o = v",
           "the backward's D = rowsum(dO * O) is computed from V instead of O",
           "O and V have the same shape in the common case seqlen_q == seqlen_k, nheads == nheads_k"),
    Mutant("dlse-dropped", "interface.py", "dlse", "",
           "the dense backward drops a loss's gradient on lse: dS = P * (dP - D), where dlse belongs beside D",
           "lse is returned for the forward's sake and its gradient is an afterthought; a loss on out alone "
           "never sees it", cases=dict(features=("lse_grad",), mixes=("one",))),
    Mutant("max-logit-unscaled", "interface.py", "max-logit", "result += (max_logits(rowmax, log2l, 1.0),)",
           "the max logit is returned in the kernel's raw q.k units, without the softmax scale",
           "the kernels keep logits unscaled and fold the scale into exp2; the row max they store is raw, and "
           "with softmax_scale 1 nothing changes", cases=dict(features=("max_logit",), mixes=("one",))),
    Mutant("sparse-minus-one-as-key-0", "sparse.py", "sparse-valid", "ok = (n < topk) & (idx < seqlen_k)",
           "a -1 index (an empty slot) is read as key 0 instead of naming no key",
           "the indices are clamped to a safe address and the validity test checks the upper bound alone; "
           "with every slot filled (topk <= seqlen_k, no -1) nothing changes",
           cases=dict(features=("sparse",), mixes=("one",))),
    Mutant("fp8-v-descale-ignored", "fp8.py", "fp8-v-descale", "v_descale = 1.0",
           "the FP8 forward leaves out v's descale: the output stays in v's e4m3 units",
           "q's and k's descales fold into the softmax's exponent and v's is applied apart, at the end; with "
           "a descale of 1 nothing changes", subject="triton-fp8", cases=dict(fp8_only=True)),
    Mutant("fp8-p-unscaled", "fp8.py", "fp8-p-scale", "p_scale = 1.0",
           "the FP8 forward rounds P to e4m3 as it is, in [0, 1]: weights under 2^-10 flush to zero",
           "the output is as right as before wherever the largest weights carry the row; only a tail of many "
           "small weights shows it", subject="triton-fp8", cases=dict(fp8_only=True)),
    Mutant("fp8-q-descale-twice", "fp8.py", "fp8-qk-descale",
           "qk_scale = q_descale * q_descale * tl.load(KD + off_b * nheads_k + off_hk) * scale_log2",
           "the FP8 forward applies q's descale to the logits twice",
           "the descales are folded into one factor in several places (the exponent, the lse); one gets it "
           "twice", subject="triton-fp8", cases=dict(fp8_only=True)),
    Mutant("dk-missing-scale", "dense/backward.py", "dk-scale", "",
           "dk misses the softmax scale",
           "dq's scale is applied in one kernel and dk's in another; one gets forgotten"),
    Mutant("gqa-no-group-sum", "dense/backward.py", "gqa-group", "for g in range(0, 1):",
           "GQA backward does not sum dk and dv over the query heads of the group",
           "with nheads == nheads_k (what most tests use) the group has one head"),
    Mutant("dq-causal-off-by-one", "dense/backward.py", "dq-mask",  # cols <= (i - 1) + diag is cols < i + diag
           "s = mask_scores(s, offs_m - 1, cols, seqlen_k, diag, CAUSAL)",
           "the dq kernel's causal mask drops the diagonal (< instead of <=)",
           "an off-by-one in one of three copies of the mask, seen in real kernels' trackers"),
)

# The Hopper forward (hopper/forward.py), the forward that runs on sm_90 for 16-bit head dims 33..128: the
# same classes of bug in its own code, plus one of its own (the consumer warpgroups' row offsets).
# Its cases (configs.hopper_forward, interface._use_hopper): 16-bit, padded head dim 64 or 128, every stride
# a multiple of 16 elements: head dims that are multiples of 16, in the layouts that keep them so ("strided"
# pads rows by 8).
HOPPER_MUTANTS = tuple(Mutant(name, "hopper/forward.py", site, new, bug, why, runs_on="sm_90", cases=HOPPER_CASES)
                       for name, site, new, bug, why in (
    ("hopper-no-neg-inf-guard", "neg-inf-guard", "m_use = m_new",
     "the Hopper forward subtracts an unguarded -inf running max: NaN on a row whose first tile is masked",
     "as no-neg-inf-guard, in a second copy of the softmax"),
    ("hopper-no-rescale", "rescale", "",
     "the Hopper forward never rescales acc when the running max grows",
     "with the p v product issued a tile late, the rescale moves after its wait and is easy to drop"),
    ("hopper-causal-top-left", "causal-diagonal", "diag = 0",
     "the Hopper forward aligns the causal mask top-left",
     "as causal-top-left: equal seqlens hide it"),
    ("hopper-tail-tile-unmasked", "full-tiles", "n_full = (full + BLOCK_N - 1) // BLOCK_N",
     "the Hopper forward counts the partial last key tile as full: keys past seqlen_k (zero-filled) enter the "
     "softmax", "tile counts rounded the wrong way; seqlens that are multiples of 128 hide it"),
    ("hopper-skip-own-diagonal", "key-tiles-end", "return 0, 0, n_full, hi // BLOCK_N",
     "the Hopper forward skips the key tile its rows' last diagonal (or seqlen_k) falls in",
     "the count of tiles a block or warpgroup may skip rounds down where it must round up; only some rows "
     "lose keys"),
    ("hopper-partial-consumer-idle", "idle-consumer", "n_mine = gl.where(first + HALF <= seqlen_q, n_mine, 0)",
     "a consumer warpgroup of the Hopper forward whose rows run past seqlen_q computes nothing, not even its "
     "rows before seqlen_q", "idle warpgroups past the end are skipped, and the test for one is an off-by-a-tile; "
     "seqlen_q a multiple of 64 hides it"),
    ("hopper-consumer-rows", "consumer-rows", "first = row0",
     "every consumer warpgroup of the Hopper forward takes the first 64 rows of the block",
     "the per-warpgroup offset is easy to lose when a kernel is split into partitions; blocks of 64 rows hide it"),
)) + tuple(Mutant(name, "hopper/forward.py", site, new, bug, why, runs_on="sm_90", cases=dict(HOPPER_CASES, features=f))
           for name, site, new, bug, why, f in (
    ("hopper-window-left-exclusive", "window-left",
     "keep = (cols[None, :] < seqlen_k) & (cols[None, :] > lower)",
     "the Hopper forward's window excludes its left bound", "as window-left-off-by-one, in the Hopper forward's "
     "copy of the mask", ("window",)),
    ("hopper-window-tiles-rounded-up", "window-lo", "lo = (gl.maximum(row0 + diag - left, 0) + BLOCK_N - 1) // BLOCK_N",
     "the Hopper forward skips the first key tile a window reaches when the window starts inside it",
     "as window-tiles-rounded-up: tile counts rounded up where they must round down", ("window",)),
    ("hopper-softcap-no-cap", "softcap", "s = tanh_approx(s * cap_scale)",
     "the Hopper forward's softcap keeps tanh without multiplying the cap back: every logit in [-1, 1]",
     "the cap enters twice, once divided and once multiplied, and the second is easy to drop", ("softcap",)),
    ("hopper-alibi-top-left", "hopper-alibi", "pos = offs_m",
     "the Hopper forward's ALiBi drops the seqlen_k - seqlen_q offset: distances measured top-left",
     "as alibi-top-left, in the Hopper forward's copy of the bias", ("alibi",)),
    ("hopper-sink-not-in-sum", "hopper-sink", "total = gl.where(seen, l_i * to_top, 0.0)",
     "the Hopper forward leaves the sink out of the softmax's denominator (and of lse)",
     "as sink-not-in-sum, in the Hopper forward's copy of the normalization", ("sinks",)),
))

# The variant kernels (variant/forward.py, variant/backward.py, variant/interface.py): a bug of each class the
# trackers of flash-attn, FlashInfer and vLLM show for the features, each fuzzed on cases that draw its feature.
def _variant(name, file, site, new, bug, why, features, subject="triton", always_split=False, paths=None,
             speculative=False, max_seqlen=None):
    ragged = subject != "triton"
    # mixes ("one",): every case uses one of the features (strategies.FEATURE_MIXES), none is spent elsewhere
    return Mutant(name, file, site, new, bug, why, subject=subject, paths=paths, max_seqlen=max_seqlen,
                  cases=dict(features=features, mixes=("one",), **({"ragged_only": True} if ragged else {}),
                             **({"always_split": True} if always_split else {}),
                             **({"speculative": True} if speculative else {})))


VARIANT_MUTANTS = (
    _variant("window-left-off-by-one", "variant/forward.py", "window-bound",
             "keep = (j < seqlen_k) & (j > i + diag - left) & (j <= i + diag + right)",
             "the window's left bound is exclusive: each row loses the first key of its window",
             "flash-attn's bounds are inclusive, cuDNN's left_bound is left + 1: one of the two gets "
             "translated into the other's form", ("window",)),
    _variant("window-tiles-rounded-up", "variant/forward.py", "window-tiles",
             "lo = (tl.maximum(start + lo_off, 0) + TILE - 1) // TILE * TILE",
             "the first key tile a window reaches is skipped when the window starts inside it",
             "tile counts rounded up where they must round down; windows aligned to the tile hide it",
             ("window",)),
    _variant("window-dkdv-bounds-swapped", "variant/backward.py", "dkdv-rows",
             "lo, full_lo, full_hi, hi = visible_tiles(start_n, BLOCK_N, -diag - left, -diag + right, "
             "seqlen_q, BLOCK_M)",
             "dk and dv invert the window with its bounds swapped: the query rows [j - d - left, j - d + right] "
             "instead of [j - d - right, j - d + left]",
             "the backward inverts the forward's key range into a query range, a second place for the bounds; "
             "symmetric windows hide it", ("window",)),
    _variant("softcap-no-derivative", "variant/backward.py", "softcap-derivative", "dsT = dsT",
             "dk and dv treat the capped logits as uncapped: dS lacks the factor 1 - tanh^2",
             "the forward is right, and small logits (tanh ~ identity) hide it", ("softcap",)),
    _variant("alibi-top-left", "variant/forward.py", "alibi-offset",
             "pos = offs_m",
             "the ALiBi bias drops the seqlen_k - seqlen_q offset: distances measured top-left",
             "the two agree when seqlen_q == seqlen_k", ("alibi",)),
    _variant("dense-bwd-alibi-top-left", "dense/backward.py", "dq-alibi-offset", "pos = offs_m",
             "dq's ALiBi, in the dense backward that ALiBi alone takes, drops the seqlen_k - seqlen_q offset",
             "the backward recomputes the forward's bias in a copy of its own; the two agree when seqlen_q == "
             "seqlen_k", ("alibi",)),
    _variant("sink-not-in-sum", "variant/forward.py", "sink-in-sum", "total = keys",
             "the sink is left out of the softmax's denominator (and of lse)",
             "the sink has no value, so it is easy to forget it still normalizes", ("sinks",)),
    Mutant("block-mask-read-at-tile-size", "variant/forward.py", "block-size",
           "return tl.load(blocks + (i // 64) * stride_km + (j // 64) * stride_kn, mask=ok, other=0)",
           "the block mask is read at the kernel's own block of 64 rows and keys, not at block_size",
           "block masks are often built at the kernel's tile size, and a mask of 64-blocks hides the bug",
           cases=dict(features=("mask",), masks=("block",))),
    _variant("dbias-not-summed", "variant/interface.py", "dbias-sum",
             "summed = ds_full[tuple(slice(0, 1) if i in dims else slice(None) for i in range(4))] "
             "if dims else ds_full",
             "dbias of a bias that broadcasts over batch or heads is the first batch element's or head's dS, "
             "not the sum over them", "a full-shape bias (what most tests pass) has nothing to sum",
             ("bias", "bias_grad")),
    _variant("dsinks-wrong-sign", "variant/interface.py", "dsinks-sign",
             "dsinks = (p_sink * rows_d).sum(1)",
             "dsinks with the wrong sign",
             "d lse / d z is +p_sink, and the minus of the softmax's Jacobian gets dropped", ("sinks",),
             paths=("bwd triton", "bwd variant")),  # every backward of a case with sinks computes dsinks
    _variant("varlen-reads-next-key", "variant/forward.py", "varlen-keys",
             "seqlen_k = (tl.load(CuK + off_b + 1) - bos_k + 1).to(tl.int32)",
             "each varlen sequence also attends to the first key of the next sequence (or of the tail)",
             "an exclusive end offset read as inclusive", ("varlen",), "triton-varlen"),
    _variant("paged-ignores-block-table", "variant/forward.py", "page-gather",
             "page = (cols // page_size).to(tl.int64)",
             "the paged gather reads pages in pool order, ignoring the block table",
             "caches filled in order make the block table the identity", ("paged",), "triton-paged", max_seqlen=64),
    _variant("combine-nan-on-empty", "variant/forward.py", "combine-empty",
             "out = acc / weight",
             "the split combine divides 0 by 0 for a row that no split saw",
             "empty partials need more splits than key blocks, or a window, to appear", ("paged", "splits"),
             "triton-paged", max_seqlen=64),
    _variant("split-count-floor", "variant/forward.py", "split-cut",
             "per = tl.maximum(1, tl.cdiv(seqlen_k, SPLIT_BLOCK) // num_splits) * SPLIT_BLOCK",
             "keys per split rounded down: the last split stops before the cache's end",
             "cache lengths that are multiples of splits x block hide it", ("paged", "splits"), "triton-paged",
             always_split=True),  # a case without splits never runs the cut
    _variant("decode-rows-mixed-layouts", "variant/decode.py", "decode-rows", "offs_i = offs_r // group",
             "the decode kernel takes a tile row's query index from the layout with a query's heads together "
             "(r // group) and its head from the layout with a head's queries together (r // seqlen_q)",
             "the two layouts agree at seqlen_q 1 and at group 1, the decodes most tests run; speculative "
             "decoding's few query rows under GQA tell them apart", ("paged",), "triton-paged",
             paths=("fwd variant decode",), speculative=True),  # only those run it wrong
)
# The Hopper backward (hopper/backward.py, opt-in: Launch.hopper_backward) in its fast mode, dQ fused by
# atomics (subject triton-hopper-bwd-fast): the bugs of a warp-specialized pipeline (a shared-memory stage
# reused while a consumer still reads it, a tile handed to the tensor cores without the fence that makes
# the threads' writes visible to them) beside those of the arithmetic. Its cases are the Hopper forward's.
HOPPER_BWD_MUTANTS = tuple(Mutant(name, "hopper/backward.py", site, new, bug, why, subject="triton-hopper-bwd-fast",
                                  runs_on="sm_90", cases=HOPPER_CASES)
                           for name, site, new, bug, why in (
    ("hopper-bwd-stage-reused-early", "bwd-stage-free", "",
     "the Hopper backward's producer loads the next q and dO into a stage without waiting until both "
     "consumers have released it", "a ring of stages is right only with both waits; dropping the "
     "producer's looks harmless while the consumers keep pace"),
    ("hopper-bwd-ds-no-fence", "bwd-ds-fence", "",
     "the Hopper backward hands dS^T, written to shared memory by the threads, to the dQ wgmma without the "
     "async-proxy fence", "the tensor cores read shared memory through another proxy; the race shows only "
     "when the write is late"),
    ("hopper-bwd-dk-unscaled", "bwd-dk-scale", "",
     "the Hopper backward's dK misses the softmax scale",
     "as dk-missing-scale, in the Hopper backward's copy: scale 1/sqrt(64) errs by 8x, but cases with "
     "softmax_scale near 1 hide it"),
    ("hopper-bwd-dq-drops-last-key-tile", "bwd-dq-rows",
     "in_q = (query0 + rows < seqlen_q) & (gl.program_id(0) < gl.num_programs(0) - 1)",
     "the Hopper backward's fused dQ leaves out the last key tile's share",
     "a reduction over tiles with its bound one short; only the last tile's share is missing, small where "
     "its keys carry little of the softmax"),
))
# The fused Hopper backward (hopper/backward_fused.py, opt-in: Launch.fused_backward; subject
# triton-hopper-bwd-fused): a reduce of dQ handed over too early, and an accumulator that loses the query
# tiles before the last. Its cases are the Hopper forward's.
FUSED_BWD_MUTANTS = tuple(Mutant(name, "hopper/backward_fused.py", site, new, bug, why,
                                 subject="triton-hopper-bwd-fused", runs_on="sm_90", cases=HOPPER_CASES)
                          for name, site, new, bug, why in (
    ("fused-bwd-reduce-before-dq", "fused-dq-ready",
     "mbarrier.wait(ds_ready.index(it % DS_SLOTS), (it // DS_SLOTS) & 1)",
     "the fused backward's reducer issues a query tile's dQ reduce once both consumers' dS is in shared memory, "
     "before their dQ is: it adds the tile before's dQ, or what the buffer held",
     "the dS barrier also says both consumers reached the tile, and waiting on it looks like the hand-over; "
     "the race is lost on every tile, but a tile whose dQ equals the one before hides it"),
    ("fused-bwd-dv-reset-per-tile", "fused-dv-acc",
     "dv = warpgroup_mma(p_tile.permute((1, 0)), do, dv, use_acc=False, is_async=True)",
     "the fused backward's dV accumulator restarts on every query tile: dV is the last tile's P^T dO alone",
     "use_acc=False is right for S and dP, the wgmmas beside it; one query tile of one head (seqlen_q up to "
     "64, no GQA group) hides it"),
))
MUTANTS = MUTANTS + HOPPER_MUTANTS + HOPPER_BWD_MUTANTS + FUSED_BWD_MUTANTS + VARIANT_MUTANTS

BY_NAME = {m.name: m for m in MUTANTS}
