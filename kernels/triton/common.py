"""Pieces shared by the Triton forward and backward kernels."""
import contextlib
import os
import warnings

import triton
import triton.language as tl

from faverify.kernels.constants import LN2 as _LN2
from faverify.kernels.constants import LOG2E  # noqa: F401  (the launchers fold it into the softmax scale)

LN2 = tl.constexpr(_LN2)  # a global a kernel may read (Triton takes only constexpr globals)

# The Triton interpreter (TRITON_INTERPRET=1, <= 3.6) computes bfloat16 wrongly in two places, silently:
# - a tl.dot on bf16 operands multiplies the raw bits (garbage);
# - a conversion fp32 -> bf16 truncates instead of rounding to nearest even (one ulp off, half the time);
# - a conversion fp32 -> float8e4nv rounds up without carrying into the exponent (31.8 becomes 16).
# Kernels take INTERPRETED=True there and emulate the GPU: dot operands are upcast to fp32 (a product of
# two bf16 or fp16 values is exact in fp32, and the GPU accumulates in fp32 too), and bf16 casts round to
# nearest even by integer arithmetic on the fp32 bits before the (then exact) truncating conversion, and
# e4m3 casts round in fp32 arithmetic onto e4m3's grid first.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _interpreter_index_shim() -> None:
    """The interpreter (Triton <= 3.6) converts a scalar to a Python int with int(array), and scalars
    there are one-element arrays of shape (1,), which NumPy >= 2.4 refuses to convert. Loop bounds
    derived from program_id (the causal tile ranges) hit it. Convert through .item() instead."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_faverify_shim", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0].item()))

    patched._faverify_shim = True
    interpreter._patch_lang_tensor = patched


if INTERPRET:
    _interpreter_index_shim()


@contextlib.contextmanager
def quiet():
    """Under the interpreter, NumPy warns on every overflow to inf that a kernel then masks or clamps as
    the GPU does (masked logits are -inf, huge logits overflow before the max is subtracted): noise, not
    news. Silenced there; nothing changes on the GPU."""
    if not INTERPRET:
        yield
        return
    import numpy as np
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def generic_args(fn) -> list:
    """Every runtime argument of a kernel (pointers, strides, sizes, scalars).

    Triton compiles a kernel once per specialization of its integer and pointer arguments (== 1, divisible
    by 16, 16-byte aligned). A fuzz run draws thousands of shapes and layouts, whose strides fall into a
    new pattern case after case, and each costs a compile of seconds. So each kernel exists twice: a fast
    build, specialized (vectorized loads need the divisibility), used when every stride is a multiple of
    16 and every pointer 16-byte aligned; and this generic build, specialized on nothing: one compile per
    set of compile-time constants, whatever the strides."""
    import inspect

    return [name for name, p in inspect.signature(fn).parameters.items()
            if p.annotation is inspect.Parameter.empty or "constexpr" not in str(p.annotation)]


def aligned(*tensors) -> bool:
    """All strides multiples of 16 and all pointers 16-byte aligned: the fast, specialized builds apply."""
    return all(t.data_ptr() % 16 == 0 and all(s % 16 == 0 for s in t.stride()[:-1]) for t in tensors)


# The tensors a variant kernel streams tile by tile (q, k, v, dO, out, the gradients): their pointers and
# strides, by the kernels' argument names
STREAMED = {"Q", "K", "V", "Out", "DO", "DK", "DV", "DQ"} | {
    f"stride_{t}{axis}" for t in ("q", "k", "v", "o", "d", "dk", "dv", "dq") for axis in ("b", "s", "h")} | {
    "stride_osplit"}


def streamed_args(fn) -> list:
    """do_not_specialize of a variant kernel's fast build: every runtime argument but the pointers and
    strides of the tensors it streams (STREAMED), which are specialized as divisible by 16 when `aligned`
    holds for those tensors. That vectorizes their loads: the generic build loads 2 bytes at a time (dk/dv
    at head dim 128: 80 scalar 16-bit loads in its PTX, no vector load; the fast build 16 vector loads of
    16 bytes and no scalar one, sm_90). Sizes, windows and the other tensors (bias, block mask, block
    table, ALiBi slopes) stay unspecialized, so the shapes a fuzz draws share one build."""
    return [name for name in generic_args(fn) if name not in STREAMED]


def seq_strides(t, varlen: bool = False) -> tuple:
    """(batch, seq, head) strides of a [b, s, h, d] tensor (the last dim is contiguous: validated), or of
    varlen's packed [total, h, d] (no batch stride); a paged pool [pages, page_size, h, d] gives its page
    stride in the batch stride's place."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def settle_keys(*modules) -> None:
    """Make the Triton cache key of every kernel the modules hold the same in every process.

    A kernel's key (JITCallable.cache_key) takes in the global constants its callees read only where the
    callees' own keys were computed first (triton 3.6, runtime/jit.py: DependenciesFinder._update_hash merges
    a callee's used_global_vals before computing them). The first kernel of a process to reach a helper is
    keyed without them, the later ones with them: the fast and generic dk/dv builds, which share their body,
    swapped keys with the order of a process's first launches, and a worker whose order was not the
    warm-up's compiled builds the warm-up had made. So every key reachable from the modules is computed
    again, each time with its callees' constants as the last pass found them, until no key changes: then
    each is the one with every constant it depends on, whatever the order. The interpreter compiles nothing."""
    if INTERPRET:
        return
    from triton.runtime.jit import JITCallable
    found: dict = {}
    todo = [v for m in modules for v in vars(m).values()]
    while todo:
        v = todo.pop()
        if isinstance(v, JITCallable) and id(v) not in found:
            found[id(v)] = v
            todo.extend(v.get_capture_scope().values())
    keys = None
    while True:
        for fn in found.values():
            fn.hash = None
        now = [fn.cache_key for fn in found.values()]
        if now == keys:
            return
        keys = now


# The code paths the launches took, in order (interface.PATHS names them): the subject reports them per case,
# so a fuzz shows which kernels its cases reached and a mutant which cases ran its mutated code.
LAUNCHED: list = []


def take_paths() -> list:
    """The paths launched since the last call, each once, in launch order; starts a new list."""
    taken = list(dict.fromkeys(LAUNCHED))
    LAUNCHED.clear()
    return taken


BLOCK_DS = (16, 32, 64, 128, 256)  # the padded head dims: block_d(head_dim) is one of these


def block_d(head_dim: int) -> int:
    """Head dims are padded to a power of two >= 16 inside the kernels: five compiled variants, 16..256."""
    return max(16, triton.next_power_of_2(head_dim))


@triton.jit
def mm(a, b, INTERPRETED: tl.constexpr, IEEE: tl.constexpr):
    """a @ b with fp32 accumulation. IEEE: full fp32 products for fp32 inputs (not tf32)."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def load_rows(ptrs, rows, n_rows, cols_ok, ROWS_ALONG_0: tl.constexpr, MASK_ROWS: tl.constexpr,
              EVEN_D: tl.constexpr):
    """Load a tile whose sequence index is `rows` (along dim 0 if ROWS_ALONG_0 else dim 1), masking the
    sequence tail only when MASK_ROWS and the head-dim padding only when not EVEN_D: a mask that varies
    along the contiguous head dim stops the compiler from vectorizing the load."""
    if ROWS_ALONG_0:
        row_ok = rows[:, None] < n_rows
    else:
        row_ok = rows[None, :] < n_rows
    if MASK_ROWS:
        if EVEN_D:
            return tl.load(ptrs, mask=row_ok, other=0.0)
        else:
            return tl.load(ptrs, mask=row_ok & cols_ok, other=0.0)
    else:
        if EVEN_D:
            return tl.load(ptrs)
        else:
            return tl.load(ptrs, mask=cols_ok, other=0.0)


@triton.jit
def row_stats(m_ptr, l2_ptr, delta_ptr, rows, seqlen_q, MASK: tl.constexpr):
    """The backward's per-row (row max, log2 l, D) of query rows `rows`; masked past seqlen_q when MASK,
    where log2 l = +inf makes those rows' P exactly 0."""
    if MASK:
        m = tl.load(m_ptr + rows, mask=rows < seqlen_q, other=0.0)
        l2 = tl.load(l2_ptr + rows, mask=rows < seqlen_q, other=float("inf"))
        delta = tl.load(delta_ptr + rows, mask=rows < seqlen_q, other=0.0)
    else:
        m = tl.load(m_ptr + rows)
        l2 = tl.load(l2_ptr + rows)
        delta = tl.load(delta_ptr + rows)
    return m, l2, delta


@triton.jit
def key_ranges(start_m, seqlen_k, diag, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(full, hi) for the query tile start_m: key blocks [0, full) are seen whole by every row of the tile
    (no mask needed), [full, hi) by some rows (masked); keys from hi on are above the causal diagonal and
    skipped. Shared by the forward and dq, whose loops run over keys."""
    if CAUSAL:
        # keys every row of the tile sees: j <= start_m * BLOCK_M + diag
        full = tl.minimum(tl.maximum(start_m * BLOCK_M + diag + 1, 0), seqlen_k)
        # keys some row of the tile sees: j < (start_m + 1) * BLOCK_M + diag
        hi = tl.minimum(tl.maximum((start_m + 1) * BLOCK_M + diag, 0), seqlen_k)
    else:
        full = seqlen_k
        hi = seqlen_k
    return full // BLOCK_N * BLOCK_N, hi


@triton.jit
def mask_scores(s, rows, cols, seqlen_k, diag, CAUSAL: tl.constexpr):
    """s[i, j] where query rows[i] sees key cols[j] (a real key; causal bottom-right: cols[j] <= rows[i] +
    diag, diag = seqlen_k - seqlen_q), -inf elsewhere. Shared by the forward and dq, whose tiles are
    [queries, keys]; dk/dv work on the transpose and mask there."""
    keep = cols[None, :] < seqlen_k
    if CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None] + diag)
    return tl.where(keep, s, float("-inf"))


@triton.jit
def cast(x, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """x.to(dtype), rounding to nearest even also under the interpreter (see INTERPRET above)."""
    if INTERPRETED:
        if dtype == tl.bfloat16:
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
        elif dtype == tl.float8e4nv:  # finite values, saturated at 448 as the GPU's satfinite conversion
            a = tl.abs(x.to(tl.float32))
            bits = a.to(tl.uint32, bitcast=True)
            normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
            subnormal = ((a * 512.0 + 8388608.0) - 8388608.0) / 512.0  # onto multiples of 2^-9, ties to even
            a = tl.minimum(tl.where(a < 0.015625, subnormal, normal), 448.0)
            x = tl.where(x < 0, -a, a)
    return x.to(dtype)


@triton.jit
def saturate(x, dtype: tl.constexpr):
    """x clamped into fp16's finite range when dtype is fp16 (as is for any other dtype): a tile about to be
    rounded to an fp16 matmul operand. Past 65504 it would round to inf, and an inf among the products
    sums to NaN with one of the other sign. Only ill-conditioned cases get there (a sink and a key that
    fp32 logits near 1e10 cannot tell apart share the weight the sink alone has: dS of 1e5); a clamped
    operand keeps their gradients finite."""
    if dtype == tl.float16:
        x = tl.minimum(tl.maximum(x, -65504.0), 65504.0)
    return x


# A window bound that never binds: "no bound on this side" (flash-attn's -1) as a number of keys no
# sequence reaches, so one comparison serves windows, causal (right bound 0) and neither.
NO_BOUND = 1 << 30


# Below it tanh(x) is x to 5e-5 of tanh (x^2 / 3), where the exp2 forms' absolute error (about 6e-7 on the
# H200) is no larger a fraction of it: the 16-bit builds' tanh near 0, two instructions a logit (a compare
# and a select). A row with one key has its capped logit for lse, so a tiny logit needs tanh's relative
# precision, not only its absolute one: the exp2 form alone gave a tiny logit's lse 1% off on the H200
# (1.2e-8 at 3.8e-6, against FP64). The degree-9 polynomial below 0.25 (computed for every logit, then
# selected) took softcap's backward from 2.22 to 3.16 of dense's time at d64 (seqlen 16384, H200): the
# softmax's instructions a logit are what these kernels wait on. (The Hopper forward takes tanh.approx,
# hopper.layouts.tanh_approx, relative to 2^-10.99 everywhere.)
TANH_LINEAR = tl.constexpr(0.0122)


@triton.jit
def _tanh_near_zero(x):
    """tanh below |x| = 0.25 by its odd Taylor polynomial to x^9 (the next term is under 1e-8 of tanh there):
    fp32's relative precision where the exp2 forms below cancel to a few bits (the fp32 builds')."""
    x2 = x * x
    return x * (1.0 + x2 * (-1.0 / 3 + x2 * (2.0 / 15 + x2 * (-17.0 / 315 + x2 * (62.0 / 2835)))))


@triton.jit
def tanh_slope(x, PRECISE: tl.constexpr):
    """(tanh x, 1 - tanh^2 x) from t = e^-2|x| and one reciprocal r = 1 / (1 + t): tanh = (1 - t) r, and the
    derivative as 4 t r^2, to fp32's relative precision at every x. 1 - tanh^2 would cancel where tanh nears
    1: past |x| = 9 tanh rounds to 1 in fp32 and 1 - tanh^2 to 0 while the derivative is 6e-8 (softcap's
    backward lost dq and dk there, 6x the error allowed). One exp2 and one division a logit, shared by both.
    Near 0: PRECISE (the fp32 builds) _tanh_near_zero below 0.25, fp32's relative precision; else x below
    TANH_LINEAR."""
    a = tl.abs(x)
    t = tl.math.exp2(a * -2.8853900817779268)  # e^(-2|x|)
    r = 1.0 / (1.0 + t)
    if PRECISE:
        y = tl.where(a < 0.25, _tanh_near_zero(a), (1.0 - t) * r)
    else:
        y = tl.where(a < TANH_LINEAR, a, (1.0 - t) * r)
    return tl.where(x < 0, -y, y), 4.0 * t * r * r


@triton.jit
def alibi_split(slope, pos_first, pos_last, key_first, key_last, left, right):
    """ALiBi on a tile of queries at positions pos (i + diag) in [pos_first, pos_last] and keys [key_first,
    key_last]: (signed, general). When every visible key of the tile lies on one side of every row's
    position, -slope |pos - j| is sign (slope (j - key_first) + slope (key_first - pos)) with sign 1 at or
    before the diagonal (the causal case: right <= 0), -1 after it: a column term, one add an element
    (alibi_scores, with signed = sign slope), and a row term the caller folds into the row max
    (alibi_row), where the distance takes a subtract, an abs and a multiply-add an element. The row
    term is as large as the distance, and the max it shifts already is (the rounding is the same). A
    tile that crosses the diagonal takes the distance (general = slope, signed = 0)."""
    below = (key_last <= pos_first) | (right <= 0)
    above = (key_first >= pos_last) | (left <= 0)
    side = tl.where(below, 1.0, tl.where(above, -1.0, 0.0))
    return side * slope, tl.where(side == 0.0, slope, 0.0)


@triton.jit
def alibi_row(signed, key_first, pos, bias_scale, BIAS: tl.constexpr):
    """alibi_split's row term, signed (key_first - pos), in the units the scores are in (scaled with a
    bias: variant.forward.extra_scores)."""
    row = signed * (key_first - pos).to(tl.float32)
    if BIAS:
        row = row * bias_scale
    return row


@triton.jit
def alibi_scores(qk, slope, signed, key_local, pos, j, FP32_DIST: tl.constexpr):
    """ALiBi on a tile alibi_split split: the column term signed * key_local (the keys' offsets in the
    tile, as fp32) when signed != 0, else the distance when slope != 0; neither without ALiBi (both 0). The
    caller adds the row term (alibi_row) where it subtracts the row max."""
    if signed != 0.0:
        qk = qk + signed * key_local
    if slope != 0.0:
        qk = qk - slope * alibi_distance(pos, j, FP32_DIST)
    return qk


@triton.jit
def alibi_distance(pos, j, FP32_DIST: tl.constexpr):
    """|pos - j| as fp32. FP32_DIST: from positions converted to fp32 apart (pos is [M, 1] or [1, M], j the
    other): M + N integer conversions, not M x N, which run at a fraction of an add's rate; the same value,
    exact below 2^24. The backwards keep the integer distance: their registers spilled on sm_80 with the
    other."""
    if FP32_DIST:
        return tl.abs(pos.to(tl.float32) - j.to(tl.float32))
    else:
        return tl.abs(pos - j).to(tl.float32)


def with_dlse(delta, dlse) -> None:
    """A loss on lse as well: d lse / d s = P, so dS = P * (dP - D + dlse), and every backward kernel, reading
    D from memory, takes D - dlse in its place (the sink's gradient too: -P_sink * (D - dlse))."""
    if dlse is not None:
        delta.sub_(dlse.float())
