"""What every bundled kernel must do, written once and run on each: triton (on the CPU under the
interpreter, or on the GPU), cuda and cuda-simt (GPU only: marked gpu, skipped on the CPU with the
reason). Kernel-specific checks (launch paths, TMA, the Hopper forward, the nvcc build) stay in
test_triton_kernels.py and test_cuda_kernels.py."""
import functools

import pytest
import torch

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.judge.verdict import Tolerance
from faverify.run.evaluate import evaluate, judge
from faverify.subjects import resolve

HAS_GPU = torch.cuda.is_available()
BUNDLED = ("triton", "cuda", "cuda-simt")
DTYPES = {"triton": ("bf16", "fp16", "fp32"), "cuda": ("bf16", "fp16"), "cuda-simt": ("bf16", "fp16", "fp32")}


def _param(name: str):
    if name == "triton":
        return pytest.param(name, id=name)
    return pytest.param(name, id=name, marks=[pytest.mark.gpu, pytest.mark.skipif(
        not HAS_GPU, reason="the CUDA kernels run on a GPU only (CPU tensors are refused)")])


KERNELS = [_param(n) for n in BUNDLED]


def device_of(name: str) -> str:
    return "cuda" if HAS_GPU or name != "triton" else "cpu"


def flash(name: str):
    """The kernel's flash_attn_func."""
    if name == "triton":
        from faverify.kernels.triton import flash_attn_func
        return flash_attn_func
    from faverify.kernels.cuda import flash_attn_func
    return functools.partial(flash_attn_func, variant="mma" if name == "cuda" else "simt")


def run(name: str, case: Case, *, init=None, backward=True):
    x = make_inputs(case, device_of(name), requires_grad=backward)
    out, lse = flash(name)(x.q, x.k, x.v, causal=case.causal, softmax_scale=case.scale, init=init or case.init,
                           return_lse=True)
    got = {"out": out, "lse": lse}
    if backward:
        got.update(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (x.q, x.k, x.v), x.dout)))
    return x, got


def widest(name: str) -> str:
    return "fp32" if "fp32" in DTYPES[name] else "fp16"


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_init_modes_give_the_same_bits(name, dtype):
    if dtype not in DTYPES[name]:
        pytest.skip(f"{name} does not take {dtype}")
    case = Case(2, 70, 33, 4, 2, 40, dtype=dtype, causal=True, seed=5)  # rows 0..36 see no key
    _, a = run(name, case, init="-inf")
    _, b = run(name, case, init="-1e30")
    for t in a:
        assert torch.equal(a[t], b[t]), t
    assert torch.isinf(a["lse"][:, :, :37]).all() and (a["out"][:, :37] == 0).all()
    assert (a["dq"][:, :37] == 0).all()


@pytest.mark.parametrize("name", KERNELS)
def test_no_keys_at_all(name):
    case = Case(1, 5, 0, 2, 1, 16, seed=1)
    _, got = run(name, case)
    assert (got["out"] == 0).all() and (got["lse"] == float("-inf")).all() and (got["dq"] == 0).all()
    assert got["dk"].shape == (1, 0, 1, 16)


@pytest.mark.parametrize("name", KERNELS)
def test_backward_is_deterministic(name):
    case = Case(2, 97, 131, 2, 1, 64, dtype="bf16", causal=True, seed=2)  # two query heads on one kv head
    _, a = run(name, case)
    _, b = run(name, case)
    for t in ("dq", "dk", "dv"):
        assert torch.equal(a[t], b[t]), t


@pytest.mark.parametrize("name", KERNELS)
def test_gqa_sums_dk_dv_over_the_group(name):
    dtype = widest(name)
    case = Case(1, 33, 65, 8, 2, 32, dtype=dtype, seed=7)
    x, got = run(name, case)
    # the same computation with k and v expanded per query head, gradients summed by hand
    k = x.k.detach().repeat_interleave(4, dim=2).requires_grad_()
    v = x.v.detach().repeat_interleave(4, dim=2).requires_grad_()
    q = x.q.detach().requires_grad_()
    out = flash(name)(q, k, v, softmax_scale=case.scale)
    _, dk, dv = torch.autograd.grad(out, (q, k, v), x.dout)
    atol = 1e-4 if dtype == "fp32" else 2e-2  # 16 bits: the by-hand sum rounds each head's part first
    for mine, by_hand in ((got["dk"], dk), (got["dv"], dv)):
        assert torch.allclose(mine.float(), by_hand.reshape(1, 65, 2, 4, 32).float().sum(3), atol=atol)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("layout", ["transposed", "strided", "packed"])
def test_strided_inputs_without_copies(name, layout, monkeypatch):
    case = Case(2, 65, 65, 4, 2, 64, dtype="bf16", causal=True, layout=layout, seed=9)
    x = make_inputs(case, device_of(name))
    copies = []
    original = torch.Tensor.contiguous
    monkeypatch.setattr(torch.Tensor, "contiguous",
                        lambda self, *a, **k: copies.append(tuple(self.shape)) or original(self, *a, **k))
    out, lse = flash(name)(x.q, x.k, x.v, causal=True, return_lse=True)
    monkeypatch.undo()
    assert not copies  # q, k, v are read in place through their strides
    metrics = judge(case, x, {"out": out, "lse": lse}, Tolerance(), ("out", "lse"))
    assert all(m.passed for m in metrics.values()), {t: m.reason for t, m in metrics.items() if not m.passed}


ODD_CASES = [
    Case(1, 1, 1, 1, 1, 32, dtype="bf16"),
    Case(2, 17, 113, 4, 2, 40, dtype="fp16", causal=True, seed=1),
    Case(1, 203, 65, 2, 1, 72, dtype="bf16", causal=True, seed=2),          # rows that see no key
    Case(1, 129, 515, 2, 1, 96, dtype="fp16", seed=3, layout="transposed"),  # MQA, strided, a 3-key tail
    Case(2, 63, 64, 3, 3, 160, dtype="bf16", causal=True, seed=4, layout="packed"),
    Case(1, 127, 129, 2, 2, 256, dtype="fp16", seed=5, regime="large"),
    Case(1, 65, 200, 2, 1, 8, dtype="bf16", seed=6, init="-1e30", regime="bf16-scale"),
    Case(1, 300, 300, 2, 2, 128, dtype="fp16", causal=True, seed=7, regime="outliers"),
    Case(1, 64, 128, 2, 2, 64, dtype="bf16", causal=True, seed=8, regime="constant"),
    Case(1, 99, 77, 2, 2, 1, dtype="fp16", seed=9, regime="peaked"),
    Case(1, 40, 50, 2, 1, 24, dtype="fp16", causal=True, seed=24),
    Case(1, 70, 90, 2, 1, 48, dtype="fp32", causal=True, seed=3),
]


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("case", ODD_CASES, ids=lambda c: f"{c.seqlen_q}x{c.seqlen_k}d{c.head_dim}{c.dtype}")
def test_odd_shapes_pass_against_fp64(name, case):
    if case.dtype not in DTYPES[name]:
        pytest.skip(f"{name} does not take {case.dtype}")
    r = evaluate(resolve(name), case, device_of(name))
    assert r.status == "pass", r.reason


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("call,message", [
    (lambda f, q, k, v: f(q, *(torch.cat([k, k[:, :, :1]], 2),) * 2), "must divide number of heads"),
    (lambda f, q, k, v: f(q, k, v.to(torch.bfloat16)), "same dtype"),
    (lambda f, q, k, v: f(q[..., ::2], k[..., ::2], v[..., ::2]), "contiguous in its last dimension"),
    (lambda f, q, k, v: f(q, k, v, init="zero"), "init must be one of"),
    (lambda f, q, k, v: f(q, k, v, softmax_scale=-1.0), "softmax_scale must be a finite number > 0"),
    (lambda f, q, k, v: f(q[0], k[0], v[0]), "must have 4 dimensions"),
    (lambda f, q, k, v: f(q.to(torch.int32), k, v), "dtype"),
    (lambda f, q, k, v: f(*(torch.zeros(1, 4, 1, 264, dtype=q.dtype, device=q.device),) * 3),
     "head_dim must be in 1..256"),
])
def test_bad_inputs_name_the_rule(name, call, message):
    q = torch.randn(1, 8, 4, 32, device=device_of(name), dtype=torch.float16)
    k = torch.randn(1, 8, 2, 32, device=device_of(name), dtype=torch.float16)
    with pytest.raises(ValueError, match=message):
        call(flash(name), q, k, k.clone())
