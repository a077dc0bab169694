"""FP8 subjects for the tests: e4m3 q, k, v with flash-attn 3's [batch, nheads_k] descales, out in bf16.
Each bug beside the control that differs from it only in the bug; plain torch."""
import torch

E4M3_MAX = 448.0


def _attention(q8, k8, v8, qd, kd, vd, causal, softmax_scale, *, p_scale=E4M3_MAX, v_descale=True,
               q_descale_twice=False):
    """FP8 attention as flash-attn 3 computes it: S in fp32 from the e4m3 values times the descales, P
    scaled onto e4m3's range (p_scale) and quantized, O = P8 v8 / p_scale * v_descale / l. Inputs that are not
    FP8 (no descales): attention in fp32, out in their dtype."""
    if qd is None:
        return torch.nn.functional.scaled_dot_product_attention(
            *(t.float().transpose(1, 2) for t in (q8, k8, v8)), scale=softmax_scale,
            attn_mask=torch.ones(q8.shape[1], k8.shape[1], dtype=torch.bool).tril(k8.shape[1] - q8.shape[1])
            if causal else None, enable_gqa=True).transpose(1, 2).to(q8.dtype)
    h, hk, d = q8.shape[2], k8.shape[2], q8.shape[3]
    group = h // hk
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    qd, kd, vd = (t.float().repeat_interleave(group, dim=1)[:, :, None, None] for t in (qd, kd, vd))
    q, k, v = (t.float().transpose(1, 2) for t in (q8, k8, v8))
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * (qd * kd * scale) * (qd if q_descale_twice else 1.0)
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq).logical_not(),
                          float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    total = p.sum(dim=-1, keepdim=True)
    p8 = (p * p_scale).to(torch.float8_e4m3fn).float()
    out = (p8 @ v) / p_scale * (vd if v_descale else 1.0) / total.clamp_min(1e-30)
    return torch.where(total > 0, out, torch.zeros_like(out)).transpose(1, 2).to(torch.bfloat16)


def fp8_right(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """The control: P scaled onto e4m3's range before it is quantized, every descale applied once."""
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale)


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


def fp8_per_tensor_only(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """The control, declaring tensorwise descales alone."""
    return fp8_right(q, k, v, causal=causal, softmax_scale=softmax_scale, q_descale=q_descale,
                     k_descale=k_descale, v_descale=v_descale)


for _fn in (fp8_right, fp8_p_unscaled, fp8_v_descale_ignored, fp8_q_descale_twice):
    _fn.faverify_capabilities = {"fp8": ["tensor", "head"], "backward": False, "dtypes": ["bf16"]}
fp8_per_tensor_only.faverify_capabilities = {"fp8": ["tensor"], "backward": False, "dtypes": ["bf16"]}


def fp8_e5m2_read_as_e4m3(q, k, v, *, causal, softmax_scale, q_descale=None, k_descale=None, v_descale=None):
    """Reads e5m2 inputs as e4m3 bits (a kernel built for one format, handed the other): right for e4m3."""
    if q.dtype == torch.float8_e5m2:
        q, k, v = (t.view(torch.float8_e4m3fn) for t in (q, k, v))
    return _attention(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale)


for _fn in (fp8_right, fp8_e5m2_read_as_e4m3):
    _fn.faverify_capabilities = {"fp8": ["tensor", "head"], "fp8_formats": ["e4m3", "e5m2"], "backward": False,
                                 "dtypes": ["bf16"]}
