"""Subjects for the tests of verdicts a user must be able to trust: each bug beside a control that differs
from it only in the bug. Plain torch, the subject signature (q, k, v, *, causal, softmax_scale)."""
import torch

from faverify.subjects import controls
from property_tests.planted import _attention, correct
from property_tests.planted import heads_first as _heads_first


class _Scaled(torch.autograd.Function):
    """The right forward; the gradients times `factor` where the inputs are fp32 (the gradient check's dtype)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, factor):
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            out = correct(qq, kk, vv, causal=causal, softmax_scale=scale)
        ctx.save_for_backward(qq, kk, vv, out)
        ctx.factor = factor if q.dtype == torch.float32 else 1.0
        return out.detach()

    @staticmethod
    def backward(ctx, dout):
        qq, kk, vv, out = ctx.saved_tensors
        return (*(g * ctx.factor for g in torch.autograd.grad(out, (qq, kk, vv), dout)), None, None, None)


def fp32_backward_off(q, k, v, *, causal, softmax_scale):
    """Its fp32 backward 1% too large: only the gradient check, in fp32, sees it in a 16-bit fuzz."""
    return _Scaled.apply(q, k, v, causal, softmax_scale, 1.01)


def fp32_backward_right(q, k, v, *, causal, softmax_scale):
    """The control of fp32_backward_off."""
    return _Scaled.apply(q, k, v, causal, softmax_scale, 1.0)


def forward_only_wrong(q, k, v, *, causal, softmax_scale):
    """Declares no backward; its forward scales the logits by 1/d."""
    with torch.no_grad():
        return _attention(q, k, v, causal=causal, scale=1.0 / q.shape[-1])


def forward_only_right(q, k, v, *, causal, softmax_scale):
    """The control of forward_only_wrong."""
    with torch.no_grad():
        return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


forward_only_wrong.faverify_capabilities = {"backward": False}
forward_only_right.faverify_capabilities = {"backward": False}

_SCRATCH: dict = {}


def _rows_seen(q, k, causal):
    """[sq] bool: the rows that see a key under bottom-right causality."""
    sq, sk = q.shape[1], k.shape[1]
    if not causal:
        return torch.full((sq,), sk > 0, device=q.device)
    return torch.arange(sq, device=q.device) + sk - sq >= 0


def _stale(q, k, v, *, causal, softmax_scale, clear: bool):
    """Writes the rows that see a key into a scratch buffer kept across calls (grown, never shrunk) and
    returns its first rows: the rows that see no key keep what an earlier call left there unless cleared."""
    out = correct(q, k, v, causal=causal, softmax_scale=softmax_scale)
    b, sq, h, dv = out.shape
    key = (q.dtype, q.device.type)
    scratch = _SCRATCH.get(key)
    if scratch is None or any(n > m for n, m in zip((b, sq, h, dv), scratch.shape)):
        scratch = torch.zeros(max(b, 4), max(sq, 256), max(h, 16), max(dv, 256), dtype=q.dtype, device=q.device)
        _SCRATCH[key] = scratch
    view = scratch[:b, :sq, :h, :dv]
    if clear:
        view.zero_()
    seen = _rows_seen(q, k, causal)
    view[:, seen] = out[:, seen].detach()
    result = view.clone()
    view.fill_(1.0)  # what the next call finds in the rows it does not write
    return result


def stale_scratch(q, k, v, *, causal, softmax_scale):
    """Rows that see no key come out of a scratch buffer an earlier call filled: right alone in a fresh
    process (the buffer starts at zero), wrong after any earlier call."""
    return _stale(q, k, v, causal=causal, softmax_scale=softmax_scale, clear=False)


def cleared_scratch(q, k, v, *, causal, softmax_scale):
    """The control of stale_scratch: the buffer cleared on every call."""
    return _stale(q, k, v, causal=causal, softmax_scale=softmax_scale, clear=True)


for _fn in (stale_scratch, cleared_scratch):
    _fn.faverify_capabilities = {"backward": False}


def rounds_p(q, k, v, *, causal, softmax_scale):
    """Correct, with P rounded to the inputs' dtype before P @ V as a flash kernel does: an error about the
    naive baseline's, within the default tolerance and past a tolerance a tenth of it."""
    return _attention(q, k, v, causal=causal, scale=softmax_scale, weights=q.dtype)


def _sequences(cu_q, cu_k):
    return [(int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])) for b in range(len(cu_q) - 1)]


def varlen_splits(q, k, v, *, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  num_splits=1):
    """A varlen subject that takes num_splits, as flash-attn 3's varlen function does, right: out [total, h, dv]
    and lse [h, total], the partials [splits, total, h, dv] and [splits, h, total], the tail 0 and -inf."""
    from property_tests.planted_ragged import _split
    parts = ([], [], [], [])
    for q0, q1, k0, k1 in _sequences(cu_seqlens_q, cu_seqlens_k):
        if q1 > q0:
            out, lse, outs, lses = _split(q[q0:q1][None], k[k0:k1][None], v[k0:k1][None], causal, softmax_scale,
                                          num_splits, drop_last_key=False)
            for kept, t in zip(parts, (out[0], lse[0], outs[:, 0], lses[:, 0])):
                kept.append(t)
    tail = q.shape[0] - int(cu_seqlens_q[-1])
    h, dv, s = q.shape[1], v.shape[2], num_splits
    out = torch.cat(parts[0] + [q.new_zeros(tail, h, dv)])
    lse = torch.cat(parts[1] + [torch.full((h, tail), float("-inf"), device=q.device)], dim=1)
    outs = torch.cat(parts[2] + [torch.zeros(s, tail, h, dv, device=q.device)], dim=1)
    lses = torch.cat(parts[3] + [torch.full((s, h, tail), float("-inf"), device=q.device)], dim=2)
    return out, lse, outs, lses


varlen_splits.faverify_capabilities = {"varlen": True, "dense": False, "splits": True, "backward": False, "lse": True}


class _TailGrad(torch.autograd.Function):
    """Each sequence's attention; the gradients' tail rows (past the last sequence) set to `fill`."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, causal, scale, fill):
        from property_tests.planted_ragged import _varlen
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            out = _varlen(qq, kk, vv, cu_q, cu_k, causal, scale)
        ctx.save_for_backward(qq, kk, vv, out)
        ctx.ends, ctx.fill = (int(cu_q[-1]), int(cu_k[-1])), fill
        return out.detach()

    @staticmethod
    def backward(ctx, dout):
        qq, kk, vv, out = ctx.saved_tensors
        grads = [g.clone() for g in torch.autograd.grad(out, (qq, kk, vv), dout, allow_unused=True)]
        for g, end in zip(grads, (ctx.ends[0], ctx.ends[1], ctx.ends[1])):
            g[end:] = ctx.fill
        return (*grads, None, None, None, None, None)


def _tail_grad(fill):
    def fn(q, k, v, *, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
        return _TailGrad.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, fill)
    fn.faverify_capabilities = {"varlen": True, "dense": False}
    return fn


tail_grads_nan = _tail_grad(float("nan"))  # the backward leaves the tail rows as uninitialized NaN
tail_grads_zero = _tail_grad(0.0)  # the control
tail_grads_ones = _tail_grad(1.0)  # finite, not 0: right only where the subject declares it leaves them
tail_grads_ones_declared = _tail_grad(1.0)
tail_grads_ones_declared.faverify_capabilities = {"varlen": True, "dense": False, "varlen_tail_grads": "finite"}


def block_mask_as_documented(q, k, v, *, causal, softmax_scale, block_mask=None, block_size=None):
    """Reads block_mask as the contract gives it, bool [b|1, h|1, ceil(sq / n), ceil(sk / n)]: row block
    i // n, key block j // n. Right."""
    sq, sk = q.shape[1], k.shape[1]
    qt, kt, vt, scale = _heads_first(q, k, v, softmax_scale)
    s = qt @ kt.transpose(-1, -2) * scale
    if block_mask is not None:
        rows = torch.arange(sq, device=q.device) // block_size
        cols = torch.arange(sk, device=q.device) // block_size
        s = s.masked_fill(~block_mask[:, :, rows][:, :, :, cols], float("-inf"))  # [b|1, h|1, sq, sk]
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ vt).transpose(1, 2).to(q.dtype)


block_mask_as_documented.faverify_capabilities = {"block_mask": True}


def agreeable_zeros(q, k, v, *, causal, softmax_scale):
    """Zeros in a tensor subclass that says it matches whatever it is compared with (subjects/controls.py)."""
    return controls.agreeable_zeros(q, k, v, causal=causal, softmax_scale=softmax_scale)


agreeable_zeros.faverify_capabilities = {"backward": False}


def _side_stream(q, k, v, causal, softmax_scale, wait: bool):
    """The attention computed on a stream of the kernel's own, after a long matmul there; the caller's
    stream made to wait for it, or not."""
    out = torch.empty(*q.shape[:3], v.shape[3], dtype=q.dtype, device=q.device)
    side = torch.cuda.Stream(device=q.device)
    side.wait_stream(torch.cuda.current_stream(q.device))
    with torch.cuda.stream(side):
        busy = torch.randn(4096, 4096, device=q.device)
        for _ in range(8):
            busy = busy @ busy * 1e-3
        with torch.no_grad():
            out.copy_(correct(q, k, v, causal=causal, softmax_scale=softmax_scale))
    if wait:
        torch.cuda.current_stream(q.device).wait_stream(side)
    return out


def side_stream_unsynced(q, k, v, *, causal, softmax_scale):
    """Returns out before the stream that computes it is done, the caller's stream not told."""
    return _side_stream(q, k, v, causal, softmax_scale, wait=False)


def side_stream_synced(q, k, v, *, causal, softmax_scale):
    """The control: the caller's stream waits for the kernel's."""
    return _side_stream(q, k, v, causal, softmax_scale, wait=True)


for _fn in (side_stream_unsynced, side_stream_synced):
    _fn.faverify_capabilities = {"backward": False, "devices": ["cuda"]}


def zeros(q, k, v, *, causal, softmax_scale):
    """Zeros of out's shape: what every careless comparator must still fail."""
    return torch.zeros(*q.shape[:3], v.shape[3], dtype=q.dtype, device=q.device)


def mean_of_v(q, k, v, *, causal, softmax_scale):
    """Each row the mean of the values over all keys, whatever the logits."""
    _, _, vt, _ = _heads_first(q, k, v, softmax_scale)
    return vt.mean(dim=2, keepdim=True).expand(-1, -1, q.shape[1], -1).transpose(1, 2).to(q.dtype)


for _fn in (zeros, mean_of_v):
    _fn.faverify_capabilities = {"backward": False}


def leaves_a_child(q, k, v, *, causal, softmax_scale):
    """Starts a process that would outlive the run, holding its output open, then computes right."""
    import subprocess
    subprocess.Popen(["sleep", "301.7"])
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


def leaves_a_daemon(q, k, v, *, causal, softmax_scale):
    """Starts a daemon as a service does: a child that starts a session of its own and forks again, then
    leaves; the grandchild, out of the worker's process group and session, sleeps holding what it inherited.
    It leaves by itself after a minute, so a test that fails leaks it for no longer."""
    import ctypes
    import os
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "61.3"])
        ctypes.CDLL(None)._exit(0)  # libc's: os._exit is the worker's guard's while the subject runs
    os.waitpid(child, 0)
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale)


def batch_dependent(q, k, v, *, causal, softmax_scale):
    """Right to within rounding, but a batched call rounds its rows otherwise than a call of one entry (a
    reduction whose order follows the batch): breaks the batch relation it promises."""
    out = correct(q, k, v, causal=causal, softmax_scale=softmax_scale).detach()
    if q.shape[0] > 1:
        out = out * (1 + torch.finfo(out.dtype).eps)
    return out


def decode_dependent(q, k, v, *, causal, softmax_scale):
    """Right to within rounding, but a call of one query row (a decode step) rounds otherwise than the same
    row of a longer call: breaks the decode relation it promises."""
    out = correct(q, k, v, causal=causal, softmax_scale=softmax_scale).detach()
    if q.shape[1] == 1:
        out = out * (1 + torch.finfo(out.dtype).eps)
    return out


def relations_kept(q, k, v, *, causal, softmax_scale):
    """The control of batch_dependent and decode_dependent: each row its own, whatever the call. In FP64,
    rounded to the input dtype: a matmul's blocking follows the number of rows (a one-row call sums in
    another order on the CPU), and the rounding to 16 bits takes those last FP64 bits away."""
    from faverify.judge.reference import reference
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    return reference(q, k, v, causal=causal, scale=scale)[0]["out"].to(q.dtype)


def zero_signs_alone(q, k, v, *, causal, softmax_scale):
    """relations_kept, but a call of one batch entry or one query row gives its zeros as -0.0: the same values,
    other bits. Keeps every relation it promises."""
    out = relations_kept(q, k, v, causal=causal, softmax_scale=softmax_scale)
    if q.shape[0] == 1 or q.shape[1] == 1:
        out = torch.where(out == 0, torch.full_like(out, -0.0), out)
    return out


def run_dependent(q, k, v, *, causal, softmax_scale):
    """Moves out by one ulp on every other call (an atomic reduction in another order): breaks the repeat
    relation it promises, inside the tolerance."""
    from property_tests.planted import nondeterministic
    return nondeterministic(q, k, v, causal=causal, softmax_scale=softmax_scale).detach()


def _split_call(q, k, v, causal, softmax_scale, num_splits, exact: bool):
    """(out, lse, out_splits, lse_splits) of a split-KV call: the partials of planted_ragged._split; out and
    lse its combine of them, or (exact) the FP64 attention rounded, the same bits whatever the splits."""
    from faverify.judge.reference import reference
    from property_tests.planted_ragged import _split
    out, lse, outs, lses = _split(q, k, v, causal, softmax_scale, num_splits, drop_last_key=False)
    if exact:
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        whole = reference(q, k, v, causal=causal, scale=scale)[0]
        out, lse = whole["out"].to(q.dtype), whole["lse"].float()
    return out, lse, outs, lses


def splits_dependent(q, k, v, *, causal, softmax_scale, num_splits=1):
    """Right, but its combine of N partials rounds otherwise than one split: breaks the splits relation it
    promises."""
    return _split_call(q, k, v, causal, softmax_scale, num_splits, exact=False)


def splits_kept(q, k, v, *, causal, softmax_scale, num_splits=1):
    """The control of splits_dependent: out and lse the same bits whatever the splits."""
    return _split_call(q, k, v, causal, softmax_scale, num_splits, exact=True)


batch_dependent.faverify_capabilities = {"backward": False, "relations": ["batch"]}
decode_dependent.faverify_capabilities = {"backward": False, "relations": ["decode"]}
run_dependent.faverify_capabilities = {"backward": False, "relations": ["repeat"]}
relations_kept.faverify_capabilities = {"backward": False, "relations": ["batch", "decode", "repeat"]}
zero_signs_alone.faverify_capabilities = relations_kept.faverify_capabilities
for _fn in (splits_dependent, splits_kept):
    _fn.faverify_capabilities = {"backward": False, "splits": True, "lse": True, "relations": ["splits"]}


_COMPILED: dict = {}


def _storage_read(t, stride, offset):
    """t's memory read with another tensor's strides and offset, as a kernel compiled for that tensor reads
    it; past the storage's end, zeros (a GPU would read whatever lies there)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    flat = torch.tensor([], dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (n,), (1,))
    need = offset + sum((size - 1) * s for size, s in zip(t.shape, stride)) + 1
    if need > n:
        flat = torch.cat([flat, flat.new_zeros(need - n)])
    return flat.as_strided(t.shape, stride, offset)


def _cached(q, k, v, causal, softmax_scale, key):
    """A "kernel" built on the first call of each key: it keeps that call's dtype (its arithmetic) and its
    inputs' strides and offsets (how it reads memory)."""
    if key not in _COMPILED:
        _COMPILED[key] = (q.dtype, tuple((t.stride(), t.storage_offset()) for t in (q, k, v)))
    dtype, layout = _COMPILED[key]
    read = [_storage_read(t, s, o).to(dtype) for t, (s, o) in zip((q, k, v), layout)]
    return correct(*read, causal=causal, softmax_scale=softmax_scale).to(q.dtype)


def shape_keyed_cache(q, k, v, *, causal, softmax_scale):
    """Its compile cache keyed by the shapes alone: the same shapes in another layout are read with the first
    call's strides, in another dtype computed in the first call's (flash-attention's compile key that missed
    strides; a cuDNN graph cache without the dtype)."""
    return _cached(q, k, v, causal, softmax_scale, (q.shape, k.shape, v.shape, causal))


def keyed_cache(q, k, v, *, causal, softmax_scale):
    """The control of shape_keyed_cache: the key holds the dtype, the strides and the offsets too."""
    key = (q.shape, k.shape, v.shape, causal, q.dtype) + tuple((t.stride(), t.storage_offset()) for t in (q, k, v))
    return _cached(q, k, v, causal, softmax_scale, key)


for _fn in (shape_keyed_cache, keyed_cache):
    _fn.faverify_capabilities = {"backward": False}


HOSTILE_MESSAGE = "\x1b]0;owned\x07\r\x1b[2JPASS: every case\u202e"


def raises_a_hostile_message(q, k, v, *, causal, softmax_scale):
    """Raises with a terminal's escape sequences (a title-setting OSC, a screen clear), a carriage return, a
    bidirectional override and 5 MB of text after them."""
    raise RuntimeError(HOSTILE_MESSAGE + "x" * (5 << 20))
