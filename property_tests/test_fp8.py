"""FP8 inputs: e4m3 q, k, v with their descales, judged against FP64 on the values they stand for, under a
tolerance set by the naive attention with FP8 numerics (judge/fp8.py)."""
import dataclasses
import re

import pytest
import torch

from faverify.cases.case import Case
from faverify.cases.fp8 import dequantized
from faverify.cases.inputs import make_inputs
from faverify.cases.strategies import CPU_LIMITS
from faverify.cases.vocabulary import FP8_BLOCK, FP8_OWN_REGIMES
from faverify.errors import UsageError
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json

PLANTED = "property_tests.planted_fp8"
TAIL = Case.of(1, 5, 1500, 2, 1, 64, dtype="bf16", fp8="tensor", regime="tail-mass", causal=True, seed=2)
PLAIN = Case.of(2, 9, 13, 4, 2, 16, dtype="bf16", fp8="head", seed=1)


@pytest.mark.parametrize("granularity", ["tensor", "head"])
def test_inputs_are_e4m3_scaled_onto_its_range_and_dequantize_exactly(granularity):
    case = PLAIN.replace(fp8=granularity, layout="transposed")
    x = make_inputs(case, "cpu")
    assert x.q.dtype == x.k.dtype == x.v.dtype == torch.float8_e4m3fn and x.dout.dtype == torch.bfloat16
    assert x.q_descale.shape == (case.batch, case.nheads_k) and x.q_descale.dtype == torch.float32
    for t, d in ((x.q, x.q_descale), (x.k, x.k_descale), (x.v, x.v_descale)):
        wide = dequantized(t, d)
        assert torch.equal(wide / d.double().repeat_interleave(t.shape[2] // d.shape[1], 1)[:, None, :, None],
                           t.double())  # the product is exact in FP64
        b, n, h, d = t.shape
        blocks = t.double().abs().reshape(b, n, case.nheads_k, h // case.nheads_k, d)  # q's heads by kv head
        top = blocks.amax() if granularity == "tensor" else blocks.amax(dim=(1, 3, 4))
        assert torch.all(top == 448.0)  # the largest magnitude of each scaled block is e4m3's largest


def test_a_case_fp8_cannot_mean_is_refused():
    for bad, field in ((dict(dtype="fp16"), "dtype"), (dict(window=(2, 0)), "fp8"), (dict(fp8="page"), "fp8")):
        with pytest.raises(UsageError, match=field):
            PLAIN.replace(**bad)
    for regime in FP8_OWN_REGIMES:
        with pytest.raises(UsageError, match="regime"):
            Case(1, 4, 4, 1, 1, 8, regime=regime)


def test_the_draw_makes_fp8_cases_of_each_granularity_and_fp8s_own_regimes():
    """Beside other features FP8 takes the cases their mix leaves plain (the other features keep their
    shares): a tenth of sdpa-math's 200; alone, most of them."""
    from faverify.run.draw import draw_cases
    from faverify.run.plan import FuzzPlan
    caps = resolve("sdpa-math").caps
    plan = FuzzPlan(iters=200, seed=0, dtypes=("bf16", "fp16"), limits=CPU_LIMITS, database=None,
                    features=caps.features(), narrow=caps.draw())
    drawn = draw_cases(plan)
    fp8 = [c for c in drawn if c.fp8 is not None]
    assert 10 <= len(fp8) <= 40 and {c.fp8.granularity for c in fp8} == {"tensor", "head", "block"}, len(fp8)
    assert all(c.features() == ("fp8",) and c.dtype == "bf16" for c in fp8)
    alone = draw_cases(dataclasses.replace(plan, features=("fp8",), iters=60))
    assert sum(c.fp8 is not None for c in alone) > 30 and "tail-mass" in {c.regime for c in alone}
    narrowed = draw_cases(dataclasses.replace(plan, features=("fp8",), iters=60,
                                              narrow={**caps.draw(), "regimes": ("normal",)}))
    # --regimes holds for FP8 cases too; tail-mass, limits and block-spread are FP8's own
    assert {c.regime for c in narrowed if c.fp8 is not None} == {"normal", *FP8_OWN_REGIMES}


BLOCK = Case.of(2, 20, 70, 4, 2, 64, dtype="bf16", fp8="block", regime="block-spread", seed=3)
LIMITS = Case.of(2, 20, 70, 4, 2, 64, dtype="bf16", fp8="tensor", regime="limits", seed=3)
# each planted bug's status on (TAIL, PLAIN, BLOCK, LIMITS), beside its control's
BUGS = {"fp8_right": "pppp", "fp8_p_unscaled": "fppp", "fp8_v_descale_ignored": "ffff",
        "fp8_q_descale_twice": "ffff", "fp8_k_descale_ignored": "ffff", "fp8_tail_dropped": "fppp",
        "fp8_block_scales_read_per_head": "ppfp", "fp8_p_scale_of_first_block": "ppff", "fp8_fp16_logits": "ffff"}


@pytest.mark.parametrize("name", BUGS)
def test_each_fp8_bug_fails_where_it_shows_and_its_control_passes(name):
    """P quantized without its scale, or its small weights dropped, loses the tail: only the tail-mass regime
    shows it (its keys' weights, 2^-10 each, carry 0.59 of the output together). Block scales read per head
    show on blocks whose scales differ; P scaled by the first block's max where a later block holds it."""
    s = resolve(f"{PLANTED}:{name}")
    got = "".join(evaluate(s, c, "cpu").status[0] for c in (TAIL, PLAIN, BLOCK, LIMITS))
    assert got == BUGS[name]


def test_block_descales_are_per_block_of_keys_and_the_fp8_regimes_reach_their_ends():
    """k's and v's descales per FP8_BLOCK keys, each block's largest magnitude on 448; block-spread's blocks
    2^10 apart, smaller first; limits' elements at 448 and among the subnormals (below 2^-6)."""
    x = make_inputs(BLOCK, "cpu")
    blocks = -(-BLOCK.seqlen_k // FP8_BLOCK)
    assert x.q_descale.shape == (2, 2) and x.k_descale.shape == x.v_descale.shape == (2, 2, blocks)
    for t, d in ((x.k, x.k_descale), (x.v, x.v_descale)):
        padded = torch.nn.functional.pad(t.double().abs(), (0, 0, 0, 0, 0, blocks * FP8_BLOCK - t.shape[1]))
        assert torch.all(padded.reshape(2, blocks, FP8_BLOCK, 2, -1).amax(dim=(2, 4)) == 448.0)
        wide = dequantized(t, d)
        assert torch.equal(wide[:, :FP8_BLOCK] / d[:, None, :, :1].double(), t[:, :FP8_BLOCK].double())
        ratio = d[..., 1] / d[..., 0]
        assert torch.all((ratio > 2.0**7) & (ratio < 2.0**13)), ratio
    x = make_inputs(LIMITS, "cpu")
    for t in (x.q, x.k, x.v):
        mags = t.double().abs()
        assert (mags == 448.0).any() and ((mags > 0) & (mags < 2.0**-6)).any()


@pytest.mark.parametrize("name", BUGS)
def test_each_fp8_bug_fails_a_150_case_fuzz_with_a_minimal_case_naming_its_scales(name):
    """And the control passes the same 150 cases."""
    r = cli("fuzz", "--kernel", f"{PLANTED}:{name}", "--dtype", "fp8", "--iters", "150", "--device", "cpu",
            "--no-db")
    if name == "fp8_right":
        assert r.exit_code == 0, r.stderr
        return
    assert r.exit_code == 1, r.stderr
    assert re.search(r"minimal case: .* fp8 e4m3 descale per (tensor|head|block)", r.stdout), r.stdout


@pytest.mark.parametrize("seed", [1, 2, 6])
def test_the_fp8_tensor_cores_accumulator_is_in_the_model(seed, monkeypatch):
    """Hopper's FP8 tensor cores keep about 14 bits of q k^T's sum. A kernel that sums so passes at large
    logits (the weights there are what its logits give, out held to its values' hull); judged as if it summed
    in fp32 (flash_bound.FP32_DOT), the same outputs fail."""
    import faverify.judge.judging as judging
    from faverify.judge.flash_bound import FP32_DOT
    s = resolve(f"{PLANTED}:fp8_hopper_accumulator")
    case = Case.of(1, 64, 256, 2, 1, 64, dtype="bf16", regime="large", fp8="head", seed=seed, causal=seed % 2 == 0)
    assert evaluate(s, case, "cpu", mode="fwd").status == "pass"
    monkeypatch.setattr(judging, "FP8_DOT", FP32_DOT)
    assert evaluate(s, case, "cpu", mode="fwd").signatures == ["out:tolerance"]


def test_an_fp8_kernels_out_leaves_its_values_hull_by_its_quantized_weights(monkeypatch):
    """Where the logits do not determine the weights, out is held to its values' hull. An FP8 kernel divides
    P quantized to e4m3 by l from the unrounded weights, as flash-attn 3 does: its weights sum to 1 within
    e4m3's 2^-4 only, and out may leave the hull by that share. Without it the control fails."""
    import faverify.judge.fp8 as fp8
    case = Case.of(2, 97, 105, 4, 2, 128, dtype="bf16", regime="large", fp8="head", seed=23, causal=True,
                   layout="spread")
    s = resolve(f"{PLANTED}:fp8_right")
    assert evaluate(s, case, "cpu", mode="fwd").status == "pass"
    monkeypatch.setattr(fp8, "P_UNIT", {"e4m3": 0.0, "e5m2": 0.0})
    r = evaluate(s, case, "cpu", mode="fwd")
    assert r.status == "fail" and "outside the least and largest values" in r.reason, r.reason


def test_a_subject_without_the_granularity_skips_the_case_with_the_reason():
    r = evaluate(resolve(f"{PLANTED}:fp8_per_tensor_only"), PLAIN, "cpu")
    assert r.status == "skip" and "per head not taken" in r.reason
    r = evaluate(resolve("property_tests.planted:correct"), PLAIN, "cpu")
    assert r.status == "skip" and "fp8 not declared" in r.reason


def test_sdpa_math_passes_dtype_fp8_and_the_report_counts_formats_granularities_and_regimes(tmp_path):
    r = cli("fuzz", "--kernel", "sdpa-math", "--dtype", "fp8", "--iters", "200", "--device", "cpu", "--no-db",
            "--json", tmp_path / "run.json", "--markdown", tmp_path / "run.md")
    assert r.exit_code == 0, r.stderr
    summary = read_json(tmp_path / "run.json")["kernels"][0]["summary"]
    assert summary["features"] == {"fp8": 200}
    keys = {tuple(k.split(" ")) for k in summary["fp8"]}
    assert {k[0] for k in keys} == {"e4m3", "e5m2"} and {k[1] for k in keys} == {"tensor", "head", "block"}
    assert {"normal", *FP8_OWN_REGIMES} <= {k[2] for k in keys}
    assert sum(v["cases"] for v in summary["fp8"].values()) == 200
    table = (tmp_path / "run.md").read_text().split("FP8 cases run by format")[1]
    assert re.search(r"\| sdpa-math \| e4m3 +\| block +\|", table), table[:800]
    r = cli("fuzz", "--kernel", f"{PLANTED}:fp8_p_unscaled", "--iters", "100", "--dtype", "bf16", "--device", "cpu",
            "--no-db")
    assert r.exit_code == 1 and "tail-mass" in r.stdout, r.stdout


@pytest.mark.parametrize("args, named", [(("--kernel", "sdpa-math", "--dtype", "fp8,bf16"), "--dtype"),
                                         (("--kernel", "sdpa-flash", "--dtype", "fp8"), "--dtype"),
                                         (("--kernel", "sdpa-math", "--dtype", "fp8", "--features", "window"),
                                          "--features")])
def test_dtype_fp8_given_as_it_cannot_be_is_a_usage_error(args, named):
    r = cli("fuzz", *args, "--iters", "5", "--device", "cpu", "--no-db")
    assert r.exit_code == 2 and named in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_e5m2_inputs_reach_their_range_and_a_kernel_reading_them_as_e4m3_fails():
    """e5m2 (3 more bits of range, 2 less of precision): each scaled block's largest magnitude is 57344 and
    dequantizes exactly; the control passes e5m2 and e4m3 cases, a kernel that reads e5m2 bits as e4m3 fails
    the e5m2 ones only, and a subject that takes e4m3 alone skips them, naming the format."""
    case = PLAIN.replace(fp8_format="e5m2")
    x = make_inputs(case, "cpu")
    assert x.q.dtype == x.k.dtype == x.v.dtype == torch.float8_e5m2
    for t, d in ((x.q, x.q_descale), (x.k, x.k_descale), (x.v, x.v_descale)):
        b, n, h, e = t.shape
        assert torch.all(t.double().abs().reshape(b, n, case.nheads_k, -1).amax(dim=(1, 3)) == 57344.0)
        assert torch.equal(dequantized(t, d) / d.double().repeat_interleave(h // d.shape[1], 1)[:, None, :, None],
                           t.double())
    tail = TAIL.replace(fp8_format="e5m2")
    assert [evaluate(resolve(f"{PLANTED}:fp8_right"), c, "cpu").status for c in (case, tail, PLAIN)] == ["pass"] * 3
    wrong = resolve(f"{PLANTED}:fp8_e5m2_read_as_e4m3")
    assert [evaluate(wrong, c, "cpu").status for c in (case, PLAIN)] == ["fail", "pass"]
    r = evaluate(resolve(f"{PLANTED}:fp8_per_tensor_only"), case.replace(fp8="tensor"), "cpu")
    assert r.status == "skip" and "format e5m2 not taken" in r.reason, r.reason
    with pytest.raises(UsageError, match="fp8_format"):
        Case.of(1, 4, 4, 1, 1, 8, fp8_format="e5m2")


def test_sdpa_math_draws_both_fp8_formats():
    from faverify.run.draw import draw_cases
    from faverify.run.plan import FuzzPlan
    caps = resolve("sdpa-math").caps
    plan = FuzzPlan(iters=100, seed=0, dtypes=("bf16",), limits=CPU_LIMITS, database=None, narrow=caps.draw(),
                    features=("fp8",))
    assert {c.fp8.format for c in draw_cases(plan) if c.fp8 is not None} == {"e4m3", "e5m2"}
