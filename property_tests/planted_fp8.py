"""FP8 subjects for the tests: e4m3 q, k, v with flash-attn 3's [batch, nheads_k] descales, out in bf16.
Each bug beside the control that differs from it only in the bug; plain torch."""
import torch

E4M3_MAX = 448.0
BLOCK = 16  # keys per block of a "block" case's k and v descales


def _columns(d, group, sk, first_block_only=False):
    """A descale as a factor over [b, h, sq, sk] logits: [b, hk] per head, [b, hk, blocks] per BLOCK keys
    (or, the bug, every block read at the first block's scale)."""
    d = d.float().repeat_interleave(group, dim=1)
    if d.dim() == 2:
        return d[:, :, None, None]
    if first_block_only:
        d = d[:, :, :1].expand_as(d)
    return d.repeat_interleave(BLOCK, dim=2)[:, :, None, :sk]


def _truncated(x, bits):
    """x with `bits` significant bits, the rest cut toward zero."""
    m, e = torch.frexp(x.double())
    return torch.ldexp(torch.trunc(m * 2.0**bits) / 2.0**bits, e).float()


def _hopper_logits(q, k, bits=14, step=32):
    """q k^T as Hopper's FP8 tensor cores sum it: each step of 32 products and the running sum keep about 14
    bits (DeepSeek-V3's report), cut toward zero."""
    acc = torch.zeros(*q.shape[:-1], k.shape[-2], dtype=torch.float32, device=q.device)
    for d0 in range(0, q.shape[-1], step):
        part = q[..., d0:d0 + step].double() @ k[..., d0:d0 + step].double().transpose(-1, -2)
        acc = _truncated(acc.double() + _truncated(part, bits), bits)
    return acc


def _attention(q8, k8, v8, qd, kd, vd, causal, softmax_scale, *, p_scale=E4M3_MAX, v_descale=True,
               k_descale=True, q_descale_twice=False, p_floor=0.0, first_block_only=False, fp16_logits=False,
               first_block_max=False, hopper=False):
    """FP8 attention as flash-attn 3 computes it: S in fp32 from the FP8 values times the descales, P
    scaled onto e4m3's range (p_scale) and quantized, O = P8 v8 / p_scale * v_descale / l (a block's v
    descale on its columns of P). Inputs that are not FP8 (no descales): attention in fp32, out in their
    dtype. The keywords plant the bugs."""
    if qd is None:
        return torch.nn.functional.scaled_dot_product_attention(
            *(t.float().transpose(1, 2) for t in (q8, k8, v8)), scale=softmax_scale,
            attn_mask=torch.ones(q8.shape[1], k8.shape[1], dtype=torch.bool).tril(k8.shape[1] - q8.shape[1])
            if causal else None, enable_gqa=True).transpose(1, 2).to(q8.dtype)
    h, hk, d, sk = q8.shape[2], k8.shape[2], q8.shape[3], k8.shape[1]
    group = h // hk
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    qd = _columns(qd, group, sk)
    kd, vd = (_columns(t, group, sk, first_block_only) for t in (kd, vd))
    q, k, v = (t.float().transpose(1, 2) for t in (q8, k8, v8))
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    raw = (q.half() @ k.half().transpose(-1, -2)).float() if fp16_logits else _hopper_logits(q, k) if hopper else \
        q @ k.transpose(-1, -2)
    s = raw * (qd * (kd if k_descale else 1.0) * scale) * (qd if q_descale_twice else 1.0)
    if causal:
        sq = s.shape[-2]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq).logical_not(),
                          float("-inf"))
    m = (s[..., :BLOCK] if first_block_max else s).amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    total = p.sum(dim=-1, keepdim=True)
    p = torch.where(p < p_floor, torch.zeros_like(p), p)
    p8 = (p * p_scale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).float()  # a saturating cast
    out = ((p8 * (vd if v_descale else 1.0)) @ v) / p_scale / total.clamp_min(1e-30)
    return torch.where(total > 0, out, torch.zeros_like(out)).transpose(1, 2).to(torch.bfloat16)


def fp8_right(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """The control: P scaled onto e4m3's range before it is quantized, every descale applied once."""
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale)


def fp8_hopper_accumulator(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """The control with S summed as Hopper's FP8 tensor cores sum it (about 14 bits): right, however far its
    logits then move from the fp32 sum's at large logits."""
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, hopper=True)


def fp8_p_unscaled(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """P quantized to e4m3 as it is, in [0, 1]: every weight under 2^-9 flushes to zero, and a tail of many
    small weights that carries the output is lost."""
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, p_scale=1.0)


def fp8_v_descale_ignored(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """The output left in v's e4m3 units: v_descale never applied."""
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, v_descale=False)


def fp8_q_descale_twice(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """The logits scaled by q_descale twice."""
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, q_descale_twice=True)


def fp8_k_descale_ignored(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """The logits left in k's FP8 units: k_descale never applied."""
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, k_descale=False)


def fp8_tail_dropped(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """Weights below 2^-8 of the row's largest set to zero before P is quantized (a kernel that skips the
    blocks it deems negligible): each is small, together they carry the tail-mass rows."""
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, p_floor=2.0**-8)


def fp8_block_scales_read_per_head(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None,
                                   v_descale=None):
    """k's and v's per-block descales read as if they were per head: the first block's, for every block."""
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, first_block_only=True)


def fp8_fp16_logits(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """q8 k8^T accumulated in fp16 before the descales: past 65504 (two elements at 448 give 200704) it is
    Inf, and the row's softmax NaN."""
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, fp16_logits=True)


def fp8_p_scale_of_first_block(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None,
                               v_descale=None):
    """P scaled onto e4m3's range by the max of the row's first block of keys, never updated: where a later
    block holds the row's max, its weights pass 1 and saturate at 448."""
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, first_block_max=True)


def fp8_per_tensor_only(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """The control, declaring tensorwise descales alone."""
    return fp8_right(q, k, v, causal=causal, softmax_scale=softmax_scale, q_descale=q_descale,
                     k_descale=k_descale, v_descale=v_descale)


for _fn in (fp8_right, fp8_hopper_accumulator, fp8_p_unscaled, fp8_v_descale_ignored, fp8_q_descale_twice,
            fp8_k_descale_ignored, fp8_tail_dropped, fp8_block_scales_read_per_head, fp8_fp16_logits,
            fp8_p_scale_of_first_block):
    _fn.faverify_capabilities = {"fp8": ["tensor", "head", "block"], "backward": False, "dtypes": ["bf16"]}
fp8_per_tensor_only.faverify_capabilities = {"fp8": ["tensor"], "backward": False, "dtypes": ["bf16"]}


def fp8_e5m2_read_as_e4m3(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """Reads e5m2 inputs as e4m3 bits (a kernel built for one format, handed the other): right for e4m3."""
    if q.dtype == torch.float8_e5m2:
        q, k, v = (t.view(torch.float8_e4m3fn) for t in (q, k, v))
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale)


for _fn in (fp8_right, fp8_e5m2_read_as_e4m3):
    _fn.faverify_capabilities = {"fp8": ["tensor", "head", "block"], "fp8_formats": ["e4m3", "e5m2"],
                                 "backward": False,
                                 "dtypes": ["bf16"]}
