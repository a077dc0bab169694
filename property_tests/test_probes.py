"""Memory-safety probes and determinism: NaN margins around every input, and --repeat."""
import json

import pytest
import torch

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.cases.vocabulary import LAYOUTS
from property_tests.cli_helpers import cli


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_input_sits_between_nan_margins(layout):
    c = Case(2, 5, 7, 2, 1, 8, layout=layout, head_dim_v=4 if layout == "packed" else None, seed=1)
    x = make_inputs(c, "cpu", requires_grad=True)
    for t in x.tensors():
        assert torch.isfinite(t).all()
        flat = t.detach()
        storage = torch.empty(0, dtype=flat.dtype).set_(flat.untyped_storage())
        start = flat.storage_offset()
        end = start + sum((n - 1) * s for n, s in zip(flat.shape, flat.stride())) + 1
        assert start >= 1024 and torch.isnan(storage[:start]).all()
        assert storage.numel() - end >= 1024 and torch.isnan(storage[end:]).all()
    assert x.q.requires_grad and not x.q.is_leaf  # gradients flow to the margined buffer


def test_a_read_past_the_end_of_k_is_a_nan():
    r = cli("fuzz", "--kernel", "property_tests.planted:reads_one_key_past_the_end", "--iters", "10", "--device",
            "cpu", "--no-db", "--no-isolate", "--mode", "fwd", "--dtype", "fp32")
    assert r.exit_code == 1 and "out:nan" in r.stdout + r.stderr


def test_repeat_catches_a_subject_whose_bits_change_between_runs(tmp_path):
    args = ("--kernel", "property_tests.planted:nondeterministic", "--iters", "10", "--device", "cpu", "--no-db",
            "--no-isolate", "--dtype", "fp32")
    assert cli("fuzz", *args).exit_code == 0  # one ulp: inside the tolerance
    r = cli("fuzz", *args, "--repeat", "2", "--json", tmp_path / "run.json")
    assert r.exit_code == 1
    failure = json.loads((tmp_path / "run.json").read_text())["kernels"][0]["failures"][0]
    assert failure["signature"] == "nondeterministic" and "differs from run 1: out in" in failure["minimal"]["reason"]
    assert Case.from_dict(failure["minimal"]["case"]).seqlen_q == 1  # shrunk like the others


def test_repeat_passes_a_deterministic_subject_and_is_validated():
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "8", "--device", "cpu", "--no-db", "--no-isolate",
            "--repeat", "3")
    assert r.exit_code == 0
    r = cli("fuzz", "--kernel", "sdpa-math", "--repeat", "0")
    assert r.exit_code == 2 and "--repeat=0: must be >= 1" in r.stderr
