"""Verdicts that cannot be fooled: references from pristine inputs, a subject's exits and foreign devices
blamed on the subject, capabilities refused when they do not make sense."""
import pytest
import torch

from faverify.case import Case
from faverify.runner import evaluate
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json

CASE = Case(1, 33, 40, 2, 1, 16, dtype="fp32", seed=3)
CAUSAL = Case(1, 33, 40, 2, 1, 16, dtype="fp32", causal=True, seed=3)


@pytest.mark.parametrize("bug,tensor", [("zeroes_q", "q"), ("doubles_q", "q"), ("copies_v_into_k", "k"),
                                        ("zeroes_dout", "dout")])
def test_a_subject_that_changes_its_inputs_fails_on_the_untouched_inputs(bug, tensor):
    r = evaluate(resolve(f"property_tests.planted:{bug}"), CASE, "cpu")
    assert r.status == "fail" and f"{tensor}:modified" in r.signatures, (r.status, r.reason)
    n = CASE.batch * (CASE.seqlen_q if tensor in ("q", "dout") else CASE.seqlen_k) * (
        CASE.nheads if tensor in ("q", "dout") else CASE.nheads_k) * CASE.head_dim
    assert f"modified {tensor} in place: {n} elements" in r.reason
    # judged against references of the inputs as they were: the doubled q's output is wrong for the
    # q it was given, k overwritten by v likewise; zeroing q after the call leaves out right
    if bug in ("doubles_q", "copies_v_into_k"):
        assert "out:tolerance" in r.signatures, r.signatures
    if bug == "zeroes_q":  # in both modes autograd refuses the changed q; the forward alone is right
        fwd = evaluate(resolve(f"property_tests.planted:{bug}"), CASE, "cpu", mode="fwd")
        assert fwd.signatures == ["q:modified"] and fwd.metrics["out"].passed, (fwd.signatures, fwd.reason)


def test_a_declared_write_is_allowed():
    r = evaluate(resolve("property_tests.planted:writes_k_declared"), CASE, "cpu", mode="fwd")
    assert r.status == "pass", r.reason


def test_in_place_modification_is_found_shrunk_and_replayed(tmp_path):
    r = cli("fuzz", "--kernel", "property_tests.planted:doubles_q", "--iters", "30", "--device", "cpu", "--no-db",
            "--json", tmp_path / "run.json")
    assert r.exit_code == 1
    failures = read_json(tmp_path / "run.json")["kernels"][0]["failures"]
    modified = next(f for f in failures if f["signature"] == "q:modified")
    minimal = modified["minimal"]["case"]
    assert minimal["seqlen_q"] == 1 and minimal["batch"] == 1 and minimal["nheads"] == 1, minimal
    rep = cli("repro", "--kernel", "property_tests.planted:doubles_q", "--device", "cpu", "--case",
              Case.from_dict(minimal).to_json())
    assert rep.exit_code == 1 and "modified q in place" in rep.stderr
    golden = cli("golden", "verify", "--kernel", "property_tests.planted:doubles_q", "--device", "cpu",
                 "--only", "one-key,gqa-113x203")
    assert golden.exit_code == 1 and "modified q in place" in golden.stderr


@pytest.mark.parametrize("bug,message", [
    ("exits_zero", "forward raised SystemExit"),
    ("os_exits_zero", "the subject called os._exit(0)"),
    ("returns_on_meta", "out is on meta, expected the inputs' device cpu"),
])
def test_the_subject_is_blamed_in_this_process(bug, message):
    r = evaluate(resolve(f"property_tests.planted:{bug}"), CAUSAL, "cpu")
    assert r.status == "fail" and message in r.reason, r.reason


@pytest.mark.parametrize("declared,message", [
    ("5", "faverify_capabilities must be a dict"),
    ("{'dtypes': 'bf16'}", "dtypes must be a list of bf16, fp16, fp32, got 'bf16'"),
    ("{'gqa': 'no'}", "gqa must be true or false"),
    ("{'writes': ['out']}", "writes must be a list of q, k, v, dout"),
    ("{'max_head_dim': 0}", "max_head_dim must be an integer >= 1"),
    ("{'colour': 'red'}", "unexpected keyword argument 'colour'"),
])
def test_capabilities_that_are_not_valid_are_refused_when_the_kernel_loads(tmp_path, monkeypatch, declared, message):
    module = f"badcaps_{abs(hash(declared))}"  # a module of its own per declaration: imports are cached
    (tmp_path / f"{module}.py").write_text(
        "def attn(q, k, v, *, causal, softmax_scale):\n    return q\n"
        f"attn.faverify_capabilities = {declared}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = cli("fuzz", "--kernel", f"{module}:attn", "--iters", "3", "--device", "cpu", "--no-db")
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_module_that_exits_at_import_is_exit_2_with_a_message(tmp_path, monkeypatch):
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = cli("fuzz", "--kernel", "exits_at_import:attn", "--iters", "3", "--device", "cpu", "--no-db")
    assert r.exit_code == 2 and "cannot import module 'exits_at_import': SystemExit" in r.stderr, r.stderr


def test_the_output_device_is_checked_for_the_gradients_too():
    from faverify.runner import _on_device
    assert _on_device("dq", torch.zeros(1, device="meta"), torch.device("cpu")) == \
        "dq is on meta, expected the inputs' device cpu"
    assert _on_device("dq", torch.zeros(1), torch.device("cpu")) is None
