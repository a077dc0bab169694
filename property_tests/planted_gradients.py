"""Subjects whose gradients were asked for and are not what they should be: faverify must fail each.

Plain torch with autograd, in the subject signature (q, k, v, *, causal, softmax_scale) on [b, s, h, d]."""
import torch

from property_tests.planted import correct


def detached(q, k, v, *, causal, softmax_scale):
    """Right forward, returned without its autograd graph: no gradient can be computed through it."""
    return correct(q, k, v, causal=causal, softmax_scale=softmax_scale).detach()


def detached_when_causal(q, k, v, *, causal, softmax_scale):
    """Detaches on causal cases alone: a fuzz that draws both must fail it."""
    out = correct(q, k, v, causal=causal, softmax_scale=softmax_scale)
    return out.detach() if causal else out


class _ZeroGradients(torch.autograd.Function):
    """The identity on q, k and v's attention whose backward gives zeros to every input."""

    @staticmethod
    def forward(ctx, out, q, k, v):
        ctx.shapes = (q, k, v)
        return out.clone()

    @staticmethod
    def backward(ctx, grad):
        return None, *(torch.zeros_like(t) for t in ctx.shapes)


def zero_gradients(q, k, v, *, causal, softmax_scale):
    """Right forward; dq, dk and dv all zero."""
    with torch.no_grad():
        out = correct(q, k, v, causal=causal, softmax_scale=softmax_scale)
    return _ZeroGradients.apply(out, q, k, v)
