"""Minimal reproducers of the flash-attn-4 defects faverify found on sm_90, one function each.

    python flash_attn_4_repro.py NAME      (NAME: one of the functions below; no NAME lists them)

Runs with torch and flash-attn-4 alone, no faverify. Each prints the versions, expected against observed,
and exits 1 while its defect is there, 0 once fixed. Expected values come from an FP64 reference.
"""
import subprocess
import sys

import torch
from flash_attn.cute import flash_attn_func, flash_attn_varlen_func


def versions() -> str:
    from importlib import metadata
    props = torch.cuda.get_device_properties(0)
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip().splitlines()[:1]
    return (f"flash-attn-4 {metadata.version('flash-attn-4')}, nvidia-cutlass-dsl "
            f"{metadata.version('nvidia-cutlass-dsl')}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"driver {''.join(driver) or '?'}, {props.name} (sm_{props.major}{props.minor})")


def reference(q, k, v, causal=False):
    """FP64 attention over [b, s, h, d] (k, v shared by groups of query heads), bottom-right causal:
    (out, lse [b, h, sq]); a row that sees no key gives out 0."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq).logical_not(),
                          float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ v).transpose(1, 2), lse


def report(what: str, expected, observed, defect: bool) -> int:
    print(versions())
    print(f"{what}\n  expected: {expected}\n  observed: {observed}")
    print("DEFECT PRESENT" if defect else "fixed")
    return 1 if defect else 0


def varlen_tail_nan() -> int:
    """Varlen: a NaN in the packed buffer past cu_seqlens[-1] reaches the last sequence's output."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 1, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    k[1], v[1] = float("nan"), float("nan")  # a buffer's unused tail may hold anything (torch.empty)
    cu = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1, max_seqlen_k=1)
    out = out[0] if isinstance(out, tuple) else out
    return report("out of the one-token sequence (one key: its value)", v[0, 0, :4].tolist(),
                  out[0, 0, :4].tolist(), not torch.allclose(out[0].double(), v[0].double(), atol=1e-2))


def _grads(q, k, v, causal=False, **kw):
    """(flash-attn-4's dq, dk, dv), (the FP64 reference's) for one random dO."""
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flash_attn_func(q, k, v, causal=causal, **kw)
    out = out[0] if isinstance(out, tuple) else out
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch.autograd.grad(reference(qd, kd, vd, causal=causal)[0], (qd, kd, vd), dout.double())
    return got, ref


def d16_backward_row_64() -> int:
    """Backward at head dim 16, b1 sq65 sk2: dq of query row 64 (a 64-row tile plus one) is off."""
    torch.manual_seed(0)
    q = torch.randn(1, 65, 1, 16, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(1, 2, 1, 16, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    (dq, _, _), (rq, _, _) = _grads(q, k, v)
    err = (dq.double() - rq).abs()
    row = int(err.amax(dim=(0, 2, 3)).argmax())
    # bf16 rounding of dq is about 2^-8 of its largest magnitude; faverify allowed 0.0313 here
    return report(f"dq, largest error at query row {row} (of 65)", f"{rq[0, row, 0, :4].tolist()}",
                  f"{dq[0, row, 0, :4].tolist()} (error {err.max().item():.3g})",
                  err.max().item() > 0.05 * rq.abs().max().item())


def causal_rows_without_key_dq() -> int:
    """Causal, 129 queries on 2 keys, head dim 80, fp16: dq of rows that see no key must be exactly 0."""
    torch.manual_seed(0)
    q = torch.randn(3, 129, 3, 80, dtype=torch.float16, device="cuda")
    k, v = (torch.randn(3, 2, 3, 80, dtype=torch.float16, device="cuda") for _ in range(2))
    (dq, _, _), _ = _grads(q, k, v, causal=True)
    blind = dq[:, :127]  # bottom-right causal: row i sees key j <= i - 127
    return report("dq of the 127 rows per sequence that see no key", 0, f"{int((blind != 0).sum())} non-zero "
                  f"entries, largest {blind.abs().max().item():.3g}", bool((blind != 0).any()))


def varlen_gqa_d16_dv() -> int:
    """Varlen GQA backward at head dim 16: two one-token sequences, 2 query heads on 1 kv head: dv is off."""
    torch.manual_seed(0)
    q = torch.randn(2, 2, 16, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k, v = (torch.randn(2, 1, 16, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(2))
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1, max_seqlen_k=1)
    out = out[0] if isinstance(out, tuple) else out
    dout = torch.randn_like(out)
    (dv,) = torch.autograd.grad(out, (v,), dout)
    # one key per sequence: its value gets every query head's dO whole
    want = dout.double().sum(dim=1, keepdim=True)
    err = (dv.double() - want).abs().max().item()
    return report("dv (one key a sequence: the sum of its query heads' dO)", want[:, 0, :4].tolist(),
                  f"{dv[:, 0, :4].tolist()} (error {err:.3g})", err > 0.05 * want.abs().max().item())


def sink_lse_inf() -> int:
    """A learnable sink 100 above the row's only logit (0): lse must be 100, out ~e^-100 v."""
    q = torch.zeros(1, 1, 1, 64, dtype=torch.bfloat16, device="cuda")
    sink = torch.full((1,), 100.0, device="cuda")
    out, lse = flash_attn_func(q, q, q, learnable_sink=sink, return_lse=True)
    return report("lse of the row", 100.0, lse.flatten().tolist(), not torch.isfinite(lse).all().item())


def backward_value_head_dim_40() -> int:
    """The backward with head_dim 64 and head_dim_v 40 (both multiples of 8, which the library admits)."""
    torch.manual_seed(0)
    q, k = (torch.randn(1, 128, 1, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(2))
    v = torch.randn(1, 128, 1, 40, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    out = flash_attn_func(q, k, v)
    out = out[0] if isinstance(out, tuple) else out
    try:
        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    except Exception as e:  # MLIRError: the SMEM layout and the CTA V-map disagree
        return report("the backward", "dq, dk, dv", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", True)
    return report("the backward", "dq, dk, dv", "dq, dk, dv", False)


def forward_d16_dv64() -> int:
    """The forward at head dim 16 with head dim v 64, b1 sq1 sk128: an illegal memory access."""
    torch.manual_seed(0)
    q, k = (torch.randn(1, n, 1, 16, dtype=torch.bfloat16, device="cuda") for n in (1, 128))
    v = torch.randn(1, 128, 1, 64, dtype=torch.bfloat16, device="cuda")
    try:
        out = flash_attn_func(q, k, v)
        out = out[0] if isinstance(out, tuple) else out
        torch.cuda.synchronize()
    except Exception as e:  # the context is lost after this: run it in a process of its own
        return report("the forward", "out [1, 1, 1, 64]", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", True)
    want = reference(q, k, v)[0]
    err = (out.double() - want).abs().max().item()
    return report("the forward's out", want[0, 0, 0, :4].tolist(), out[0, 0, 0, :4].tolist(), err > 0.02)


DEFECTS = {f.__name__: f for f in (varlen_tail_nan, d16_backward_row_64, causal_rows_without_key_dq,
                                   varlen_gqa_d16_dv, sink_lse_inf, backward_value_head_dim_40, forward_d16_dv64)}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in DEFECTS:
        print("python flash_attn_4_repro.py NAME, NAME one of:\n" + "\n".join(
            f"  {n}: {f.__doc__.splitlines()[0]}" for n, f in DEFECTS.items()))
        sys.exit(2)
    sys.exit(DEFECTS[sys.argv[1]]())
