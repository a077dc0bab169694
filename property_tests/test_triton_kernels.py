"""The bundled Triton kernels: on the CPU through the interpreter (with its bf16 handling), on the GPU
compiled (marked gpu). Correctness is judged by the same reference and verdict as everything else."""
import re

import pytest
import torch
from hypothesis import given, settings

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.cases.strategies import Limits, cases
from faverify.judge.verdict import Tolerance
from faverify.run.evaluate import evaluate, judge
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"
SMALL = Limits(max_seqlen=130, max_batch=2, max_heads=4, max_elements=1 << 14)


def flash():
    from faverify.kernels.triton import flash_attn_func
    return flash_attn_func


def run(case, *, init=None, backward=True, launch=None):
    x = make_inputs(case, DEVICE, requires_grad=backward)
    out, lse = flash()(x.q, x.k, x.v, causal=case.causal, softmax_scale=case.scale, init=init or case.init,
                       return_lse=True, launch=launch)
    got = {"out": out, "lse": lse}
    if backward:
        got.update(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (x.q, x.k, x.v), x.dout)))
    return x, got


@settings(max_examples=12)
@given(cases(limits=SMALL, dtypes=("bf16",)))
def test_bf16_is_right_against_fp64(case):
    """bf16 on the CPU goes through the interpreter, which gets bf16 dots and casts wrong by itself."""
    x, got = run(case)
    metrics = judge(case, x, got, Tolerance(), tuple(got))
    assert all(m.passed for m in metrics.values()), {t: m.reason for t, m in metrics.items() if not m.passed}


@pytest.mark.skipif(HAS_GPU, reason="the interpreter's bf16 handling only exists on the CPU path")
def test_without_the_interpreter_emulation_bf16_would_be_wrong():
    """Shows the handling is needed: switched off, the same kernel gives garbage in bf16."""
    from faverify.kernels.triton.interface import Launch
    case = Case(1, 64, 64, 2, 2, 64, dtype="bf16", seed=3)
    x, got = run(case, backward=False, launch=Launch(emulate=False))
    metrics = judge(case, x, got, Tolerance(), ("out", "lse"))
    assert not metrics["out"].passed


def test_each_case_reports_the_code_paths_it_took():
    """The subject tells which launch paths ran (Subject.paths): the fuzz counts cases per path and a
    mutant's row says whether any case ran its code. Here: the Triton forward and backward on this
    device (the Hopper forward on sm_90, TMA on later GPUs), the forward alone in mode fwd, no launch at
    all without keys, and nothing left over from an earlier call."""
    subject = resolve("triton")
    major = torch.cuda.get_device_capability()[0] if HAS_GPU else 0
    fwd = "fwd hopper" if major == 9 else ("fwd triton-tma" if major > 9 else "fwd triton")
    case = Case(1, 33, 40, 2, 1, 64, dtype="bf16", seed=3)
    assert evaluate(subject, case, DEVICE).paths == [fwd, "bwd triton"]
    assert evaluate(subject, case, DEVICE, mode="fwd").paths == [fwd]
    empty = Case(1, 5, 0, 2, 1, 16, seed=1)
    assert evaluate(subject, empty, DEVICE).paths == ["fwd none (empty)", "bwd none (empty)"]
    x = make_inputs(case, DEVICE)
    subject(x.q, x.k, x.v, case)  # a call outside a case: not the next case's
    assert evaluate(subject, empty, DEVICE, mode="fwd").paths == ["fwd none (empty)"]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="compiled variants exist only on the GPU (the interpreter compiles nothing)")
def test_one_compile_per_variant_whatever_the_sizes():
    """A fuzz run draws a new batch, head count, group and pair of seqlens nearly every case. Triton compiles
    a kernel again for each pattern of integer arguments equal to 1 or divisible by 16 unless they are left
    unspecialized, and each compile costs seconds: the sizes must not make new variants (the Hopper forward's
    did, and halved the GPU fuzz throughput), beyond the one of each build."""
    import triton

    from faverify.kernels.triton.dense import backward, forward
    from faverify.kernels.triton.hopper import forward as hopper_forward
    kernels = {f"{m.__name__}.{n}": f for m in (forward, hopper_forward, backward) for n, f in vars(m).items()
               if isinstance(f, triton.runtime.JITFunction)}
    device = torch.cuda.current_device()
    for f in kernels.values():
        if device in f.device_caches:
            f.device_caches[device][0].clear()
    subject = resolve("triton")
    # the Hopper forward's two builds (hopper.forward.kernel): seqlens both multiples of 16, or not
    sizes = [(1, 1, 1, 1, 1), (2, 16, 32, 16, 16), (3, 97, 200, 6, 2), (1, 256, 1, 4, 4), (4, 33, 48, 8, 1),
             (3, 64, 16, 6, 2), (1, 1, 16, 1, 1)]
    paths = set()
    for b, sq, sk, h, hk in sizes:
        r = evaluate(subject, Case(b, sq, sk, h, hk, 64, dtype="bf16", seed=3), DEVICE)
        assert r.status == "pass", r.reason
        paths.add(tuple(r.paths))
    assert len(paths) == 1, paths  # one launch path for all: one variant of each kernel it runs
    compiled = {n: len(f.device_caches[device][0]) for n, f in kernels.items() if device in f.device_caches}
    assert sum(compiled.values()) >= 2 and max(compiled.values()) == 1, compiled


TMA_SKIP = HAS_GPU and torch.cuda.get_device_capability()[0] < 9


@pytest.mark.skipif(TMA_SKIP, reason="tensor descriptors (TMA) need sm_90 or later; this GPU is older")
@settings(max_examples=8, deadline=None)
@given(cases(limits=SMALL, dtypes=("bf16", "fp16"), head_dims=(16, 48, 64, 80, 128),
             layouts=("contiguous", "transposed", "packed")))  # "strided" pads rows by 8: no TMA
def test_forward_through_tensor_descriptors_gives_the_same_bits(case):
    """The Triton forward's TMA path (sm_90+) and its pointer path must agree bit for bit: the copy engine's
    zero fill at the sequence tails and in the head-dim padding (48 and 80 pad to 64 and 128) replaces the
    masks. Both at one tile, and without the Hopper forward, which TMA inputs take on sm_90: its own key
    tiles are another sum order (test_hopper_forward_is_right_against_fp64 checks it)."""
    import dataclasses

    from faverify.kernels.triton import configs, interface
    from faverify.kernels.triton.common import block_d
    case = dataclasses.replace(case, head_dim=-(-case.head_dim // 16) * 16)  # 16-byte strides in every layout
    x = make_inputs(case, DEVICE)
    tile = configs.default("fwd", block_d(case.head_dim), x.q.element_size(), case.causal)
    got = {}
    for tma in (False, True):
        launch = interface.Launch(tma=tma, hopper=False)
        assert interface._use_tma(x.q, x.k, x.v, launch=launch) == tma, case
        out, lse, (rowmax, log2l) = interface.forward(x.q, x.k, x.v, case.scale, case.causal, case.init,
                                                      tile=tile, launch=launch)
        launched = interface._LAUNCHED[-1]
        assert ("triton-tma" in launched) == tma and "hopper" not in launched, launched
        got[tma] = (out, lse, rowmax, log2l)
    for name, a, b in zip(("out", "lse", "rowmax", "log2l"), got[False], got[True]):
        assert torch.equal(a, b), name


HOPPER_SKIP = "the warp-specialized Hopper forward runs on sm_90 only (wgmma)"


def _is_hopper() -> bool:
    return HAS_GPU and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@pytest.mark.skipif(HAS_GPU and not _is_hopper(), reason=HOPPER_SKIP)
@settings(max_examples=40, deadline=None)
@given(cases(limits=Limits(max_seqlen=400, max_batch=2, max_heads=4, max_elements=1 << 17),
             dtypes=("bf16", "fp16"), head_dims=(48, 64, 80, 128), layouts=("contiguous", "transposed", "packed")))
def test_hopper_forward_is_right_against_fp64(case):
    """The Hopper forward (hopper/forward.py) takes 16-bit inputs with padded head dim 64 or 128 on sm_90:
    its outputs pass the verdict against FP64 on random cases (tails at 64 and 128 rows, causal with
    seqlen_q != seqlen_k, fully masked rows, GQA, both inits, large logits), and its row max and log2 l,
    which the backward reads, equal the Triton forward's up to summation order. The kernel is persistent:
    run on 3 programs, each takes many query blocks in turn (the ring's stages and barrier phases go on
    from block to block), and gives the same bits as with one program per block (the default)."""
    import dataclasses

    from faverify.kernels.triton import configs, interface
    from faverify.kernels.triton.common import block_d
    case = dataclasses.replace(case, head_dim=-(-case.head_dim // 16) * 16)  # 16-byte strides: TMA applies
    x = make_inputs(case, DEVICE)
    assert interface._use_hopper(x.q, interface._use_tma(x.q, x.k, x.v)), case
    tile = configs.select("fwd", block_d(case.head_dim), 2, case.causal, case.seqlen_k, True, True)
    assert tile.hopper
    out, lse, (rowmax, log2l) = interface.forward(x.q, x.k, x.v, case.scale, case.causal, case.init,
                                                  launch=interface.Launch(programs=3))
    wide = interface.forward(x.q, x.k, x.v, case.scale, case.causal, case.init)
    for a, b in zip((out, lse, rowmax, log2l), (wide[0], wide[1], *wide[2])):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    metrics = judge(case, x, {"out": out, "lse": lse}, Tolerance(), ("out", "lse"))
    assert all(m.passed for m in metrics.values()), {t: m.reason for t, m in metrics.items() if not m.passed}
    _, lse_t, (rowmax_t, log2l_t) = interface.forward(x.q, x.k, x.v, case.scale, case.causal, case.init,
                                                      launch=interface.Launch(hopper=False))
    torch.testing.assert_close(rowmax, rowmax_t, rtol=1e-6, atol=0)  # the max of the same fp32 logits
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_t)) and torch.equal(torch.isinf(log2l), torch.isinf(log2l_t))
    torch.testing.assert_close(log2l, log2l_t, rtol=0, atol=1e-5, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.skipif(HAS_GPU and not _is_hopper(), reason="the warp-specialized Hopper backward runs on sm_90 only")
@settings(max_examples=40, deadline=None)
@given(cases(limits=Limits(max_seqlen=400, max_batch=2, max_heads=4, max_elements=1 << 17),
             dtypes=("bf16", "fp16"), head_dims=(48, 64, 80, 128), layouts=("contiguous", "transposed", "packed")))
def test_hopper_backward_is_right_against_fp64(case):
    """The Hopper dK/dV (hopper/backward.py, asked for with Launch(hopper_backward=True)) passes the verdict
    against FP64 on random cases (key tails at 64 and 128, causal with seqlen_q != seqlen_k, rows that see
    no key, GQA summed over the group, large logits) in both of its modes: dQ from the Triton kernel, the
    same bits twice (no atomics); and dQ fused into it (deterministic=False), whose dK and dV are the
    first mode's bits."""
    import dataclasses

    from faverify.kernels.triton import interface
    case = dataclasses.replace(case, head_dim=-(-case.head_dim // 16) * 16)  # 16-byte strides: TMA applies
    launch = interface.Launch(hopper_backward=True)
    x, got = run(case, launch=launch)
    assert "bwd hopper" in interface.take_paths()
    metrics = judge(case, x, got, Tolerance(), tuple(got))
    assert all(m.passed for m in metrics.values()), {t: m.reason for t, m in metrics.items() if not m.passed}
    _, again = run(case, launch=launch)
    for name in ("dk", "dv"):
        torch.testing.assert_close(got[name], again[name], rtol=0, atol=0, equal_nan=True)
    x, fused = run(case, launch=interface.Launch(hopper_backward=True, deterministic=False))
    assert "bwd hopper fused-dq" in interface.take_paths()
    metrics = judge(case, x, fused, Tolerance(), tuple(fused))
    assert all(m.passed for m in metrics.values()), {t: m.reason for t, m in metrics.items() if not m.passed}
    for name in ("dk", "dv"):
        torch.testing.assert_close(fused[name], got[name], rtol=0, atol=0, equal_nan=True)


def test_the_hopper_backward_subjects_ask_for_it_in_their_mode(monkeypatch):
    """triton-hopper-bwd and triton-hopper-bwd-fast run flash_attn_func with the opt-in Hopper backward,
    deterministic and fused, triton-hopper-bwd-fused with the fused Hopper backward; they draw the cases it
    takes (dense, 16-bit, 16-byte rows) on GPUs only."""
    from faverify.kernels.triton import interface
    from faverify.subjects import resolve
    seen = []
    monkeypatch.setattr(interface, "flash_attn_func", lambda q, k, v, **kw: seen.append(kw) or (q, None))
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    for name, launch in (("triton-hopper-bwd", interface.Launch(hopper_backward=True, deterministic=True)),
                         ("triton-hopper-bwd-fast", interface.Launch(hopper_backward=True, deterministic=False)),
                         ("triton-hopper-bwd-fused", interface.Launch(fused_backward=True))):
        subject = resolve(name)
        caps = subject.caps
        assert caps.devices == ("cuda",) and caps.dtypes == ("bf16", "fp16") and caps.head_dims == (48, 64, 80, 96, 112,
                                                                                                    128)
        assert not any((caps.window, caps.softcap, caps.alibi, caps.sinks, caps.head_dim_v, caps.masks.mask,
                        caps.masks.bias))
        subject.fn(q, q, q, causal=True)
        assert seen[-1] == dict(return_lse=True, causal=True, launch=launch)


def test_the_fused_dq_accumulator_holds_rows_by_head_and_pads_the_head_dim():
    """hopper/backward.py's fused dQ adds into dq_buffer at [b, h, s, padded d] (the kernel's offsets: rows of
    (b * h + head) * s + query, BLOCK_D apart) and finish_dq scales that sum and lays it out as dq [b, s, h,
    d] in the input dtype, ignoring the padding."""
    from faverify.kernels.triton.hopper import backward as hopper_backward
    q = torch.zeros(2, 5, 3, 40, dtype=torch.bfloat16)
    total = hopper_backward.dq_buffer(q, 64)
    assert total.shape == (2, 3, 5, 64) and total.dtype == torch.float32 and not total.any()
    flat = total.view(-1)  # the kernel's addressing: ((b * h + head) * s + query) * BLOCK_D + column
    for b, head, query, col in ((0, 0, 0, 0), (1, 2, 4, 39), (1, 0, 3, 17), (0, 1, 2, 63)):
        flat[((b * 3 + head) * 5 + query) * 64 + col] = 1.0 + b + head + query + col
    dq = hopper_backward.finish_dq(total, torch.full_like(q, float("nan")), 0.5)
    expected = torch.zeros(2, 5, 3, 40)
    for b, head, query, col in ((0, 0, 0, 0), (1, 2, 4, 39), (1, 0, 3, 17)):  # column 63 is padding
        expected[b, query, head, col] = 0.5 * (1.0 + b + head + query + col)
    assert dq.dtype == torch.bfloat16 and torch.equal(dq.float(), expected)


def test_hopper_backward_only_when_asked_and_where_it_can_run():
    """Opt-in (Launch.hopper_backward) until it has passed on a GPU; then 16-bit on sm_90 with padded head
    dim 64 or 128, TMA-aligned tensors, and no ALiBi; never under the interpreter."""
    from faverify.kernels.triton import interface
    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16, device=DEVICE)
    asked = interface.Launch(hopper_backward=True)
    assert not interface._use_hopper_backward(q, q, q, q, None)
    assert interface._use_hopper_backward(q, q, q, q, None, asked) == _is_hopper()
    assert not interface._use_hopper_backward(q, q, q, q, (torch.ones(2, device=DEVICE), 0), asked)
    assert not interface._use_hopper_backward(q.float(), q.float(), q.float(), q.float(), None, asked)
    wide = torch.zeros(1, 8, 2, 256, dtype=torch.bfloat16, device=DEVICE)
    assert not interface._use_hopper_backward(wide, wide, wide, wide, None, asked)


def test_hopper_forward_only_where_it_can_run():
    """16-bit, sm_90 exactly, padded head dim 64 or 128, loads through TMA; never under the interpreter."""
    from faverify.kernels.triton import configs, interface
    assert configs.hopper_forward(2, 9, 64) and configs.hopper_forward(2, 9, 128)
    assert not any([configs.hopper_forward(4, 9, 64), configs.hopper_forward(2, 8, 128),
                    configs.hopper_forward(2, 10, 128), configs.hopper_forward(2, 9, 32),
                    configs.hopper_forward(2, 9, 256)])
    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16, device=DEVICE)
    assert not interface._use_hopper(q, False)
    assert interface._use_hopper(q, True) == _is_hopper()
    assert str(configs.HOPPER[128]).endswith(" hopper")
    assert configs.default("fwd", 128, 2, False, True, True).hopper == (not interface.INTERPRET)


def test_hopper_grid_is_one_program_per_block_or_the_persistent_count():
    """hopper.layouts.grid: the GPU test's 3 persistent programs must really be 3 (else it would compare the
    default launch with itself), and never more programs than blocks."""
    from faverify.kernels.triton import configs
    from faverify.kernels.triton.hopper.layouts import grid
    tile = configs.HOPPER[64]  # 192 query rows per block
    assert grid(tile, 1000, 6, None) == (6 * 6,)
    assert grid(tile, 1000, 6, 3) == (3,)
    assert grid(tile, 100, 2, 3) == (2,)


def test_launchers_run_on_their_tensors_device(monkeypatch):
    """Triton launches on the current device: tensors on cuda:1 need it switched (and the descriptor
    scratch allocated there). Checked without a second GPU by recording the switch."""
    import contextlib

    from faverify.kernels.triton import interface
    entered = []
    monkeypatch.setattr(torch.cuda, "device", lambda d: entered.append(d) or contextlib.nullcontext())

    class OnSecondGpu:
        is_cuda, device = True, "cuda:1"

    assert interface._on_their_device(lambda first, x: x)(OnSecondGpu(), 5) == 5 and entered == ["cuda:1"]
    assert interface._on_their_device(lambda first: 0)(torch.zeros(1)) == 0 and entered == ["cuda:1"]
    assert hasattr(interface.forward, "__wrapped__") and hasattr(interface.backward, "__wrapped__")


def test_tensor_descriptors_only_where_strides_allow():
    from faverify.kernels.triton import interface
    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16, device=DEVICE)
    odd = torch.zeros(1, 8, 2, 72, dtype=torch.bfloat16, device=DEVICE)[..., :64]  # row stride 144 elements
    forced = interface.Launch(tma=True)
    assert interface._use_tma(q, q, q, launch=forced) and not interface._use_tma(q, odd, q, launch=forced)
    assert interface._use_tma(q, q, q) == (HAS_GPU and torch.cuda.get_device_capability()[0] >= 9)


@pytest.mark.slow
def test_fuzz_30_cases_every_dtype_on_this_machine(tmp_path):
    """30 cases, 10 a dtype on average: 60 took 144 s of a CI run on the 2-core machine, beside the
    background compiles and the mutants run."""
    from faverify.kernels.triton.interface import PATHS
    r = cli("fuzz", "--kernel", "triton", "--iters", "30", "--dtype", "bf16,fp16,fp32", "--device", DEVICE,
            "--workers", "2", "--json", tmp_path / "f.json", "--markdown", tmp_path / "f.md")
    assert r.exit_code == 0, r.stderr
    # every case that ran took one forward path, and the report counts them (fwd hopper among them on sm_90)
    summary = read_json(tmp_path / "f.json")["kernels"][0]["summary"]
    paths = summary["paths"]
    assert set(paths) <= set(PATHS) and sum(n for p, n in paths.items() if p.startswith("fwd")) == 30, paths
    assert paths.get("fwd hopper", 0) > 0 or not _is_hopper(), paths
    assert "cases per code path" in (tmp_path / "f.md").read_text()


@pytest.mark.slow
def test_every_variant_compiles_for_sm80_and_sm90(capsys, aot_compile):
    """python -m faverify.kernels.triton.build.aot, started at collection (conftest.py) to overlap the suite."""
    returncode, out, err = aot_compile
    with capsys.disabled():  # the table of shared memory per variant belongs in the CI log
        print("\n" + out[-20000:])
    assert returncode == 0, out[-3000:] + err[-3000:]
    assert "0 failed" in out
    # the Hopper forward, for sm_90 only, as the launcher takes it there (configs.HOPPER)
    hopper = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith("fwd-hopper ")]
    # the dense builds may spill only at d64 causal: 24 bytes of stack, saved once per query block before
    # the key-tile loop (docs/measurements.md, "Forward"); the ALiBi build at d64 96 bytes (its split
    # bias, common.alibi_split: 1.28x dense's time on the H200, against 1.36x with the distance computed
    # element by element and 32 bytes, 1.61x with integer distances and no spill), and the build with every
    # switch at d128 128 (the split bias beside softcap's tanh; that build is not timed); a spill anywhere
    # else is new, the window and softcap builds' among them (configs.HOPPER_SOFTCAP)
    from faverify.kernels.triton.build.aot import HOPPER_SWITCH_SETS
    assert len(hopper) == 8 + 2 * len(HOPPER_SWITCH_SETS), hopper  # dense, and each switch set at d64 and d128
    assert all(row[1] == "sm_90" and row[-1].startswith("ok") for row in hopper), hopper
    spills = {" D64 causal": 24, " D64 alibi": 96, " D128 window+softcap+alibi+sinks": 128}
    allowed = {row[0]: next((n for end, n in spills.items() if row[0].endswith(end)), 0) for row in hopper}
    assert all(int(row[5]) <= allowed[row[0]] for row in hopper), [row[:6] for row in hopper]
    # the Hopper dK/dV (hopper/backward.py), opt-in: its 8 builds compile for sm_90, and the 8 that fuse dQ
    # (at d128 with 128-208 bytes of stack, fused 208-368; at d64 fused and causal 32)
    bwd = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith("bwd-hopper ")]
    assert len(bwd) == 16 and all(row[1] == "sm_90" and row[-1].startswith("ok") for row in bwd), bwd
    assert len([row for row in bwd if row[0].endswith(" fused-dq")]) == 8, bwd
    from faverify.kernels.mutants.catalog import HOPPER_BWD_MUTANTS  # and each of its mutants, as the forward's
    mutants = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith("bwd-hopper-mutant ")]
    assert {row[0].split()[1] for row in mutants} == {m.name for m in HOPPER_BWD_MUTANTS}, mutants
    assert all(row[-1].startswith("ok") for row in mutants), mutants
    # the fused Hopper backward (hopper/backward_fused.py), opt-in: its 8 builds and its mutants compile for
    # sm_90 with no stack (property_tests/test_fused_backward.py reads their machine code)
    fused = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith("bwd-fused-hopper")]
    from faverify.kernels.mutants.catalog import FUSED_BWD_MUTANTS
    assert len(fused) == 8 + len(FUSED_BWD_MUTANTS), fused
    assert all(row[1] == "sm_90" and row[-1] == "ok" for row in fused), fused
    assert {row[0].split()[1] for row in fused if "-mutant " in row[0]} == {m.name for m in FUSED_BWD_MUTANTS}
    # every Hopper mutant compiles (its causal build) with its features' switches: they run on sm_90 only, so
    # a replacement that breaks the build would otherwise first show on a GPU (as a kill by crash)
    from faverify.kernels.mutants.catalog import HOPPER_MUTANTS
    mutants = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith("fwd-hopper-mutant ")]
    assert {row[0].split()[1] for row in mutants} == {m.name for m in HOPPER_MUTANTS}, mutants
    assert len(mutants) == len(HOPPER_MUTANTS) and all(row[-1].startswith("ok") for row in mutants), mutants
    # the sparse-indices kernels (sparse.py), one token a program as on the GPU: each build compiles
    sparse = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if re.match(r"s(fwd|bwd) ", line)]
    assert len(sparse) == 8 * 2 and all(row[-1].startswith("ok") for row in sparse), sparse
    # the FP8 forward (fp8.py), for sm_90 alone (e4m3 tensor cores start at sm_89): each head dim, causal or not;
    # at d256 its 64-row tile keeps 320-384 bytes of stack (measured by this report, not yet timed on a GPU)
    fp8 = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith("ffwd ")]
    assert len(fp8) == 6 and all(row[1] == "sm_90" and row[-1].startswith("ok") for row in fp8), fp8
    assert all(int(row[5]) <= (512 if " D256 " in row[0] else 0) for row in fp8), fp8
    # the variant kernels' generic 16-bit builds spill nothing (configs.variant's tiles); fp32's as below
    varied = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines()
              if re.match(r"v(fwd|dkdv|dq|combine|decode) ", line)]
    sixteen = [row for row in varied if " fp32 " not in row[0] and not row[0].endswith(" fast")]
    # but one: dk/dv with a bias and a block mask at d128 keeps 32 bytes on sm_80 (configs._MASKED's tile,
    # with ALiBi's split bias: common.alibi_split's row term and its two branches a tile)
    allowed = {("vdkdv bf16 D128 bias+blocks", "sm_80"): 32}
    assert sixteen and all(int(row[5]) <= allowed.get((row[0], row[1]), 0) for row in sixteen), \
        [row[:6] for row in sixteen if int(row[5])]
    # the fast builds' tiles were chosen by speed on the H200 (configs._FAST), some with up to 816 bytes of
    # stack; more than 1 KB would be a new spill, which the H200 has not timed
    fast = [row for row in varied if row[0].endswith(" fast")]
    decode = [row for row in fast if row[0].startswith("vdecode ")]  # configs.decode: none spills
    assert len(decode) == 3 * 2 and all(int(row[5]) == 0 for row in decode), decode
    # (sm_80's d64 dk/dv with varlen and softcap 1072, with ALiBi's split bias: sm_80 is not timed)
    limit = {("vdkdv bf16 D64 varlen+softcap fast", "sm_80"): 1100}
    assert len(fast) == 22 * 2 and all(int(row[5]) <= limit.get((row[0], row[1]), 1024) for row in fast), \
        [row[:6] for row in fast if int(row[5])]
    # fp32's own small tiles (configs._fp32): the 16-bit ones spilled up to 45 KB there
    fp32 = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if re.match(r"\w+ fp32 D\d+", line)]
    assert fp32 and all(int(row[5]) <= 64 for row in fp32), [row[:6] for row in fp32 if int(row[5]) > 64]


def _variant(case: Case) -> tuple:
    """The compiled variant of the dense kernels a case launches: (dtype, padded head dim, EVEN_D, causal,
    fast build, ALiBi: the backward's ALIBI build)."""
    from faverify.kernels.triton.common import block_d
    from faverify.kernels.triton.interface import _aligned
    x = make_inputs(case, "cpu")
    out = torch.empty(x.q.shape, dtype=x.q.dtype)  # the launcher allocates out contiguous
    bd = block_d(case.head_dim)
    return case.dtype, bd, case.head_dim == bd, case.causal, _aligned(x.q, x.k, x.v, out), case.alibi != "off"


def test_warmup_cases_cover_every_variant_a_fuzz_draws():
    """The GPU fuzz warm-up (parallel.warm_up) compiles each variant once, ahead of the cases; a variant it
    missed would compile in every worker again. Every variant of 400 drawn cases is among the warm-up's,
    and of 400 drawing ALiBi, whose cases without another feature take the dense backward's ALIBI build."""
    from faverify.kernels.triton.common import BLOCK_DS
    from faverify.kernels.triton.subject import warmup_cases
    from faverify.run.draw import draw_cases
    from faverify.run.plan import FuzzPlan
    dtypes = ("bf16", "fp16")
    warmed = {_variant(c) for c in warmup_cases(dtypes)}
    # every padded head dim, both causal settings, fast and generic builds for a head dim that fills its
    # padding and for one that does not (fast only where a smaller multiple of 16 exists: bd >= 64)
    expected = {(dt, bd, even, causal, fast, alibi) for dt in dtypes for bd in BLOCK_DS for causal in (False, True)
                for even, fast in ((True, True), (True, False), (False, False), (False, True))
                for alibi in (False, True) if even or not fast or bd >= 64}
    assert warmed == expected
    limits = Limits(max_seqlen=64, max_batch=2, max_heads=4, max_elements=1 << 16)
    drawn = draw_cases(FuzzPlan(iters=400, seed=5, dtypes=dtypes, limits=limits, database=None))
    assert {_variant(c) for c in drawn} <= warmed
    drawn = draw_cases(FuzzPlan(iters=400, seed=5, dtypes=dtypes, limits=limits, database=None,
                                features=("alibi",)))
    alone = [c for c in drawn if c.features() == ("alibi",)]
    assert alone and {_variant(c) for c in alone} <= warmed


@pytest.mark.parametrize("kernel, regime", [("triton", "large"), ("mutant:bwd-delta-from-v", "normal"),
                                            ("mutant:pv-fp16-accumulation", "bf16-scale")])
def test_interpreter_overflow_warnings_are_silenced_forward_and_backward(kernel, regime, device):
    """Under the interpreter NumPy warns on overflows to inf and on NaN: the ones the kernels then mask or
    clamp as the GPU does, and a buggy kernel's. The verdict reports what matters; the warnings are
    silenced in the forward and in the backward, which autograd runs outside the subject's call (the two
    mutants here warned only there, in CI's log of the mutants test)."""
    import warnings
    case = Case(1, 40, 33, 2, 1, 32, dtype="bf16", causal=True, regime=regime, seed=2)
    x = make_inputs(case, device, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, _ = resolve(kernel)(x.q, x.k, x.v, case)
        torch.autograd.grad(out, (x.q, x.k, x.v), x.dout)


def test_compile_time_is_the_cases_compile_phase_not_its_subjects(monkeypatch):
    """The Triton subjects time Triton's compiles through its hooks (build/clock.py) and the runner reports
    them as the case's "compile" phase, taken out of "subject"; what a warm-up compiled before the case is
    not charged to it. The interpreter compiles nothing, so the hooks are fired here by hand around a
    launch, as Triton fires them around a compile."""
    import time

    from triton import knobs

    from faverify.kernels.triton import interface
    from faverify.kernels.triton.build import clock

    subject = resolve("triton")
    assert knobs.runtime.jit_cache_hook is clock._before
    real = interface.flash_attn_func

    def compile_for(seconds):
        hook = dict(key="k", repr="r", fn=None, compile={}, is_manual_warmup=False, already_compiled=False)
        knobs.runtime.jit_cache_hook(**hook)
        time.sleep(seconds)
        knobs.runtime.jit_post_compile_hook(**hook)

    def compiling(*args, **kwargs):
        compile_for(0.05)
        return real(*args, **kwargs)
    case = Case(1, 8, 8, 1, 1, 16, dtype="fp32", seed=1)
    evaluate(subject, case, DEVICE, mode="fwd")  # on a GPU the kernels' real compile, before the timed case
    monkeypatch.setattr(interface, "flash_attn_func", compiling)
    compile_for(0.6)  # a warm-up's compile, before the case: charged to it, the phase would pass 0.5 s
    r = evaluate(subject, case, DEVICE, mode="fwd")
    assert r.status == "pass", r.reason
    assert 0.05 <= r.phases["compile"] < 0.5 and r.phases["subject"] < r.seconds, r.phases
    assert clock.take() == {}


_COMPILE_TWICE = """
import json
import triton
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
from faverify.kernels.triton.build import clock


def copy(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, tl.load(X + offs))


clock.install()
assert knobs.compilation.listener is clock._listen
fn = JITFunction(copy)
hook = dict(key="k", repr="r", fn=fn, compile={}, is_manual_warmup=False, already_compiled=False)
spent = []
for _ in range(2):
    knobs.runtime.jit_cache_hook(**hook)
    triton.compile(ASTSource(fn, {"X": "*fp32", "Y": "*fp32", "N": "constexpr"}, {"N": 16}),
                   target=GPUTarget("cuda", 90, 32))
    knobs.runtime.jit_post_compile_hook(**hook)
    spent.append(clock.take())
print(json.dumps(spent))
"""


def test_the_compile_clock_tells_a_compile_from_a_load(tmp_path):
    """The compile clock charges a build Triton compiles to the "compile" phase and one its on-disk cache holds to
    "load" (a warm-up's build, once per worker): Triton's compilation listener says which from inside the
    compile. A real compile for sm_90 (no GPU needed), then the same from the cache, each between the hooks
    as JITFunction._do_compile fires them; in a process of its own, with a fresh cache and no interpreter
    (whose runs leave the language's builtins patched in this one)."""
    import json
    import os
    import subprocess
    import sys
    script = tmp_path / "compile_twice.py"  # a file: Triton reads a kernel's source from it
    script.write_text(_COMPILE_TWICE)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_INTERPRET="0")
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    spent = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(spent[0]) == {"compile"} and set(spent[1]) == {"load"}, spent
    assert spent[1]["load"] < spent[0]["compile"], spent
