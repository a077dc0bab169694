"""A variant's arguments in the kernels' terms: KernelVariant (the window, softcap, ALiBi, sinks, bias and block
mask of a launch, and what each kernel argument is made of), with its mask tensors' pointers and strides."""
from __future__ import annotations

import dataclasses

import torch

from faverify.kernels.constants import INIT_VALUE
from faverify.kernels.triton.common import LOG2E, NO_BOUND

_KEPT: dict = {}  # the filled tensors _filled keeps, per (n, value, device)


@dataclasses.dataclass(frozen=True)
class MaskArgs:
    """pointers: (bias, blocks); scalars: the bias's 4 strides, the blocks' 4 (0 where a tensor broadcasts),
    the block size, and what turns raw q.k into the logits' unit (KernelVariant.raw): in the kernels' argument
    order."""
    pointers: tuple
    scalars: tuple


@dataclasses.dataclass(frozen=True)
class KernelVariant:
    """What a launch adds to dense attention, in the kernels' terms."""
    scale: float
    left: int = NO_BOUND  # keys j >= i + diag - left
    right: int = NO_BOUND  # keys j <= i + diag + right
    softcap: float = 0.0
    alibi: torch.Tensor | None = None  # fp32 [h] or [b, h]
    sinks: torch.Tensor | None = None  # fp32 [h]
    init: str = "-inf"
    bias: torch.Tensor | None = None  # [b|1, h|1, sq|1, sk], any float dtype; -inf entries mask
    blocks: torch.Tensor | None = None  # bool [b|1, h|1, ceil(sq / n), ceil(sk / n)]
    mask_block: int = 0  # n

    @classmethod
    def of(cls, scale: float, causal: bool, window_size, softcap, alibi_slopes, sinks, init: str = "-inf",
           bias=None, blocks=None, mask_block: int = 0):
        left, right = window_size
        left = NO_BOUND if left < 0 else left
        right = NO_BOUND if right < 0 else right
        if causal:  # causal and a window keep the intersection
            right = min(right, 0)
        return cls(scale, left, right, float(softcap), alibi_slopes, sinks, init, bias, blocks, mask_block or 0)

    @property
    def raw(self) -> float:
        """The unit of the kernels' logits and row statistics, in the softmax's: the scale (raw q.k, the max
        subtracted before the scale, as dense/forward.py does), or 1 with a bias, where the logits are scaled
        before the bias is added: a finfo.min bias divided by a scale below 1 is past fp32's range, and the
        lse of a row of them (finfo.min itself) would be too."""
        return 1.0 if self.bias is not None else self.scale

    @property
    def windowed(self) -> bool:
        """A window: a bound other than causal's right one."""
        return self.left != NO_BOUND or self.right not in (0, NO_BOUND)

    @property
    def backward_is_dense(self) -> bool:
        """Nothing but sinks and ALiBi, causal or not: the sinks are in log2 l already, so P, dS and dq, dk, dv
        are dense attention's given the forward's rows, and the dense backward kernels compute them
        (backward), with ALiBi's bias (their ALIBI build)."""
        return not self.windowed and not self.softcap and not self.masked

    @property
    def masked(self) -> bool:
        """A bias or a block mask: the builds that load them (BIAS, BLOCKS), with tiles of their own."""
        return self.bias is not None or self.blocks is not None

    @property
    def qk_scale(self) -> float:
        """What turns the kernels' logits into base-2 exponents."""
        return self.raw * LOG2E

    @property
    def init_value(self) -> float:
        """The running max's start: a finite init would hide a row whose every logit is below it, as a row of
        finfo.min biases is; with a bias it is -inf."""
        return float("-inf") if self.bias is not None else INIT_VALUE[self.init]

    def masks(self, q) -> tuple:
        """The bias and block-mask arguments of the kernels, (MaskArgs, the switches BIAS and BLOCKS): an
        empty tensor where there is none."""
        empty = torch.empty(0, dtype=torch.float32, device=q.device)
        bias = self.bias if self.bias is not None else empty
        blocks = self.blocks.to(torch.int8) if self.blocks is not None else empty
        args = MaskArgs((bias, blocks), (*broadcast_strides(bias), *broadcast_strides(blocks), max(1, self.mask_block),
                                         self.scale / self.raw))
        return args, dict(BIAS=self.bias is not None, BLOCKS=self.blocks is not None)


    def runtime(self) -> dict:
        cap = self.softcap
        return dict(left=self.left, right=self.right, cap_scale=self.scale / cap if cap else 1.0,
                    inv_cap_scale=cap / self.scale if cap else 1.0, bias_unit=1.0 / self.scale)

    def switches(self) -> dict:
        return dict(SOFTCAP=self.softcap > 0)

    def tensors(self, q) -> tuple:
        """(alibi slopes, their batch stride, sinks) as the kernels read them: without ALiBi slopes of 0,
        without sinks a sink of -inf; both leave the logits and the softmax exactly as they were. The sinks
        come in the kernels' raw q.k units (z / scale), rounded here once: scaled in the kernel, the product
        z * (1 / scale) is contracted into the subtraction that follows it (an fma) in one of its uses and
        not in the other, and at logits near 1e12 the two differ by 2^17, whose exp2 is inf or 0 (lse inf,
        dsinks NaN on the H200 with every sink above logits of 1e11)."""
        h = q.shape[-2]
        alibi = self.alibi if self.alibi is not None else _filled(h, 0.0, q.device)
        sinks = self.sinks / self.raw if self.sinks is not None else _filled(h, float("-inf"), q.device)
        return alibi, alibi.stride(0) if alibi.dim() == 2 else 0, sinks


def _filled(n: int, value: float, device) -> torch.Tensor:
    """A read-only fp32 vector of n values, kept from call to call: a decode step's kernel reads the whole
    cache in about 75 us on the H200, and each fill launched for it cost about 1 us more, plus its gap in
    the graph. One first made inside a CUDA graph capture is not kept: there a fill is only recorded, and
    the tensor holds nothing until the graph is replayed."""
    key = (n, value, torch.device(device))
    kept = _KEPT.get(key)
    if kept is not None:
        return kept
    t = torch.full((n,), value, dtype=torch.float32, device=key[2])
    if not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
        _KEPT[key] = t
    return t


def broadcast_strides(t: torch.Tensor) -> tuple:
    """A [B, H, S, N] tensor's strides, 0 along a dimension of size 1 (it broadcasts there); zeros for none."""
    if t.dim() != 4:
        return (0, 0, 0, 0)
    return tuple(0 if n == 1 else st for n, st in zip(t.shape, t.stride()))
