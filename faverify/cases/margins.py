"""Memory probes: each store a subject is given sits inside NaN margins (cuDNN frontend's and xformers'
probe), so a kernel that reads past either end of its tensor reads NaN, which the verdict cannot miss; a
buffer a subject writes into is NaN everywhere it must not write, and checked still so afterwards.
"""
from __future__ import annotations

import torch

MARGIN_ROWS = 64  # rows of NaN before and after each store: a tile's overrun of a tail block lands in them


def margined(t: torch.Tensor, requires_grad: bool, *, token_dims: int = 2) -> torch.Tensor:
    """t's values, contiguous, inside one buffer whose margins before and after hold NaN. The margin is
    MARGIN_ROWS tokens of t (at least 1024 elements), so offsets stay aligned; a token is t's element over
    its first token_dims dimensions ([b, s] of a dense tensor, [total] of a packed one). With requires_grad
    the buffer is the autograd leaf."""
    lead = t.shape[:token_dims]
    row = max(1, t[(0,) * token_dims].numel() if t.dim() >= token_dims and all(lead) else 1)
    margin = max(1024, -(-MARGIN_ROWS * row // 64) * 64)
    flat = torch.full((2 * margin + t.numel(),), float("nan"), dtype=t.dtype, device=t.device)
    flat[margin:margin + t.numel()] = t.reshape(-1)
    flat.requires_grad_(requires_grad)
    return flat[margin:margin + t.numel()].view(t.shape)


def poisoned(shape: tuple, dtype: torch.dtype, device, *, token_dims: int = 1) -> torch.Tensor:
    """NaN of `shape` inside NaN margins, in one allocation (a page pool may be gigabytes): a buffer for a
    subject to write into (`out=`), or a store to fill."""
    row = 1
    for n in shape[token_dims:]:
        row *= n
    numel = row
    for n in shape[:token_dims]:
        numel *= n
    margin = max(1024, -(-MARGIN_ROWS * max(1, row) // 64) * 64)
    flat = torch.full((2 * margin + numel,), float("nan"), dtype=dtype, device=device)
    return flat[margin:margin + numel].view(shape)


def written_outside(buffer: torch.Tensor, rows: int) -> int:
    """Elements of a poisoned() buffer that are not NaN in its margins or in its rows past the first
    `rows` (where the subject must not write), or 0."""
    flat = buffer.untyped_storage()
    whole = torch.empty(0, dtype=buffer.dtype, device=buffer.device).set_(flat, 0,
                                                                          (flat.nbytes() // buffer.element_size(),))
    start = buffer.storage_offset() + rows * (buffer[0].numel() if buffer.shape[0] else 0)
    stop = buffer.storage_offset() + buffer.numel()
    outside = torch.cat([whole[:buffer.storage_offset()], whole[start:stop], whole[stop:]])
    return int((~torch.isnan(outside)).sum())
