import math

import pytest
import torch

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.errors import UsageError
from faverify.judge.metrics import ErrorStats, error_stats
from faverify.judge.reference import naive, reference
from faverify.judge.verdict import DEFAULT_FACTOR, Tolerance, judge_tensor, parse_overrides


def _tensor_stats(got, ref, base, scale, tensor="dv"):
    scales = {tensor: torch.tensor(scale, dtype=torch.float64), "logit": torch.tensor(1.0, dtype=torch.float64)}
    return error_stats({tensor: got}, {tensor: ref}, {tensor: base}, scales, tensors=(tensor,))[tensor]


@pytest.mark.parametrize("dtype,bits", [(torch.bfloat16, 7), (torch.float16, 10), (torch.float32, 23)])
def test_ulps_are_counted_at_the_larger_of_the_value_and_the_tensors_magnitude(dtype, bits):
    ref = torch.tensor([1.0, 3.0, 1e-30], dtype=torch.float64)
    got = ref.to(dtype).clone()
    got[1] = torch.tensor(3.0 + 2 * 2.0 ** (1 - bits), dtype=torch.float64).to(dtype)  # 2 ulps of [2, 4)
    assert _tensor_stats(got, ref, got, scale=1.0).values["max_ulp"] == 2
    got[2] = 4e-16 if dtype != torch.float16 else 0.0  # next to a value ~0, on a tensor whose terms are ~1
    s = _tensor_stats(got, ref, got, scale=1.0)
    assert s.values["max_ulp"] == 2, s.values  # not a distance in representable values near 0
    got[0] = 1.5  # an error of 0.5 at 1.0: 2^(bits - 1) ulps
    assert _tensor_stats(got, ref, got, scale=1.0).values["max_ulp"] == 2 ** (bits - 1)


def test_the_ratio_to_an_exact_baseline_is_counted_against_one_rounding():
    ref = torch.tensor([0.0, 1.0], dtype=torch.float64)
    got = torch.tensor([2.0**-9, 1.0], dtype=torch.bfloat16)
    m = judge_tensor(_tensor_stats(got, ref, ref.to(torch.bfloat16), scale=1.0), "bf16", Tolerance())
    assert m.baseline_max_abs == 0 and m.ratio == 0.5  # 2^-9 against one rounding of 1 (2^-8), not inf


def _judge(got_out, case, x, tolerance=Tolerance()):
    ref, scales = reference(*x.tensors(), causal=case.causal, scale=case.scale)
    base = naive(*x.tensors(), causal=case.causal, scale=case.scale)
    masked = case.masked_rows
    stats = error_stats({"out": got_out, "lse": None}, ref, base, scales, tensors=("out", "lse"), masked_rows=masked)
    return judge_tensor(stats["out"], case.dtype, tolerance), base, ref


def test_baseline_itself_passes_and_twice_its_error_fails():
    c = Case(1, 64, 64, 2, 2, 32, dtype="bf16", seed=3)
    x = make_inputs(c, "cpu")
    m, base, ref = _judge(naive(*x.tensors(), causal=False, scale=c.scale)["out"], c, x)
    assert m.passed and m.ratio == 1.0
    worse = (ref["out"] + 4 * (base["out"].double() - ref["out"])).to(torch.bfloat16)
    m2, _, _ = _judge(worse, c, x)
    assert not m2.passed and "max error" in m2.reason


def test_nan_where_reference_is_finite_fails_and_is_the_worst_element():
    c = Case(1, 8, 8, 1, 1, 16, dtype="fp16", seed=1)
    x = make_inputs(c, "cpu")
    out = naive(*x.tensors(), causal=False, scale=c.scale)["out"].clone()
    out[0, 5, 0, 3] = math.nan
    m, _, _ = _judge(out, c, x)
    assert not m.passed and m.nan == 1 and m.worst_index == [0, 5, 0, 3]


def test_rows_that_see_no_key_must_be_zero():
    c = Case(1, 6, 3, 1, 1, 16, dtype="fp16", causal=True, seed=1)  # rows 0..2 see nothing
    x = make_inputs(c, "cpu")
    out = naive(*x.tensors(), causal=True, scale=c.scale)["out"].clone()
    out[0, 1] = 1e-3  # tiny, inside any tolerance, but the convention says exactly 0
    m, _, _ = _judge(out, c, x)
    assert not m.passed and m.masked_bad == 16 and "rows that see no key" in m.reason


def test_floor_does_not_vanish_when_the_baseline_is_exact():
    """seqlen_k == 1: out = v exactly for the baseline. The floor (u * the terms' magnitude) still
    allows one ulp on typical elements, and not ten."""
    c = Case(1, 4, 1, 1, 1, 16, dtype="bf16", seed=1)
    x = make_inputs(c, "cpu")
    out = naive(*x.tensors(), causal=False, scale=c.scale)["out"]
    typical = out.abs() < 0.25

    def shifted(ulps):
        return torch.where(typical, (out.view(torch.int16) + ulps).view(torch.bfloat16), out)

    m, _, _ = _judge(shifted(1), c, x)
    assert m.baseline_max_abs == 0 and m.allowed > 0 and m.passed
    m, _, _ = _judge(shifted(10), c, x)
    assert not m.passed


def test_an_elements_own_rounding_into_the_dtype_is_not_counted_against_the_kernel():
    """seqlen_k == 1: out = v exactly. The largest element one ulp off: half an ulp of it is the result's
    own rounding (u |ref|), the other half within the floor u * scale; three ulps are not."""
    c = Case(1, 4, 1, 1, 1, 16, dtype="bf16", seed=1)
    x = make_inputs(c, "cpu")
    out = naive(*x.tensors(), causal=False, scale=c.scale)["out"]
    largest = out.abs() == out.abs().max()

    def shifted(ulps):
        return torch.where(largest, (out.view(torch.int16) + ulps).view(torch.bfloat16), out)

    m, _, _ = _judge(shifted(1), c, x)
    assert m.max_abs > m.allowed and m.passed, (m.max_abs, m.allowed)
    m, _, _ = _judge(shifted(3), c, x)
    assert not m.passed and "max error" in m.reason


def test_an_inf_gradient_passes_only_where_the_weights_are_undetermined():
    """Logits near 1e10 (ill-conditioned): dq and dk of a kernel's legitimate weights may pass the dtype's
    range; NaN still fails, and so does Inf in out or where the case is well-conditioned."""
    from faverify.judge.verdict import judge_tensor
    values = dict(max_abs=0.0, mean_abs=0.0, rmse=0.0, ref_max=1e-30, max_ulp=0.0, nan=0.0, inf=160.0,
                  masked_bad=0.0, baseline_max_abs=0.0, worst=0.0, beyond_rounding=0.0)
    tol = Tolerance()
    assert judge_tensor(ErrorStats("dq", values, 1e-36, 1.4e10, [0]), "fp16", tol).passed
    assert judge_tensor(ErrorStats("dk", values, 1e-36, 1.4e10, [0]), "fp16", tol).passed
    assert not judge_tensor(ErrorStats("out", values, 1e-36, 1.4e10, [0]), "fp16", tol).passed
    assert not judge_tensor(ErrorStats("dq", values, 1e-36, 1e5, [0]), "fp16", tol).passed  # well-conditioned
    assert not judge_tensor(ErrorStats("dq", dict(values, inf=0.0, nan=3.0), 1e-36, 1.4e10, [0]), "fp16", tol).passed


def test_ill_conditioned_cases_waive_tolerance_but_not_nan():
    assert Tolerance.ill_conditioned(1e9) and not Tolerance.ill_conditioned(1e5)
    c = Case(1, 1, 17, 1, 1, 40, dtype="bf16", regime="bf16-scale", softmax_scale=0.001)
    x = make_inputs(c, "cpu")
    one_hot = x.v[:, :1].expand(1, 1, 1, 40).clone() * 0  # any convex combination of equal v's is v
    m, _, _ = _judge(one_hot, c, x)
    assert m.waived and m.passed
    one_hot[0, 0, 0, 0] = math.nan
    m, _, _ = _judge(one_hot, c, x)
    assert not m.passed and m.nan == 1


def test_inf_fails_unless_an_allowed_value_rounds_to_it():
    """An Inf where the reference is finite fails; it passes only where a value within the allowed error of
    that element's reference lies past the dtype's range, with the Inf's sign (Inf is that value rounded).
    NaN fails there too."""
    c = Case(1, 8, 8, 1, 1, 16, dtype="fp16", seed=1)
    x = make_inputs(c, "cpu")
    out = naive(*x.tensors(), causal=False, scale=c.scale)["out"].clone()
    out[0, 2, 0, 1] = math.inf
    m, _, _ = _judge(out, c, x)
    assert not m.passed and m.inf == 1 and "Inf where the reference is finite" in m.reason
    # every value is 32768, so out is 32768 whatever the weights: 65520 is past any allowance, Inf fails
    c = Case(1, 1, 17, 1, 1, 40, dtype="fp16", regime="bf16-scale", softmax_scale=0.001)
    x = make_inputs(c, "cpu")
    out = x.v[:, :1].expand(1, 1, 1, 40).clone()
    out[0, 0, 0, 0] = math.inf
    m, _, _ = _judge(out, c, x)
    assert not m.passed and m.inf == 1 and "Inf" in m.reason


def _dq_stats(ref: float, got: float, allowed_scale: float) -> ErrorStats:
    """dq's statistics of one fp16 element through metrics.error_stats: got against ref, scale_T given."""
    t = {"dq": torch.tensor([got], dtype=torch.float16)}
    r = {"dq": torch.tensor([ref], dtype=torch.float64)}
    return error_stats(t, r, r, {"dq": torch.tensor(allowed_scale, dtype=torch.float64),
                                 "logit": torch.tensor(1.0, dtype=torch.float64)}, tensors=("dq",))["dq"]


def test_an_inf_from_rounding_an_allowed_value_past_fp16_passes():
    """A dq of 65400 computed within the allowance as 65530 rounds to Inf in fp16: that Inf passes where the
    allowance (atol F = 2^-11 scale_T) reaches 65520 - 65400, fails where it does not, and -Inf never does."""
    wide, narrow = 200 * 2048, 50 * 2048  # F = 200, F = 50
    assert judge_tensor(_dq_stats(65400.0, math.inf, wide), "fp16", Tolerance()).passed
    assert not judge_tensor(_dq_stats(65400.0, math.inf, narrow), "fp16", Tolerance()).passed
    assert not judge_tensor(_dq_stats(65400.0, -math.inf, wide), "fp16", Tolerance()).passed
    nan = judge_tensor(_dq_stats(65400.0, math.nan, wide), "fp16", Tolerance())
    assert not nan.passed and "NaN" in nan.reason and "Inf" not in nan.reason


def test_overrides():
    assert parse_overrides("out=4,dq=5", DEFAULT_FACTOR, "--factor")["dq"] == 5
    assert set(parse_overrides("7", DEFAULT_FACTOR, "--factor").values()) == {7.0}
    for bad in ("zz=1", "out=x", "out=-1"):
        with pytest.raises(UsageError) as e:
            parse_overrides(bad, DEFAULT_FACTOR, "--factor")
        assert e.value.argument == "--factor"


def test_rule_is_printed_with_every_factor():
    text = Tolerance().describe()
    assert "out: factor 2" in text and "dq: factor 3" in text and "2^-18 fp32" in text and "tight 0.25" in text


def _stats(err: float, baseline: float, tensor: str = "out", ref_max: float = 1.0):
    """One tensor's statistics with the floor unit F = u(bf16) * scale = 1: err and baseline in units of F."""
    from faverify.dtypes import FLOOR_UNIT
    from faverify.judge.metrics import ErrorStats
    values = {"max_abs": err, "mean_abs": err, "rmse": err, "ref_max": ref_max, "max_ulp": 0.0, "nan": 0.0,
              "inf": 0.0, "masked_bad": 0.0, "baseline_max_abs": baseline, "worst": 0.0}
    return ErrorStats(tensor, values, 1 / FLOOR_UNIT["bf16"], 0.0, [0])


def test_the_floor_shrinks_beside_an_informative_baseline():
    """Three times an informative baseline's error fails even where it is about one floor unit (the full
    floor added to 2x the baseline allowed it); with the baseline exact, the full floor stands; the
    allowed error is split into its two parts."""
    full = Tolerance(tight={t: 1.0 for t in DEFAULT_FACTOR})  # the floor that never shrinks
    three_times = _stats(1.5, 0.5, ref_max=10.0)
    assert judge_tensor(three_times, "bf16", full).passed
    m = judge_tensor(three_times, "bf16", Tolerance())
    assert not m.passed and m.allowed == pytest.approx(2 * 0.5 + 0.25) and m.floor == pytest.approx(0.25)
    assert judge_tensor(_stats(0.9, 0.0), "bf16", Tolerance()).passed  # exact baseline: the whole floor
    m = judge_tensor(_stats(0.9, 0.0), "bf16", Tolerance())
    assert m.floor == pytest.approx(1.0) and m.allowed == pytest.approx(1.0)
    assert not judge_tensor(_stats(1.1, 0.0), "bf16", Tolerance()).passed
    # a baseline error halfway to the knee leaves half the full floor
    from faverify.judge.verdict import KNEE
    assert judge_tensor(_stats(0, KNEE / 2), "bf16", Tolerance()).floor == pytest.approx(0.5)


def test_a_kernel_several_times_the_baseline_error_is_caught_more_often():
    """P rounded to bf16 in fp16 cases: 8x the naive fp16 rounding of P. The tight floor catches it on
    more of the same drawn cases than the floor that never shrinks, and at an earlier case (drawn from the
    regimes of ordinary logits, where the error is P's rounding and not the logits' extremes)."""
    from hypothesis import HealthCheck, given, seed, settings

    from faverify.cases.strategies import cases
    from faverify.run.evaluate import evaluate
    from faverify.subjects import resolve
    drawn = []

    @seed(1)
    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(cases(dtypes=("fp16",), regimes=("normal", "outliers", "peaked"), layouts=("contiguous",)))
    def draw(c):
        drawn.append(c)
    draw()
    subject = resolve("property_tests.planted:bf16_weights")
    full = Tolerance(tight={t: 1.0 for t in DEFAULT_FACTOR})
    caught = {name: [i for i, c in enumerate(drawn) if evaluate(subject, c, "cpu", mode="fwd",
                                                                tolerance=tol).status == "fail"]
              for name, tol in (("full", full), ("tight", Tolerance()))}
    assert len(caught["tight"]) > len(caught["full"]) and set(caught["full"]) <= set(caught["tight"])
    control = resolve("property_tests.planted:correct")
    assert all(evaluate(control, c, "cpu", mode="fwd").status == "pass" for c in drawn)


def test_errors_of_flushed_subnormals_pass_and_larger_ones_fail():
    """A GPU flushes fp32 subnormals to zero: a tensor of terms near 1e-40 (a sink with all the weight)
    comes back as 0, an error of about 2^-125 that passes; 1e-36 at that scale fails."""
    from faverify.judge.metrics import ErrorStats
    for err, passes in ((2.2e-38, True), (1e-36, False)):
        values = {"max_abs": err, "mean_abs": err, "rmse": err, "ref_max": 1e-38, "max_ulp": 0.0, "nan": 0.0,
                  "inf": 0.0, "masked_bad": 0.0, "baseline_max_abs": 0.0, "worst": 0.0}
        assert judge_tensor(ErrorStats("dk", values, 1e-39, 0.0, [0]), "bf16", Tolerance()).passed is passes


def test_a_subnormal_scale_does_not_divide_by_zero():
    """The terms' magnitude can be a subnormal double: at 256 x 5e-324 the floor unit u(bf16) * scale is the
    smallest one, and the knee KNEE * u rounds to 0."""
    from faverify.judge.metrics import ErrorStats
    values = {"max_abs": 0.0, "mean_abs": 0.0, "rmse": 0.0, "ref_max": 0.0, "max_ulp": 0.0, "nan": 0.0,
              "inf": 0.0, "masked_bad": 0.0, "baseline_max_abs": 1e-320, "worst": 0.0}
    assert judge_tensor(ErrorStats("out", values, 256 * 5e-324, 0.0, [0]), "bf16", Tolerance()).passed


def test_dsinks_from_an_fp16_out_below_the_smallest_normal_passes_and_a_larger_error_fails():
    """A kernel's D = rowsum(dO * O) reads its out rounded to its dtype, and an fp16 out's elements below the
    smallest normal carry half a subnormal step of error whatever their size. A kernel exact but for that
    rounding (here a sink that takes nearly all the weight, so out is near 1e-7) passes; dsinks ten times
    the allowance off fails."""
    from faverify.cases.conventions import DEFAULT
    from faverify.cases.inputs import variant_of
    from faverify.run.evaluate import judge as judge_case
    case = Case(1, 8, 1, 1, 1, 40, dtype="fp16", window=(-1, 0), softmax_scale=2.0, sinks="around", seed=33)
    x = make_inputs(case, "cpu")
    q, k, v = x.tensors()
    import dataclasses
    keys_only, _ = reference(q, k, v, causal=case.causal, scale=case.scale,
                             variant=dataclasses.replace(variant_of(case, x, DEFAULT), sinks=None))
    seen = keys_only["lse"][torch.isfinite(keys_only["lse"])]
    x.sinks = torch.full_like(x.sinks, float(seen.max()) + 12.0)  # the keys' weight near e^-12 of the sink's
    ref, _ = reference(q, k, v, x.dout, causal=case.causal, scale=case.scale, variant=variant_of(case, x, DEFAULT))
    got = {t: ref[t].to(q.dtype) for t in ("out", "dq", "dk", "dv")}
    got["lse"] = ref["lse"].float()
    out = ref["out"].to(q.dtype).double()
    assert 0 < out.abs().max() < torch.finfo(torch.float16).tiny  # the case is one of subnormal outs
    D = (x.dout.double() * out).sum(-1).transpose(1, 2)  # [b, h, sq], from the rounded out
    p_sink = torch.exp((x.sinks.double()[None, :, None] - ref["lse"].double()).clamp(max=0))
    got["dsinks"] = (-(p_sink * D).sum((0, 2))).float()
    tensors = ("out", "lse", "dq", "dk", "dv", "dsinks")
    metric = judge_case(case, x, got, Tolerance(), tensors)["dsinks"]
    assert metric.passed and metric.max_abs > 0, metric.reason
    got["dsinks"] = got["dsinks"] + 10 * metric.allowed
    assert not judge_case(case, x, got, Tolerance(), tensors)["dsinks"].passed


def test_outs_baseline_term_is_capped_at_half_its_size_and_no_lower_than_a_subnormal():
    """A baseline as wrong as the reference is large (bf16 logits of 1e3 rounded) allows no more than half of
    max|ref|: zeros fail. The cap never goes below the dtype's smallest subnormal, which an out rounded to
    the dtype may lose whole."""
    from faverify.judge.verdict import OUT_CAP
    wide = judge_tensor(_stats(1.0, 1.0, ref_max=1.0), "bf16", Tolerance())
    assert not wide.passed and wide.allowed == pytest.approx(OUT_CAP * 1.0 + wide.floor)
    tiny = _stats(7e-15, 7e-15, ref_max=7e-15)
    assert judge_tensor(tiny, "fp16", Tolerance()).passed
    assert judge_tensor(_stats(1.0, 1.0, "dq", ref_max=1.0), "bf16", Tolerance()).passed  # gradients are not capped


def test_a_ds_rounded_to_fp16_subnormals_passes_and_a_dropped_slope_fails():
    """Flash backwards round dS (after softcap's slope) to the input dtype as a matmul operand. Where dS lies
    below fp16's smallest normal its rounding is half a subnormal step, not a relative u: with logits near
    850 and softcap 94 the slope is 6e-8, so dS = dlse * slope is a few subnormal steps, and dk = scale dS^T q
    sums those roundings (seen on the H100: dk at 1.01x a floor that counted relative roundings only). That
    kernel passes; the same with softcap's slope dropped from dS fails."""
    from faverify.run.evaluate import judge as judge_case
    case = Case(1, 3, 1, 4, 1, 64, dtype="fp16", softmax_scale=2.0, softcap=94.0, lse_grad="with", seed=2)
    x = make_inputs(case, "cpu")
    g = torch.Generator().manual_seed(0)
    x.q = (11.5 + 0.3 * torch.randn(x.q.shape, generator=g)).half()
    x.k = (0.58 + 0.01 * torch.randn(x.k.shape, generator=g)).half()  # logits 2 q.k near 850
    q, k, v = (t.double() for t in x.tensors())
    raw = 2.0 * torch.einsum("bihd,bjhd->bhij", q, k.expand(-1, -1, 4, -1))  # [b, h, sq, 1]
    capped = 94.0 * torch.tanh(raw / 94.0)
    t = torch.exp(-2 * raw / 94.0)
    slope = 4 * t / (1 + t) ** 2  # 1 - tanh^2 without its cancellation
    dlse = x.dlse.double().unsqueeze(-1)

    def grads(ds):  # one key: P = 1, dP - D cancels, dS = dlse * slope, rounded to fp16 as an operand
        ds = ds.half().double()
        return {"out": v.expand(-1, 3, 4, -1).half(), "lse": capped.squeeze(-1).float(),
                "dq": (2.0 * ds.transpose(1, 2) * k).half(),
                "dk": (2.0 * torch.einsum("bhij,bihd->bjhd", ds, q).sum(2, keepdim=True)).half(),
                "dv": x.dout.double().sum((1, 2), keepdim=True).half()}
    assert 0 < (dlse * slope).abs().max() < torch.finfo(torch.float16).tiny  # every dS a subnormal
    tensors = ("out", "lse", "dq", "dk", "dv")
    metric = judge_case(case, x, grads(dlse * slope), Tolerance(), tensors)["dk"]
    assert metric.passed and metric.max_abs > 0, metric.reason
    assert not judge_case(case, x, grads(dlse), Tolerance(), tensors)["dk"].passed


def test_an_exact_value_past_the_dtypes_range_may_come_back_as_inf_of_its_sign():
    """dq of 108582 in fp16 (largest finite 65504) rounds to Inf: that Inf, or the saturated 65504, passes;
    Inf of the other sign and NaN fail (a shared K and V with lone keys of 1270 reached it on sdpa-math)."""
    from faverify.judge.metrics import error_stats
    ref = torch.tensor([1.0, 108582.0, -2.0], dtype=torch.float64).reshape(1, 3, 1, 1)
    scales = {"dq": torch.tensor(1e5, dtype=torch.float64), "logit": torch.tensor(1.0, dtype=torch.float64)}

    def verdict(values):
        got = torch.tensor(values, dtype=torch.float16).reshape(1, 3, 1, 1)
        stats = error_stats({"dq": got}, {"dq": ref}, {"dq": ref.clone()}, scales, tensors=("dq",))
        return judge_tensor(stats["dq"], "fp16", Tolerance())
    for values in ([1.0, math.inf, -2.0], [1.0, 65504.0, -2.0]):
        assert verdict(values).passed, values
    for values in ([1.0, -math.inf, -2.0], [1.0, math.nan, -2.0], [math.inf, math.inf, -2.0]):
        assert not verdict(values).passed, values
