"""The bundled FP8 forward (kernels/triton/fp8.py): e4m3 q, k, v with their descales, out in bf16. On the CPU
it runs under the Triton interpreter, whose e4m3 conversion the kernel's cast corrects; for sm_90 it is
compiled to wgmma on e4m3 operands."""
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from faverify.cases.case import Case
from faverify.kernels.triton.common import INTERPRET, cast
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"
BASE = Case.of(2, 70, 90, 4, 2, 64, dtype="bf16", fp8="tensor", seed=5)


@triton.jit
def _to_e4m3(X, Y, N: tl.constexpr, INTERPRETED: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(Y + r, cast(tl.load(X + r), tl.float8e4nv, INTERPRETED))


def test_the_cast_to_e4m3_rounds_as_the_gpu_under_the_interpreter_too():
    """The interpreter's own conversion rounds up without carrying into the exponent (31.8 becomes 16);
    common.cast rounds onto e4m3's grid first, to nearest even, subnormals and the saturation at 448 too."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(2048, generator=g) * 500, torch.rand(2048, generator=g) * 0.03,
                   -torch.rand(2048, generator=g) * 0.002, torch.randn(2048, generator=g) * 50])
    x[:5] = torch.tensor([31.8, 447.9, 464.0, 2.0**-10, 3 * 2.0**-10])  # ties to even among the subnormals
    x = x.to(DEVICE)
    y = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=DEVICE)
    _to_e4m3[(1,)](x, y, N=x.numel(), INTERPRETED=INTERPRET)
    got, want = y.float(), x.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    assert torch.equal(got, want), (x[got != want][:5], got[got != want][:5], want[got != want][:5])


@pytest.mark.parametrize("change", [{}, dict(fp8="head"), dict(causal=True), dict(causal=True, seqlen_q=130),
                                    dict(head_dim=40), dict(nheads_k=1, regime="tail-mass", seqlen_k=300),
                                    dict(regime="limits"), dict(regime="block-spread", causal=True),
                                    dict(regime="large"), dict(seqlen_q=1, seqlen_k=1, batch=1)])
def test_the_fp8_forward_passes_against_fp64(change):
    r = evaluate(resolve("triton-fp8"), BASE.replace(**change), DEVICE, mode="fwd")
    assert r.status == "pass", r.reason


def test_what_it_does_not_take_is_skipped_with_the_reason():
    subject = resolve("triton-fp8")
    for change, said in ((dict(fp8="block"), "per block not taken"), (dict(fp8_format="e5m2"), "e5m2 not taken"),
                         (dict(fp8="off"), "FP8 inputs alone")):
        r = evaluate(subject, BASE.replace(**change), DEVICE, mode="fwd")
        assert r.status == "skip" and said in r.reason, r.reason
    from faverify.kernels.triton.fp8 import fp8_attn_func
    q = torch.zeros(1, 4, 2, 32, dtype=torch.bfloat16)
    d = torch.ones(1, 2)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_attn_func(q, q, q, q_descale=d, k_descale=d, v_descale=d)


@pytest.mark.slow
def test_a_fuzz_of_the_fp8_forward_passes_and_counts_its_cases(tmp_path):
    r = cli("fuzz", "--kernel", "triton-fp8", "--iters", "40", "--device", DEVICE, "--no-db", "--json",
            tmp_path / "run.json")
    assert r.exit_code == 0, r.stderr
    summary = read_json(tmp_path / "run.json")["kernels"][0]["summary"]
    assert summary["features"] == {"fp8": 40} and summary["paths"] == {"fwd fp8": 40}, summary
    assert {k.split(" ")[1] for k in summary["fp8"]} == {"tensor", "head"}


@pytest.mark.slow
def test_each_fp8_mutant_is_killed_and_the_fp8_control_passes(tmp_path):
    r = cli("mutants", "--only", "fp8-v-descale-ignored,fp8-p-unscaled,fp8-q-descale-twice", "--iters", "60",
            "--control-iters", "10", "--device", DEVICE, "--json", tmp_path / "m.json")
    report = read_json(tmp_path / "m.json")
    assert [m["killed"] for m in report["mutants"]] == [True] * 3, report["mutants"]
    assert report["control"]["kernel"] == "triton-fp8" and report["control"]["failed"] == 0, report["control"]
    assert r.exit_code == 0, r.stderr


def test_it_compiles_to_wgmma_on_e4m3_for_sm_90_and_is_refused_for_sm_80():
    """Compiled in a process of its own: kernels defined under the interpreter cannot be compiled."""
    code = """
import re, triton
from triton.backends.compiler import GPUTarget
from faverify.kernels.triton.build.aot import FP8_KERNEL, AotBuild, compile_variant
from faverify.kernels.triton.build.sources import _fp8_source
src, opts, _ = _fp8_source(AotBuild(FP8_KERNEL, "fp8e4nv", 128, True, True), 90)
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]
print(sorted(set(re.findall(r"wgmma\\.mma_async\\S*e4m3\\.e4m3", ptx))), "cvt.rn.satfinite.e4m3x2.f32" in ptx)
print(compile_variant(AotBuild(FP8_KERNEL, "fp8e4nv", 128, True, True), 80)["ok"])
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    first, second = r.stdout.strip().splitlines()[-2:]
    assert "m64n64k32.f32.e4m3.e4m3" in first and "m64n128k32.f32.e4m3.e4m3" in first and first.endswith("True")
    assert second == "False"  # sm_80 has no e4m3 tensor cores: the launcher raises Unsupported there
