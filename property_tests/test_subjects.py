import pytest

from faverify.cases.case import Case
from faverify.errors import UsageError
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve


def test_sdpa_math_passes_odd_shapes_on_cpu():
    s = resolve("sdpa-math")
    for case in (Case(2, 17, 33, 4, 2, 40, "bf16", True, seed=1),
                 Case(1, 65, 17, 2, 1, 72, "fp16", True, layout="packed", regime="outliers", seed=2),
                 Case(1, 1, 1, 1, 1, 16, "fp32", layout="strided")):
        r = evaluate(s, case, "cpu")
        assert r.status == "pass", r.reason
        assert set(r.metrics) == {"out", "dq", "dk", "dv"}  # sdpa gives no lse


def test_gpu_only_backends_skip_on_cpu_with_the_reason():
    r = evaluate(resolve("sdpa-flash"), Case(1, 4, 4, 1, 1, 16), "cpu")
    assert r.status == "skip" and "device cpu not supported" in r.reason


@pytest.mark.parametrize("message", ["No available kernel.  Aborting execution.",
                                     "No viable backend for scaled_dot_product_attention was found."])
def test_sdpa_refusals_skip_with_torchs_reasons(monkeypatch, message):
    """torch refuses a case with "No available kernel" (CUDA) or "No viable backend" (elsewhere, newer torch)
    and says why in warnings: a skip with those reasons, shape details left out. Anything else it raises
    is the subject's failure."""
    import warnings

    import torch
    import torch.nn.functional as F

    from faverify.errors import Unsupported

    def refuse(error):
        def sdpa(*args, **kwargs):
            warnings.warn("Flash attention kernel not used because:")
            warnings.warn("Flash attention requires q,k,v to have the same last dimension and to be divisible "
                          "by 8. Got Query.size(-1): 72, Key.size(-1): 72, Value.size(-1): 72 instead.")
            warnings.warn("Lower right causal bias will produce NaNs in the output when seq_len_q > seq_len_kv")
            raise RuntimeError(error)
        return sdpa

    flash = resolve("sdpa-flash")
    q, k = torch.zeros(1, 4, 2, 72), torch.zeros(1, 2, 2, 72)
    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse(message))
    with pytest.raises(Unsupported) as e:
        flash.fn(q, k, k, causal=True, softmax_scale=0.1)
    assert str(e.value) == ("sdpa-flash: no available kernel for this case: Flash attention requires q,k,v to "
                            "have the same last dimension and to be divisible by 8")
    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse("CUDA error: an illegal memory access"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        flash.fn(q, k, k, causal=True, softmax_scale=0.1)


def test_sdpa_skip_reasons_leave_out_shapes_locations_and_disabled_backends():
    """The warnings torch 2.11 gave on the H200 when sdpa-efficient refused cases (2026-11-30): two cases of
    different shapes give the same reason, so the skip table has one row for them."""
    from faverify.subjects.sdpa import _why

    class W:
        def __init__(self, message):
            self.message = message

    def warned(q, k):
        return [W("Memory efficient kernel not used because:"),
                W(f"For dense input, both fused kernels require query, key and value to have the same num_heads. "
                  f"Query.sizes(): {q}, Key sizes(): {k}, Value sizes(): {k} instead. To broadcast dense inputs, "
                  f"try using unsqueeze and expand_to before passing them into the kernel. (Triggered internally "
                  f"at /pytorch/aten/src/ATen/native/transformers/sdp_utils_cpp.h:540.)"),
                W("Flash attention has been runtime disabled. (Triggered internally at /pytorch/aten/src/ATen/"
                  "native/transformers/sdp_utils_cpp.h:540.); cuDNN attention has been runtime disabled.")]

    first, second = _why(warned([1, 8, 1, 16], [1, 1, 1, 16])), _why(warned([1, 2, 2048, 16], [1, 1, 2048, 16]))
    assert first == second == ("For dense input, both fused kernels require query, key and value to have the same "
                               "num_heads. Query.sizes(): [...], Key sizes(): [...], Value sizes(): [...] instead. "
                               "To broadcast dense inputs, try using unsqueeze and expand_to before passing them "
                               "into the kernel")


@pytest.mark.parametrize("spec,message", [
    ("nosuch_module_xyz:fn", "cannot import module"),
    ("property_tests.planted:nosuch", "has no callable"),
    ("bogus", "unknown kernel"),
])
def test_bad_kernel_names(spec, message):
    with pytest.raises(UsageError) as e:
        resolve(spec)
    assert e.value.argument == "--kernel" and message in str(e.value)


def test_exceptions_skip_or_fail_by_type():
    crash = resolve("property_tests.planted:raises_type_error")
    r = evaluate(crash, Case(1, 4, 4, 1, 1, 16, causal=True), "cpu")
    assert r.status == "fail" and "TypeError: planted crash" in r.reason and r.signatures == ["error:TypeError"]
    decline = resolve("property_tests.planted:declines_fp32")
    r = evaluate(decline, Case(1, 4, 4, 1, 1, 16, dtype="fp32"), "cpu")
    assert r.status == "skip" and "fp32 is not implemented" in r.reason


def test_contract_violations_are_failures(tmp_path, monkeypatch):
    (tmp_path / "shapes.py").write_text(
        "import torch\n"
        "def wrong_dtype(q, k, v, *, causal, softmax_scale):\n"
        "    return q.float()\n"
        "def wrong_lse(q, k, v, *, causal, softmax_scale):\n"
        "    return q.clone(), torch.zeros(3)\n"
        "def declared(q, k, v, *, causal, softmax_scale):\n"
        "    return q.clone()\n"
        "declared.faverify_capabilities = {'dtypes': ['fp16'], 'gqa': False}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = evaluate(resolve("shapes:wrong_dtype"), Case(1, 4, 4, 1, 1, 16, dtype="bf16"), "cpu", mode="fwd")
    assert r.status == "fail" and "expected the input dtype" in r.reason
    r = evaluate(resolve("shapes:wrong_lse"), Case(1, 4, 4, 1, 1, 16), "cpu", mode="fwd")
    assert r.status == "fail" and "lse has shape" in r.reason
    declared = resolve("shapes:declared")
    assert evaluate(declared, Case(1, 4, 4, 1, 1, 16, dtype="bf16"), "cpu").reason.startswith("dtype bf16")
    assert "GQA" in evaluate(declared, Case(1, 4, 4, 2, 1, 16, dtype="fp16"), "cpu").reason


def test_modes_select_tensors():
    s = resolve("property_tests.planted:with_lse")
    c = Case(1, 8, 8, 2, 2, 16, seed=3)
    assert set(evaluate(s, c, "cpu", mode="fwd").metrics) == {"out", "lse"}
    assert set(evaluate(s, c, "cpu", mode="bwd").metrics) == {"dq", "dk", "dv"}


def test_a_subject_hands_over_what_its_calls_did_since_the_last_take_in_one_value():
    """Subject.take: the code paths, the compiles and the compile seconds since the last take, together, each
    hook emptied by it; a subject without the hooks tells nothing."""
    from faverify.subjects.base import Capabilities, Since, Subject, drain
    log, compiled = ["fwd triton", "bwd triton"], [2]
    subject = Subject("s", fn=None, caps=Capabilities.of(), paths=lambda: drain(log),
                      compiles=lambda: compiled.pop() if compiled else 0, compile_seconds=lambda: 1.5)
    assert subject.take() == Since(("fwd triton", "bwd triton"), 2, {"compile": 1.5})
    assert subject.take() == Since((), 0, {"compile": 1.5}) and log == []
    assert Subject("plain", fn=None, caps=Capabilities.of()).take() == Since()


def test_capabilities_keep_a_flat_declaration_in_groups_and_give_it_back():
    """Capabilities.of takes the flat keys a declaration gives (faverify_capabilities) and keeps the ragged,
    mask and FP8 ones in their groups; to_dict gives the same keys back, and each feature's declaration reads
    the same from the group as from the flat key."""
    import dataclasses

    from faverify.cases.vocabulary import FEATURES
    from faverify.subjects import Capabilities, builtin_names
    from faverify.subjects.groups import GROUPS
    flat = dict(varlen=True, varlen_tail_grads="finite", paged=True, page_sizes=[16, 64], splits=True,
                split_block=4, mask=True, mask_nan=True, bias_grad=True, fp8=["tensor"], fp8_formats=["e4m3", "e5m2"],
                fp8_only=True, window=True)
    caps = Capabilities.of(**flat)
    assert caps.ragged.tail_grads == "finite" and caps.ragged.page_sizes == (16, 64) and caps.ragged.split_block == 4
    assert caps.masks.nan and caps.masks.bias_grad and not caps.masks.bias
    assert caps.fp8.granularities == ("tensor",) and caps.fp8.formats == ("e4m3", "e5m2") and caps.fp8.only
    back = caps.to_dict()
    assert {k: back[k] for k in flat} == {k: tuple(v) if isinstance(v, list) else v for k, v in flat.items()}
    # the flat keys: every field but the groups, each group's keys in its place
    fields = [f.name for f in dataclasses.fields(Capabilities)]
    assert list(back) == [k for name in fields for k in (GROUPS[name].FLAT if name in GROUPS else (name,))]
    assert [f for f in FEATURES if caps.declares(f)] == ["window", "varlen", "paged", "splits", "mask", "mask_nan",
                                                         "bias_grad", "fp8"]
    from faverify.errors import EnvironmentProblem
    checked = []
    for name in builtin_names():
        try:
            declared = resolve(name).caps
        except EnvironmentProblem:  # an adapter whose library is not installed here
            continue
        checked.append(name)
        assert Capabilities.of(**declared.to_dict()) == declared, name
        assert all(declared.declares(f) == bool(declared.to_dict()[f]) for f in FEATURES), name
    assert {"sdpa-math", "triton", "triton-paged", "triton-fp8", "flex"} <= set(checked), checked
