"""Small Triton kernels that run one helper of kernels/triton/common.py on a vector, for the tests that
check a helper against FP64 (a kernel must be defined at a module's top level for Triton to see its names)."""
import triton
import triton.language as tl

from faverify.kernels.triton.common import tanh_logit, tanh_slope


@triton.jit
def tanh_slope_probe(X, T, D, N: tl.constexpr, PRECISE: tl.constexpr):
    i = tl.arange(0, N)
    t, d = tanh_slope(tl.load(X + i), PRECISE=PRECISE)
    tl.store(T + i, t)
    tl.store(D + i, d)


@triton.jit
def tanh_logit_probe(X, T, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(T + i, tanh_logit(tl.load(X + i)))
