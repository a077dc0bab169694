"""torch's scaled_dot_product_attention backends as subjects.

torch's `is_causal=True` is top-left aligned when seqlen_q != seqlen_k, so causal cases with unequal
lengths pass `causal_lower_right` to follow the bottom-right convention (docs/torch-backends.md).
A backend that cannot run a case skips it with torch's reason: torch raises "No available kernel" (CUDA) or
"No viable backend" (other devices, newer torch) and says why in warnings, which are kept for the skip.
"""
from __future__ import annotations

import re
import warnings

import torch.nn.functional as F

from faverify.errors import Unsupported
from faverify.subjects.base import Capabilities, Subject

_BACKENDS = {
    "sdpa-math": ("MATH", "torch SDPA math backend (reference-style, materializes the score matrix)",
                  Capabilities()),
    "sdpa-flash": ("FLASH_ATTENTION", "torch SDPA FlashAttention-2 backend",
                   Capabilities(dtypes=("bf16", "fp16"), devices=("cuda",))),
    "sdpa-efficient": ("EFFICIENT_ATTENTION", "torch SDPA memory-efficient (xformers) backend",
                       Capabilities(devices=("cuda",))),
    "sdpa-cudnn": ("CUDNN_ATTENTION", "torch SDPA cuDNN backend",
                   Capabilities(dtypes=("bf16", "fp16"), devices=("cuda",))),
}


_NO_KERNEL = ("No available kernel", "No viable backend")
# Not reasons: headers, the warning on every sq > sk, and the other backends that sdpa_kernel switched off.
_NOT_A_REASON = ("not used because", "Lower right causal bias", "has been runtime disabled")
_WHERE = re.compile(r"\s*\(Triggered internally at [^)]*\)")  # torch's source location
_SIZES = re.compile(r"\[[\d, ]*\]")  # a shape, as in "Query.sizes(): [1, 8, 1, 16]"


def _why(seen) -> str:
    """torch's reasons for refusing a case, from the warnings it gave, without their shape details and
    source locations (one skip row per reason, not per shape)."""
    reasons = []
    for w in seen:
        text = _SIZES.sub("[...]", _WHERE.sub("", " ".join(str(w.message).split())))
        for part in text.split("; "):  # one warning may carry several backends' reasons
            if part and not any(m in part for m in _NOT_A_REASON):
                reasons.append(part.split(" Got ")[0].split(". Got")[0].rstrip(". "))
    return "; ".join(dict.fromkeys(reasons))[:300]


def names() -> tuple:
    return tuple(_BACKENDS)


def make(name: str) -> Subject:
    backend_name, description, caps = _BACKENDS[name]

    def fn(q, k, v, *, causal: bool, softmax_scale: float):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        sq, sk = q.shape[1], k.shape[1]
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        try:
            with sdpa_kernel(getattr(SDPBackend, backend_name)), warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")  # recorded, not shown: torch's reasons when it refuses a case
                is_causal = causal and sq == sk  # top-left and bottom-right agree when sq == sk
                mask = causal_lower_right(sq, sk) if causal and sq != sk else None
                out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=is_causal,
                                                     scale=softmax_scale, enable_gqa=kt.shape[1] != qt.shape[1])
        except RuntimeError as e:
            if any(m in str(e) for m in _NO_KERNEL):
                why = _why(seen)
                raise Unsupported(f"{name}: no available kernel for this case" + (f": {why}" if why else "")) from None
            raise
        return out.transpose(1, 2)

    return Subject(name=name, fn=fn, caps=caps, description=description)
