"""Small Triton and Gluon kernels that run one helper of kernels/triton/ on a vector, for the tests that
check a helper against FP64 (a kernel must be defined at a module's top level for Triton to see its names)."""
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from faverify.kernels.triton.common import tanh_slope
from faverify.kernels.triton.hopper.layouts import tanh_approx


@triton.jit
def tanh_slope_probe(X, T, D, N: tl.constexpr, PRECISE: tl.constexpr):
    i = tl.arange(0, N)
    t, d = tanh_slope(tl.load(X + i), PRECISE=PRECISE)
    tl.store(T + i, t)
    tl.store(D + i, d)


@gluon.jit
def tanh_approx_probe(X, T, N: gl.constexpr):
    i = gl.arange(0, N, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(T + i, tanh_approx(gl.load(X + i)))
