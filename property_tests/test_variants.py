"""Variant features: the Case fields, the FP64 reference against a brute-force formula, the contract, the
draw, and the planted bugs the fuzz must catch and shrink to a case that names the feature."""
import json
import math

import pytest
import torch

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs, variant_of
from faverify.cases.variant import Variant
from faverify.cases.vocabulary import MASK_FEATURES, VARIANT_FEATURES
from faverify.errors import UsageError
from faverify.judge.reference import reference
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, planted_bug_caught

DENSE_KEYS = {"batch", "seqlen_q", "seqlen_k", "nheads", "nheads_k", "head_dim", "dtype", "causal",
              "softmax_scale", "regime", "layout", "init", "seed"}


def test_a_dense_case_prints_as_before_and_a_variant_case_round_trips():
    dense = Case(1, 4, 5, 2, 1, 16, causal=True, seed=3)
    assert set(json.loads(dense.to_json())) == DENSE_KEYS and dense.features() == ()
    c = Case(1, 4, 5, 2, 1, 16, window=(3, 0), softcap=5.0, alibi="batch-head", sinks="above", head_dim_v=32)
    assert Case.from_json(c.to_json()) == c and c.features() == VARIANT_FEATURES
    assert "window=(3,0)" in c.short() and "dv=32" in c.short()


@pytest.mark.parametrize("field,value,rule", [
    ("window", (-2, 0), "the left bound must be an integer in -1.."),
    ("window", (0,), "must be [left, right]"),
    ("softcap", -1.0, "must be a number in [0, 1e+06]"),
    ("alibi", "yes", "must be one of off, head, batch-head, zero"),
    ("sinks", "big", "must be one of off, around, above, below"),
    ("head_dim_v", 513, "must be in 1..512"),
    ("head_dim_v", 0, "must be >= 1"),
])
def test_variant_fields_are_validated_with_the_rule(field, value, rule):
    with pytest.raises(UsageError) as e:
        Case(1, 4, 5, 1, 1, 16, **{field: value})
    assert e.value.argument == field and rule in str(e.value)


@pytest.mark.parametrize("sq,sk,causal,window", [(9, 4, False, (2, 0)), (9, 4, True, (-1, -1)), (5, 9, False, (1, 2)),
                                                 (9, 4, False, (-1, 1)), (9, 4, True, (0, 3)), (3, 3, False, (0, 0))])
def test_rows_that_see_no_key_are_the_first_ones(sq, sk, causal, window):
    c = Case(1, sq, sk, 1, 1, 8, causal=causal, window=window)
    empty = [i for i in range(sq) if c.visible_keys(i) == 0]
    assert empty == list(range(c.masked_rows))
    left, right = c.bounds
    for i in range(sq):  # against the mask written out
        d = i + sk - sq
        seen = [j for j in range(sk) if (left is None or j >= d - left) and (right is None or j <= d + right)]
        assert c.visible_keys(i) == len(seen)


def _brute_force(q, k, v, dout, case: Case, x):
    """The whole score matrix in float64 with every feature written out, the sink as one more column, and
    autograd for the gradients: an independent check of the chunked reference."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    sinks = x.sinks.detach().double().requires_grad_() if x.sinks is not None else None
    b, sq, h, d = q.shape
    sk, g = k.shape[1], h // k.shape[2]
    s = torch.einsum("bihd,bjhd->bhij", q, k.repeat_interleave(g, dim=2)) * case.scale
    if case.softcap:
        s = case.softcap * torch.tanh(s / case.softcap)
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    if x.alibi_slopes is not None:
        s = s - x.alibi_slopes.double().reshape(-1, h, 1, 1) * (i + sk - sq - j).abs()
    keep = torch.tensor([[case.visible_keys(r) > 0 and _sees(case, r, c) for c in range(sk)] for r in range(sq)])
    s = s.masked_fill(~keep, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.reshape(1, h, 1, 1).expand(b, h, sq, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    vv = v.repeat_interleave(g, dim=2)
    out = torch.einsum("bhij,bjhd->bihd", p[..., :sk], vv)
    wrt = (q, k, v) + ((sinks,) if sinks is not None else ())
    grads = torch.autograd.grad(out, wrt, dout.double())
    result = {"out": out, "lse": lse, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
    if sinks is not None:
        result["dsinks"] = grads[3]
    return result


def _sees(case, r, c):
    left, right = case.bounds
    d = r + case.seqlen_k - case.seqlen_q
    return (left is None or c >= d - left) and (right is None or c <= d + right)


@pytest.mark.parametrize("case", [
    Case(2, 7, 9, 4, 2, 8, dtype="fp32", window=(2, 1), seed=1),
    Case(1, 9, 4, 2, 2, 8, dtype="fp32", causal=True, window=(1, -1), sinks="around", seed=2),  # empty rows
    Case(2, 6, 6, 2, 1, 8, dtype="fp32", softcap=0.7, alibi="batch-head", seed=3),
    Case(1, 5, 8, 2, 2, 8, dtype="fp32", alibi="head", sinks="above", head_dim_v=12, seed=4),
    Case(1, 5, 3, 2, 2, 8, dtype="fp32", softcap=2.0, sinks="below", causal=True, head_dim_v=4, seed=5),
])
def test_the_reference_matches_the_brute_force_formula(case):
    x = make_inputs(case, "cpu")
    ref, scales = reference(*(t.double() for t in x.tensors()), x.dout.double(), causal=case.causal,
                            scale=case.scale, variant=variant_of(case, x))
    want = _brute_force(*x.tensors(), x.dout, case, x)
    assert set(ref) == set(want) and ("dsinks" in ref) == (case.sinks != "off")
    for name, t in want.items():
        torch.testing.assert_close(ref[name], t, rtol=1e-10, atol=1e-12, msg=name)
    if case.masked_rows:
        assert (ref["out"][:, :case.masked_rows] == 0).all()
        assert torch.allclose(ref["lse"][:, :, 0], x.sinks.double().expand_as(ref["lse"][:, :, 0]))


def test_a_dense_case_gives_the_same_reference_bits_with_and_without_the_variant_path():
    c = Case(2, 17, 23, 4, 2, 16, dtype="bf16", causal=True, seed=7)
    x = make_inputs(c, "cpu")
    args = (*(t.double() for t in x.tensors()), x.dout.double())
    plain, _ = reference(*args, causal=True, scale=c.scale)
    through, _ = reference(*args, causal=True, scale=c.scale, variant=Variant(right=0))
    for name in plain:
        assert torch.equal(plain[name], through[name]), name


def test_keywords_are_passed_only_for_the_features_a_case_uses():
    seen = []

    def fn(q, k, v, *, causal, softmax_scale, **kwargs):
        seen.append(sorted(kwargs))
        return resolve("sdpa-math").fn(q, k, v, causal=causal, softmax_scale=softmax_scale, **kwargs)
    from faverify.subjects.base import Capabilities, Subject
    s = Subject("recorder", fn, Capabilities.of(window=True, softcap=True, alibi=True, sinks=True, head_dim_v=True))
    for c in (Case(1, 4, 4, 1, 1, 8), Case(1, 4, 4, 1, 1, 8, window=(1, 0)),
              Case(1, 4, 4, 1, 1, 8, softcap=3.0, alibi="head", sinks="around")):
        assert evaluate(s, c, "cpu").status == "pass"
    assert seen == [[], ["window_size"], ["alibi_slopes", "sinks", "softcap"]]
    dense_only = Subject("dense", fn, Capabilities.of())
    r = evaluate(dense_only, Case(1, 4, 4, 1, 1, 8, sinks="above", head_dim_v=4), "cpu")
    assert r.status == "skip" and "sinks, head_dim_v not declared by the subject" in r.reason


def test_a_declared_feature_without_its_keyword_is_exit_2_before_any_case():
    r = cli("fuzz", "--kernel", "property_tests.planted:declares_window_without_keyword", "--iters", "3",
            "--device", "cpu", "--no-db")
    assert r.exit_code == 2 and "window_size" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("text,needle", [("window,bogus", "--features='bogus'"), (",", "--features=','"),
                                         ("none,window", "--features='none'")])
def test_bad_features_are_exit_2(text, needle):
    r = cli("fuzz", "--kernel", "sdpa-math", "--features", text, "--iters", "2", "--device", "cpu", "--no-db")
    assert r.exit_code == 2 and needle in r.stderr


def test_the_fuzz_draws_every_declared_feature_and_counts_them(tmp_path):
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "60", "--device", "cpu", "--no-db", "--no-isolate",
            "--dtype", "fp32,bf16", "--json", tmp_path / "run.json")
    assert r.exit_code == 0, r.stdout[-2000:]
    summary = json.loads((tmp_path / "run.json").read_text())["kernels"][0]["summary"]
    counted = summary["features"]
    # masks and biases (dense cases only) have their own test with more cases: test_masks.py
    ragged_and_variants = set(resolve("sdpa-math").caps.features()) - set(MASK_FEATURES)
    assert ragged_and_variants <= set(counted) and "cases per feature" in r.stdout + r.stderr
    assert {f: v["cases"] for f, v in summary["by_feature"].items()} == counted  # none skipped here
    # "nan" where each of a feature's cases had nothing to err on (a mask that hides every key: out is 0)
    assert all(v["failed"] == 0 and (v["usage_max"] == "nan" or 0 <= v["usage_max"] <= 1)
               for v in summary["by_feature"].values()), summary["by_feature"]
    assert "By variant feature" in r.stdout + r.stderr
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "20", "--device", "cpu", "--no-db", "--no-isolate",
            "--features", "none", "--json", tmp_path / "dense.json")
    assert r.exit_code == 0
    assert json.loads((tmp_path / "dense.json").read_text())["kernels"][0]["summary"]["features"] == {"dense": 20}


@pytest.mark.slow
@pytest.mark.parametrize("bug,feature,signature", [
    ("window_off_by_one", "window", "out:tolerance"),
    ("softcap_before_scale", "softcap", "out:tolerance"),
    ("alibi_no_offset", "alibi", "out:tolerance"),
    ("sink_not_in_lse", "sinks", "lse:"),
    ("sink_no_grad", "sinks", "dsinks:tolerance"),
    ("off_by_one_unshifted", "sinks", "out:"),
])
def test_a_planted_bug_per_feature_is_caught_and_shrunk_to_a_case_that_names_it(bug, feature, signature, tmp_path):
    """The control (variant_correct) passes the same draw: without the feature in the reference it would
    fail too, so each planted bug is caught by its feature's check."""
    record, mine, args = planted_bug_caught(f"property_tests.planted:{bug}", feature, 80, tmp_path,
                                            lambda s: s.startswith(signature))
    by_feature = record["summary"]["by_feature"]
    assert by_feature[feature]["failed"] > 0 and by_feature.get("dense", {"failed": 0})["failed"] == 0
    minimal = Case.from_dict(mine[0]["minimal"]["case"])
    assert feature in minimal.features() and minimal.seqlen_q * minimal.seqlen_k <= 16
    if bug == "off_by_one_unshifted":  # only the fixed sink takes the planted path
        assert minimal.sinks == "zero", minimal
    control = cli("fuzz", "--kernel", "property_tests.planted:variant_correct", *args)
    assert control.exit_code == 0, control.stdout[-2000:]


@pytest.mark.parametrize("bug,signature", [("dlse_ignored", "dq:"), ("dlse_into_dout", "dv:")])
def test_a_planted_bug_of_the_lse_gradient_is_caught_and_its_control_passes(bug, signature, tmp_path):
    """A loss on lse (lse_grad): dlse dropped fails dq; dlse folded into dO fails dv, exactly 0 where the loss
    is on lse alone. Each minimal case names the feature; the control passes the same draw."""
    record, mine, args = planted_bug_caught(f"property_tests.planted:{bug}", "lse_grad", 150, tmp_path,
                                            lambda s: s.startswith(signature))
    assert record["summary"]["by_feature"]["lse_grad"]["failed"] > 0
    minimal = Case.from_dict(mine[0]["minimal"]["case"])
    assert "lse_grad" in minimal.features(), minimal
    if bug == "dlse_into_dout":  # dv is off wherever dlse is; on lse alone it must be exactly 0
        assert "dv:" in mine[0]["minimal"]["reason"], mine[0]["minimal"]["reason"]
    control = cli("fuzz", "--kernel", "property_tests.planted:lse_grad_correct", *args)
    assert control.exit_code == 0, control.stdout[-2000:]


@pytest.mark.parametrize("kernel,features,case", [
    ("lse_base2", "none", Case(1, 9, 5, 2, 2, 16, dtype="fp32", causal=True, seed=1)),
    ("causal_top_left", "none", Case(1, 5, 9, 2, 2, 16, dtype="fp32", causal=True, seed=1)),
    ("empty_rows_lse_plus_inf", "none", Case(1, 9, 5, 2, 2, 16, dtype="fp32", causal=True, seed=1)),
    ("alibi_relative", "alibi", Case(1, 6, 11, 2, 2, 16, dtype="fp32", alibi="head", seed=2)),
])
def test_a_subject_passes_under_the_conventions_it_declares(kernel, features, case):
    """Each of these fails under the default conventions (flash-attn's): the reference follows the
    declaration, and the report says what it judged by."""
    from faverify.subjects.base import Capabilities, Subject
    declared = resolve(f"property_tests.planted:{kernel}")
    default = Subject("default", declared.fn, Capabilities.of(**{**declared.caps.to_dict(),
                                                              "conventions": "flash-attn-3"}))
    assert evaluate(declared, case, "cpu", mode="fwd").status == "pass"
    assert evaluate(default, case, "cpu", mode="fwd").status == "fail"
    r = cli("fuzz", "--kernel", f"property_tests.planted:{kernel}", "--iters", "25", "--device", "cpu", "--no-db",
            "--no-isolate", "--dtype", "fp32", "--mode", "fwd", "--features", features)
    assert r.exit_code == 0 and f"{kernel}: {declared.caps.conventions.describe()}" in r.stdout + r.stderr


def test_an_lse_in_the_other_base_is_named_as_such():
    r = evaluate(resolve("property_tests.planted:with_lse"), Case(1, 8, 8, 2, 2, 16, dtype="fp32"), "cpu", mode="fwd")
    assert r.status == "fail" and "lse is right in base 2: the subject declares base e" in r.reason


@pytest.mark.parametrize("declared,message", [
    ("flash-attn-9", "conventions preset 'flash-attn-9' is unknown"),
    ({"lse_base": "10"}, "conventions.lse_base must be one of e, 2"),
    ({"align": "top"}, "conventions has unknown keys ['align']"),
])
def test_conventions_that_are_not_valid_are_refused_when_the_subject_loads(declared, message):
    from faverify.subjects.base import Capabilities
    with pytest.raises(ValueError) as e:
        Capabilities.of(conventions=declared)
    assert message in str(e.value)


@pytest.mark.slow
def test_flex_runs_the_variants_it_declares_forward_only_on_the_cpu():
    """torch's FlexAttention: compiled once per shape on the CPU (and not again for new softcap, slopes or
    window values), the compile reported as its own phase; the forward alone is judged, and each case
    says so."""
    if torch.cuda.is_available():
        pytest.skip("the CPU's forward-only path; the GPU runs belong to the GPU tests")
    flex = resolve("flex")
    assert set(flex.caps.features()) == {"window", "softcap", "alibi", "head_dim_v", "varlen", "paged", "mask",
                                         "score_mod"}
    results = [evaluate(flex, c, "cpu") for c in (
        Case(1, 40, 24, 2, 1, 32, dtype="bf16", causal=True, window=(5, -1), seed=1),  # rows that see no key
        Case(2, 33, 47, 2, 2, 32, dtype="bf16", softcap=2.0, alibi="batch-head", seed=2),
        Case(2, 33, 47, 2, 2, 32, dtype="bf16", softcap=7.0, alibi="batch-head", window=(3, 4), seed=3),
        # the case's own mask_mod (per batch element) and score_mod, compiled as the reference applies them
        Case.of(2, 33, 47, 2, 2, 32, dtype="bf16", mask="padding", mask_lengths=[[20, 1], [33, 40]], mask_shape="heads",
                score_mod="relative", seed=4))]
    assert [r.status for r in results] == ["pass"] * 4, [r.reason for r in results]
    assert all(r.reason.startswith("forward only") and set(r.metrics) == {"out"} for r in results)
    assert results[0].phases.get("compile", 0) > 0 and "compile" not in results[2].phases
    skipped = evaluate(flex, Case(1, 4, 4, 1, 1, 32, sinks="around"), "cpu")
    assert skipped.status == "skip" and "sinks not declared" in skipped.reason


def test_sdpa_math_keeps_the_softcap_slope_where_the_cap_saturates():
    """sdpa-math's softcap goes through its float mask with the derivative sech^2 (subjects/sdpa._Capped):
    autograd's 1 - tanh^2 is 0 where fp32's tanh rounds to 1, which lost dq and dk of about 3e-33 on this
    case (3.6x the bf16 baseline's error, drawn by a parallel fuzz of 200 cases)."""
    case = Case(1, 1, 93, 3, 3, 96, dtype="bf16", softmax_scale=2.0, regime="large", seed=6, softcap=5.0)
    r = evaluate(resolve("sdpa-math"), case, "cpu")
    assert r.status == "pass", r.reason
    assert r.metrics["dq"].max_abs < r.metrics["dq"].baseline_max_abs / 10, r.metrics["dq"]


def test_the_golden_cases_of_a_loss_on_lse_fail_a_backward_that_ignores_dlse():
    """The stored FP64 gradients of the lse_grad cases (their dlse comes from the seed, not the file)."""
    names = "lse-grad-masked-rows,lse-grad-alone-sinks,sinks-off-by-one"
    ignored = cli("golden", "verify", "--kernel", "property_tests.planted:dlse_ignored", "--only", names,
                  "--device", "cpu", "--no-isolate")
    assert ignored.exit_code == 1 and "1 of 3 golden cases pass, 2 fail" in ignored.output, ignored.output
    right = cli("golden", "verify", "--kernel", "property_tests.planted:lse_grad_correct", "--only", names,
                "--device", "cpu", "--no-isolate")
    assert right.exit_code == 0 and "3 of 3 golden cases pass" in right.output, right.output


def test_a_max_logit_over_masked_keys_is_caught_and_the_declared_shapes_pass(tmp_path):
    """The largest logit each row sees (return_max_logit=True): one taken over the masked keys too fails
    with a minimal case that asks for it; per row (the default) and per head (declared) both pass."""
    record, mine, args = planted_bug_caught("property_tests.planted:max_logit_unmasked", "max_logit,window", 150,
                                            tmp_path, lambda s: s.startswith("max_logit:"))
    minimal = Case.from_dict(mine[0]["minimal"]["case"])
    assert minimal.max_logit and (minimal.causal or minimal.window != (-1, -1)), minimal
    for control in ("max_logit_correct", "max_logit_per_head"):
        r = cli("fuzz", "--kernel", f"property_tests.planted:{control}", *args)
        assert r.exit_code == 0, r.stdout[-2000:]
    from faverify.subjects.base import Capabilities, Subject
    declared = resolve("property_tests.planted:max_logit_per_head")
    rows = Subject("rows", declared.fn, Capabilities.of(**{**declared.caps.to_dict(), "conventions": "flash-attn-3"}))
    case = Case(2, 5, 7, 2, 1, 16, dtype="fp32", max_logit=True, seed=3)
    assert evaluate(declared, case, "cpu", mode="fwd").status == "pass"
    r = evaluate(rows, case, "cpu", mode="fwd")
    assert r.status == "fail" and "max_logit has shape (2,), expected (2, 2, 5)" in r.reason, r.reason


def test_a_shared_kv_read_from_the_wrong_columns_is_caught_and_its_control_passes(tmp_path):
    """v as k's leading columns in k's storage (kv_shared; MLA's 576 beside 512 among the draws): a kernel
    that reads the trailing columns instead fails with a minimal case that shares them, v narrower than k;
    the control, reading the leading ones, passes the same draw."""
    record, mine, args = planted_bug_caught("property_tests.planted:shared_kv_reads_tail", "kv_shared,head_dim_v",
                                            150, tmp_path, lambda s: s.startswith(("out:", "dv:", "dk:")))
    minimal = Case.from_dict(mine[0]["minimal"]["case"])
    assert minimal.kv_shared and minimal.dv < minimal.head_dim, minimal
    control = cli("fuzz", "--kernel", "property_tests.planted:shared_kv_correct", *args)
    assert control.exit_code == 0, control.stdout[-2000:]


def test_a_shared_kv_case_gives_v_in_ks_storage_with_gradients_apart():
    """v is k[..., :dv] in k's own memory, in every layout; dk and dv are judged apart (v a leaf of its own)."""
    for layout in ("contiguous", "strided", "broadcast", "packed"):
        case = Case(1, 8, 8, 2, 1, 64, dtype="fp32", head_dim_v=48, kv_shared=True, layout=layout, seed=5)
        x = make_inputs(case, "cpu", requires_grad=True)
        assert x.v.data_ptr() == x.k.data_ptr() and x.v.stride() == x.k.stride(), layout
        assert torch.equal(x.v, x.k[..., :48]) and x.v.is_leaf and x.v.requires_grad
        result = evaluate(resolve("sdpa-math"), case, "cpu")
        assert result.status == "pass" and {"dk", "dv"} <= set(result.metrics), result.reason
    with pytest.raises(UsageError, match="head_dim_v <= head_dim"):
        Case(1, 8, 8, 2, 1, 32, head_dim_v=48, kv_shared=True)


def test_a_fixed_sink_written_in_place_is_caught_and_named(tmp_path):
    """The off-by-one sink given a gradient: a kernel that steps the fixed sink's logit in the caller's buffer
    returns the right out, and leaves the next call another sink. The inputs beside q, k, v are checked for
    changes too: it fails as sinks:modified on a case with the off-by-one sink."""
    record, mine, args = planted_bug_caught("property_tests.planted:off_by_one_sink_given_a_gradient", "sinks",
                                            150, tmp_path, lambda s: s == "sinks:modified")
    minimal = Case.from_dict(mine[0]["minimal"]["case"])
    assert minimal.sinks == "zero", minimal
    control = cli("fuzz", "--kernel", "property_tests.planted:variant_correct", *args)
    assert control.exit_code == 0, control.stdout[-2000:]
