import dataclasses

import pytest
import torch
from hypothesis import given

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.cases.strategies import cases
from faverify.cases.values import BF16_SCALE_VALUE, FP16_SCALE_VALUE
from faverify.cases.vocabulary import LAYOUTS


@given(cases())
def test_same_case_same_tensors(case):
    a, b = make_inputs(case, "cpu"), make_inputs(case, "cpu")
    for x, y in zip((a.q, a.k, a.v, a.dout), (b.q, b.k, b.v, b.dout)):
        assert torch.equal(x.nan_to_num(), y.nan_to_num())


@given(cases())
def test_layouts_hold_the_same_values(case):
    """Every layout but broadcast; broadcast holds one copy of k and v, the first batch element's first kv
    head, and q as drawn where no regime relates q to the keys."""
    ref = make_inputs(dataclasses.replace(case, layout="contiguous"), "cpu")
    for layout in LAYOUTS:
        x = make_inputs(dataclasses.replace(case, layout=layout), "cpu", requires_grad=True)
        for name, r, t in zip("qkv", ref.tensors(), x.tensors()):
            assert t.shape == r.shape
            if layout != "broadcast":
                assert torch.equal(t.detach(), r)
            elif name != "q":
                assert torch.equal(t.detach(), t.detach()[:1, :, :1].expand_as(t))
            elif case.regime not in ("peaked", "lone-key"):
                assert torch.equal(t.detach(), r)
        assert x.q.requires_grad


def test_layouts_really_differ_in_memory():
    c = Case(2, 8, 8, 4, 2, 16, layout="transposed")
    assert not make_inputs(c, "cpu").q.is_contiguous()
    s = make_inputs(dataclasses.replace(c, layout="strided"), "cpu").q
    assert s.stride(2) == 16 + 8  # row pitch wider than head_dim
    assert torch.isnan(s.as_strided((1,), (1,), s.storage_offset() + 16)).all()  # poisoned gap
    p = make_inputs(dataclasses.replace(c, layout="packed"), "cpu")
    assert p.q.data_ptr() != p.k.data_ptr() and p.q.untyped_storage().data_ptr() == p.k.untyped_storage().data_ptr()


def _logits(case, x):
    g = case.group
    k = x.k.float().repeat_interleave(g, dim=2)
    return torch.einsum("bqhd,bkhd->bhqk", x.q.float(), k) * case.scale


def test_large_regime_makes_logit_gaps_past_1e3():
    c = Case(1, 64, 64, 2, 2, 64, regime="large", dtype="fp32", seed=1)
    s = _logits(c, make_inputs(c, "cpu"))
    assert (s.amax(-1) - s.amin(-1)).min() > 1e3


@pytest.mark.parametrize("dtype,value", [("bf16", BF16_SCALE_VALUE), ("fp16", FP16_SCALE_VALUE), ("fp32",
                                                                                                  BF16_SCALE_VALUE)])
def test_bf16_scale_regime_is_constant_and_exact(dtype, value):
    x = make_inputs(Case(1, 4, 4, 1, 1, 8, regime="bf16-scale", dtype=dtype), "cpu")
    for t in x.tensors():
        assert (t.float() == value).all()


def test_constant_regime_gives_equal_logits_per_row():
    c = Case(1, 16, 130, 2, 1, 32, regime="constant", dtype="fp32")
    s = _logits(c, make_inputs(c, "cpu"))
    assert torch.allclose(s, s[..., :1].expand_as(s))


def test_peaked_regime_has_one_dominant_visible_key():
    c = Case(1, 40, 30, 2, 1, 64, regime="peaked", causal=True, dtype="fp32", seed=3)
    s = _logits(c, make_inputs(c, "cpu"))
    i = torch.arange(40)[:, None]
    j = torch.arange(30)[None, :]
    s = s.masked_fill(j > i + 30 - 40, float("-inf"))
    top2 = s[..., 10:, :].topk(2, dim=-1).values  # rows 10.. see at least one key
    seen_two = (torch.arange(10, 40) - 10 + 1 >= 2)
    gap = (top2[..., 0] - top2[..., 1])[..., seen_two]
    assert gap.min() > 8  # exp(-8): the rest of the row is a rounding next to the peak


def test_outliers_and_tiny_regimes():
    big = make_inputs(Case(4, 256, 256, 4, 4, 64, regime="outliers", dtype="fp32"), "cpu")
    assert big.q.abs().max() > 8  # N(0,1) alone essentially never passes 6
    tiny = make_inputs(Case(1, 64, 64, 2, 2, 64, regime="tiny", dtype="fp32"), "cpu")
    assert tiny.q.abs().max() < 0.01
