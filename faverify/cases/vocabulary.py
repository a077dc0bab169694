"""The case vocabulary: the values each field of a Case takes, the limits it is held to, and the tensors a
case's call produces. The draw (strategies.py), the checks (checks.py) and every subject read them here."""
from faverify.errors import UsageError

DTYPES = ("bf16", "fp16", "fp32")
# inputs.py draws each; "negative" and "lone-key" make rows whose every logit is far below zero (the bugs of
# kernels with a finite -inf sentinel, or that take exp of an lse in fp32)
REGIMES = ("normal", "large", "bf16-scale", "outliers", "constant", "peaked", "tiny", "negative", "lone-key")
# "broadcast": k and v expanded over batch and kv heads (stride 0); "spread": every stride of q, k, v
# twice or more the contiguous one
LAYOUTS = ("contiguous", "transposed", "strided", "packed", "broadcast", "spread")
INITS = ("-inf", "-1e30")
MAX_HEAD_DIM = 256  # the largest q/k head dim the general draw takes
MAX_HEAD_DIM_V = 512  # MLA's value head dim (576/512 for q/k and v)
MLA_HEAD_DIM = 576  # the largest q/k head dim a case may have: MLA's (512 of latent, 64 of rotary position)
MAX_SEED = 2**63
# every length, count and bound a kernel indexes with fits a signed 32-bit integer
MAX_INT = 2**31 - 1
# the largest softmax_scale and softcap: past it the logits of ordinary inputs overflow fp32
MAX_SCALE = 1e6
MAX_SEQUENCES = 1 << 16  # of a varlen or paged case
# ALiBi slopes: per head, per batch and head, or all zero (must give dense attention); drawn from the seed
ALIBI = ("off", "head", "batch-head", "zero")
# Sink logits per head, drawn from the seed: about the size of the rows' own log-sum-exp, far above every
# logit (all weight on the sink, out near 0) or far below (no weight on it); learned, their gradient judged.
# "zero": the off-by-one sink (Transformer Engine's softmax_type="off-by-one"), a fixed logit 0 that is not
# learned: passed as a zero tensor that asks no gradient
SINKS = ("off", "around", "above", "below", "zero")
# "varlen", "paged" and "splits" change the batch's shape rather than the logits (docs/design.md, "Ragged
# and paged"): sequences of their own lengths packed along the token axis, keys in a paged cache, and the
# keys cut into split-KV partial results; "shards" cuts them as context parallelism does instead (SHARDS)
VARIANT_FEATURES = ("window", "softcap", "alibi", "sinks", "head_dim_v")  # what the logits of a row are
BATCH_FEATURES = ("varlen", "paged", "splits", "shards")  # how the batch and its keys are laid out and cut
# masks and biases given as tensors or functions (docs/design.md, "Masks and biases"): a boolean keep-mask
# drawn as a pattern, masked keys holding NaN, an additive bias and its gradient, a FlexAttention score_mod
MASK_FEATURES = ("mask", "mask_nan", "bias", "bias_grad", "score_mod")
# FP8 inputs (docs/design.md, "FP8"): q, k and v in float8_e4m3fn with their descale factors, the output bf16
# and v given as the leading head_dim_v columns of k's own storage (MLA's absorbed form, DeepSeek-V4's K = V)
INPUT_FEATURES = ("fp8", "kv_shared")
# outputs beside out and lse: a loss on lse too (docs/design.md, "LSE gradient"); the rows' largest logit,
# returned when asked (return_max_logit=True: Transformer Engine's, cuDNN's Max, FlashMLA's max_logits)
OUTPUT_FEATURES = ("lse_grad", "max_logit")
# the keys a row sees given as indices (cases/sparse.py, docs/design.md, "Sparse key indices")
KEY_FEATURES = ("sparse",)
FEATURES = VARIANT_FEATURES + BATCH_FEATURES + MASK_FEATURES + INPUT_FEATURES + OUTPUT_FEATURES + KEY_FEATURES
# What a sparse case's indices hold: "distinct", valid keys listed once (-1 where topk passes seqlen_k);
# "duplicates", keys drawn with replacement; "invalid", -1 slots among them and rows of -1 alone;
# "out-of-range", indices at and past seqlen_k (invalid, as FlashMLA reads them)
SPARSE = ("off", "distinct", "duplicates", "invalid", "out-of-range")
MAX_TOPK = 64
# A loss on lse (flash-attn 4's dlse, FlexAttention's lse gradient, ring attention's merges): dlse drawn
# N(0, 1) per row, beside dO ("with") or with dO zero ("alone", where dv must be exactly 0)
LSE_GRADS = ("off", "with", "alone")
# An FP8 case's descale factors, flash-attn 3's [batch, nheads_k] q_descale, k_descale and v_descale: one
# value for the whole tensor, or one per batch entry and kv head; "block": q's per head, k's and v's
# [batch, nheads_k, blocks] per block of FP8_BLOCK keys, as a paged FP8 KV cache keeps one per page
FP8 = ("off", "tensor", "head", "block")
FP8_DRAWN = ("tensor", "head")  # drawn for a subject that declares no block scales
FP8_BLOCK = 16
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
# The FP8 formats: e4m3 (flash-attn 3 and 4, cuDNN's forward) and e5m2 (two bits less of precision, three
# more of range: cuDNN's and Transformer Engine's gradients, some KV caches), each with its largest finite value
FP8_FORMATS = {"e4m3": FP8_MAX, "e5m2": 57344.0}
# Regimes of FP8 cases alone (cases/fp8.py). "tail-mass": one key holds the row's max logit and a value of 0,
# every other key a logit ln(2^10) below it and a value of 1. Each of their weights, 2^-10, flushes to zero
# in e4m3 (its least subnormal is 2^-9) unless P is scaled before it is quantized; together they carry the
# output (about sk / (sk + 1024) of it). "limits": each element at the format's largest value or among its
# subnormals, so products of two reach 448^2 (past fp16) and the conversions meet both ends of the format.
# "block-spread": k and v smaller by 2^-10 in every other block of FP8_BLOCK keys, the first block among
# them: per-block scales 2^10 apart, and each row's max in a later block than the first
FP8_OWN_REGIMES = ("tail-mass", "limits", "block-spread")
FP8_REGIMES = ("normal", "large", "outliers", "peaked") + FP8_OWN_REGIMES
REGIMES_ALL = REGIMES + FP8_OWN_REGIMES
# A mask's pattern: per-batch key and query lengths; documents packed in one sequence (block-diagonal);
# a prefix seen by every row, causal after it; random blocks of mask_block keys and rows; random elements
MASKS = ("off", "padding", "document", "prefix", "block", "random")
# The mask's shape, SDPA's heads-first [b, h, sq, sk] with 1 where it broadcasts: "full" [b, h, sq, sk];
# "batch" [1, h, sq, sk]; "heads" [b, 1, sq, sk]; "shared" [1, 1, sq, sk]; "keys" [b, 1, 1, sk], a key
# mask every row shares (padding, block and random patterns only)
MASK_SHAPES = ("full", "batch", "heads", "shared", "keys")
KEY_MASKS = ("padding", "block", "random")
# Bias values: N(0, 1); N(0, 1) * BIAS_LARGE; N(0, 1) with the bias dtype's finfo.min (the -inf stand-in
# many callers use) at random positions and over whole rows
BIASES = ("off", "normal", "large", "min")
BIAS_DTYPES = ("input", "fp32")
# score_mods of the FlexAttention signature (mods.py): a relative position bias table, ALiBi and softcap
SCORE_MODS = ("off", "relative", "alibi", "softcap")
# Where a paged sequence's pages lie in the pool: one after the other; the pool reversed; a random
# permutation with unused pages between them; the first sequence's full pages shared by the others (a
# cached prefix)
PAGE_ORDERS = ("in-order", "reverse", "random", "shared")
# How a context-parallel run cuts a sequence's keys into `splits` shards, each attended by a call of its own
# and the partials merged (docs/design.md, "Context-parallel merges"): "off", flash-attn's split-KV ranges of
# whole blocks (Case.split_ranges); "contiguous", ceil(seqlen_k / shards) keys each, the last shards empty
# where they run out; "interleaved", key j in shard j mod shards (round-robin tokens), empty past seqlen_k
SHARDS = ("off", "contiguous", "interleaved")
# The variant fields and their "off" values: a case that leaves them off is dense attention, and its JSON
# leaves them out, so a dense case prints as it always did.
VARIANT_DEFAULTS = {"window": (-1, -1), "softcap": 0.0, "alibi": "off", "sinks": "off", "head_dim_v": None,
                    "seqlens": None, "tail": 0, "cache_seqlens": None, "page_size": 0, "pages": "in-order",
                    "pool": 0, "splits": 1, "shards": "off", "mask": "off", "mask_shape": "full", "mask_block": 0,
                    "mask_rate": 0, "mask_lengths": None, "mask_nan": False, "bias": "off", "bias_shape": "full",
                    "bias_dtype": "input", "bias_grad": False, "score_mod": "off", "fp8": "off",
                    "fp8_format": "e4m3", "lse_grad": "off", "max_logit": False, "sparse": "off", "topk": 0,
                    "kv_shared": False, "before": ()}


# The most split-KV partials a case asks for and a bundled launcher makes (flash-attn's cap too): a single
# sequence's decode over a 128k-key cache fills the H200 at 99 (kernels/triton/interface.num_splits_for).
MAX_SPLITS = 128
# what a case's call produces and the judge compares: the output, its log-sum-exp and the gradients
TENSORS = ("out", "lse", "dq", "dk", "dv", "dsinks", "dbias", "max_logit")
# the tensors of one value per query row, -inf where a row sees no key, moving 1:1 with the logits
ROW_LOGITS = ("lse", "max_logit")
# a split-KV call's partial outputs and log-sum-exps, one per key range, before the combine
SPLIT_TENSORS = ("out_splits", "lse_splits")


def parse_choice(text: str, allowed: tuple, argument: str) -> tuple:
    """A comma-separated subset of `allowed`, or with every name prefixed by -, all of allowed but those."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(argument, text, f"give some of {', '.join(allowed)}, or -NAME to leave one out")
    excluded = [n.startswith("-") for n in names]
    if any(excluded) and not all(excluded):
        raise UsageError(argument, text, "either list what to draw or, each with a leading -, what to leave out")
    bare = [n.lstrip("-") for n in names]
    for n in bare:
        if n not in allowed:
            raise UsageError(argument, n, f"each must be one of {', '.join(allowed)}")
    chosen = tuple(a for a in allowed if (a not in bare) == all(excluded))
    if not chosen:
        raise UsageError(argument, text, "leaves nothing to draw")
    return chosen
