"""FlashInfer as a subject, through its single-request prefill (`flashinfer.single_prefill_with_kv_cache`,
JIT-compiled with the machine's nvcc): present where the package imports, an EnvironmentProblem naming the
import error elsewhere (`faverify kernels` lists it as unavailable, with that reason).

A batch runs one request at a time (the kernel takes one), a varlen batch one sequence at a time
(per_sequence.ragged). Its vocabulary, translated here: layout NHD ([tokens, heads, d], the batch dimension
dropped), `sm_scale`, `logits_soft_cap`, a window as `window_left` only (translate.flashinfer_window: a
right bound it can express only as causal's); lse comes back in base 2 ([tokens, heads], transposed here
to faverify's [b, h, sq]), which the conventions preset "flashinfer" declares, so the verdict compares it
in that base. Forward only (FlashInfer has no backward). No ALiBi (its slopes are its own, not the
case's), no sinks on this path; head dims 64, 128 and 256, q/k's and v's alike.
"""
from __future__ import annotations

import torch

from faverify.errors import EnvironmentProblem, Unsupported
from faverify.subjects.base import Capabilities, Subject
from faverify.subjects.translate import flashinfer_window

HEAD_DIMS = (64, 128, 256)


def _library():
    try:
        import flashinfer
    except Exception as e:  # ImportError, or its JIT finding no CUDA toolkit
        raise EnvironmentProblem(f"flashinfer: the package does not import here ({type(e).__name__}: {e}); it is "
                                 "the flashinfer-python wheel, for CUDA GPUs") from e
    return flashinfer


def flashinfer_prefill(q, k, v, *, causal: bool, softmax_scale=None, window_size=(-1, -1), softcap: float = 0.0):
    """faverify's dense keywords -> one single_prefill_with_kv_cache call per batch element; (out, lse)."""
    d, dv = q.shape[-1], v.shape[-1]
    if d != dv or d not in HEAD_DIMS:
        raise Unsupported(f"flashinfer: head dims {d} and {dv}; its prefill here takes equal ones among "
                          f"{', '.join(map(str, HEAD_DIMS))}")
    window_left = flashinfer_window(tuple(window_size), causal)
    flashinfer = _library()
    outs, lses = [], []
    for b in range(q.shape[0]):
        out, lse = flashinfer.single_prefill_with_kv_cache(
            q[b], k[b], v[b], causal=causal, kv_layout="NHD", sm_scale=softmax_scale, window_left=window_left,
            logits_soft_cap=float(softcap) if softcap else None, return_lse=True)
        outs.append(out)
        lses.append(lse.transpose(0, 1))  # [sq, h] -> [h, sq]
    return torch.stack(outs), torch.stack(lses).float()


def make() -> Subject:
    from faverify.subjects.per_sequence import ragged
    flashinfer = _library()
    caps = Capabilities(dtypes=("bf16", "fp16"), devices=("cuda",), min_head_dim=64, max_head_dim=256, lse=True,
                        backward=False, window=True, softcap=True, varlen=True, conventions="flashinfer")
    return Subject(name="flashinfer", fn=ragged(flashinfer_prefill), caps=caps,
                   description=f"FlashInfer {getattr(flashinfer, '__version__', '?')} single-request prefill "
                               "(forward only)")
