"""The fused Hopper backward (kernels/triton/hopper/backward_fused.py): its machine code read on the CPU
(compiled for sm_90a, disassembled), where it is chosen, and on an sm_90 GPU its gradients against FP64
and against the Hopper dK/dV (marked gpu)."""
import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings

from faverify.cases.inputs import make_inputs
from faverify.cases.strategies import Limits, cases
from faverify.judge.verdict import Tolerance
from faverify.run.evaluate import judge

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"
VARIANTS = [(dtype, block_d, causal) for dtype in ("bf16", "fp16") for block_d in (64, 128) for causal in (False, True)]

# Compiled in a process of its own (kernels defined under the interpreter cannot be compiled), two at a time
_COMPILE = """
import json, sys, triton
from concurrent.futures import ProcessPoolExecutor
from triton.backends.compiler import GPUTarget
from faverify.kernels.triton.build import sass
from faverify.kernels.triton.build.aot import FUSED_BWD_KERNEL, AotBuild
from faverify.kernels.triton.build.sources import _hopper_bwd_source

def build(args):
    source, options, _ = _hopper_bwd_source(AotBuild(FUSED_BWD_KERNEL, *args, True), 90)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    cubin = compiled.asm["cubin"]
    return dict(sass.resources(cubin), warps=compiled.metadata.num_warps, code=sass.disassemble(cubin))

with ProcessPoolExecutor(2) as pool:
    print(json.dumps(list(pool.map(build, json.loads(sys.argv[1])))))
"""


@pytest.fixture(scope="module")
def compiled():
    """{(dtype, padded head dim, causal): cuobjdump's resources, the warps launched and nvdisasm's listing}."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(VARIANTS)], capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(zip(VARIANTS, json.loads(r.stdout.strip().splitlines()[-1])))


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-d{v[1]}-{'causal' if v[2] else 'full'}")
def test_five_wgmmas_a_tile_pair_dq_by_the_bulk_reduce_no_spills(compiled, variant):
    """Each consumer's loop over the query tiles holds five wgmma groups and no other: S = q k^T and dP = dO v^T
    (K = head dim), dV += P^T dO and dK += dS^T q (N = head dim, K = 64 queries), dQ's half = dS k (N = half
    the head dim, K = the tile's 128 keys); no wgmma outside them. dQ leaves through the copy engine's
    bulk tensor reduce-add (UTMAREDG ... ADD, cp.reduce.async.bulk.tensor) in the reducer's loop, which
    holds no wgmma, and nothing adds element by element (no RED or ATOM). No local memory: no stack frame,
    no LDL or STL. Registers: 168 a thread at launch, 12 warps x 32 x 168 <= the SM's 65536, one block per
    SM; setmaxnreg then gives each of the 2 consumer warpgroups 240 and the producer's warpgroup 24 (2 x 240
    + 24 <= 65536 / 128), and no instruction names a register past R239."""
    from faverify.kernels.triton.build.sass import Listing
    from faverify.kernels.triton.hopper import backward_fused as fused
    _, block_d, _ = variant
    got = compiled[variant]
    listing = Listing.of(got["code"])
    opcodes = listing.opcodes()
    assert got["stack"] == 0 and got["local"] == 0, got
    assert not [op for op in opcodes if op.startswith(("LDL", "STL"))]
    assert got["registers"] == fused.MAXNREG and got["warps"] * 32 * got["registers"] <= 65536, got
    consumer, producer = fused.CONSUMER_REGS.value, fused.PRODUCER_REGS.value
    assert listing.setmaxnreg().count(consumer) == fused.CONSUMERS.value and producer in listing.setmaxnreg()
    assert fused.CONSUMERS.value * consumer + producer <= 65536 // 128 and listing.highest_register() < consumer
    per_loop = [listing.groups(first, last) for first, last in listing.loops()]
    mma = [groups for groups in per_loop if groups]
    head = ("64x64x16", block_d // 16)  # S and dP
    update = (f"64x{block_d}x16", 64 // 16)  # dV and dK
    dq = (f"64x{block_d // 2}x16", 128 // 16)
    assert mma == [[head, head, update, update, dq]] * fused.CONSUMERS.value, mma
    assert len(listing.groups()) == 5 * fused.CONSUMERS.value
    reduce = [address for address, text in listing.instructions if "UTMAREDG" in text and ".ADD" in text]
    loops = listing.loops()
    assert reduce and all(any(first <= a <= last and not listing.groups(first, last) for first, last in loops)
                          for a in reduce), reduce
    assert not [op for op in opcodes if op.split(".")[0] in ("RED", "REDG", "ATOM", "ATOMG")]


def test_the_listing_reader_finds_loops_groups_and_spills():
    """Listing on a hand-written listing: a loop is a conditional branch back (an unconditional one is a way
    home), a group ends at its gsb0, and the opcodes keep their modifiers without the predicate."""
    from faverify.kernels.triton.build.sass import Listing
    code = "\n".join([
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        ".L_x_0:",
        "        /*0010*/                   WARPGROUP.ARRIVE ;",
        "        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;",
        "        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;",
        "        /*0040*/                   STL [R1], R200 ;",
        "        /*0050*/               @P0 BRA `(.L_x_0) ;",
        ".L_x_1:",
        "        /*0060*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR4], R88, gsb0 ;",
        "        /*0070*/                   BRA `(.L_x_1) ;",
        "        /*0080*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP1, 0xf0 ;"])
    listing = Listing.of(code)
    assert listing.loops() == [(0x10, 0x50)]
    assert listing.groups(0x10, 0x50) == [("64x64x16", 2)] and listing.groups() == [("64x64x16", 2), ("64x128x16", 1)]
    assert listing.opcodes()[4:6] == ["STL", "BRA"] and listing.setmaxnreg() == [240]
    assert listing.highest_register() == 200


def test_opt_in_and_only_where_the_hopper_dkdv_runs():
    """Launch(fused_backward=True) asks for it; it runs where the Hopper dK/dV can (16-bit on sm_90, padded head
    dim 64 or 128, TMA-aligned, no ALiBi), never under the interpreter; elsewhere the Triton backward runs and
    the path says so."""
    from faverify.kernels.triton import interface
    q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16, device=DEVICE)
    asked = interface.Launch(fused_backward=True)
    hopper = HAS_GPU and torch.cuda.get_device_capability()[0] == 9
    assert not interface._use_hopper_backward(q, q, q, q, None)
    assert interface._use_hopper_backward(q, q, q, q, None, asked) == hopper
    assert not interface._use_hopper_backward(q, q, q, q, (torch.ones(2, device=DEVICE), 0), asked)
    assert not interface._use_hopper_backward(q.float(), q.float(), q.float(), q.float(), None, asked)
    if not hopper:
        x = make_inputs(cases_example(), DEVICE, requires_grad=True)
        interface.take_paths()
        out = interface.flash_attn_func(x.q, x.k, x.v, causal=True, launch=asked)
        out.backward(x.dout)
        assert [p for p in interface.take_paths() if p.startswith("bwd")] == ["bwd triton"]


def cases_example():
    from faverify.cases.case import Case
    return Case(batch=1, seqlen_q=70, seqlen_k=70, nheads=2, nheads_k=1, head_dim=64, dtype="bf16", causal=True)


def test_the_dq_buffer_is_seen_as_head_rows_by_padded_columns():
    """The reducer adds a box of 64 rows by half the padded head dim at [batch x head, row, column] of the dQ
    buffer: the descriptor's view must be dq_buffer's [b, h, s, padded d] memory, rows of one head after
    another, which finish_dq reads."""
    from faverify.kernels.triton.hopper import backward_fused as fused
    q = torch.zeros(2, 5, 3, 40, dtype=torch.bfloat16)
    total = fused.dq_buffer(q, 64)
    dq_desc = fused.descriptors(q, q, q, q, q, q, total, 64)[-1]
    assert list(dq_desc.shape) == [6, 5, 64] and list(dq_desc.strides) == [5 * 64, 64, 1]
    assert list(dq_desc.block_shape) == [1, 64, 32] and dq_desc.base.data_ptr() == total.data_ptr()
    dq_desc.base[1 * 3 + 2, 4, 39] = 7.0  # batch 1, head 2, row 4, column 39
    assert total[1, 2, 4, 39] == 7.0


@pytest.mark.parametrize("block_d", (64, 128))
def test_k_is_one_tile_of_the_key_tile_swizzled_in_spans_of_a_consumers_dq_columns(block_d):
    """dQ's wgmma reads one consumer's columns of all 128 keys' k: k comes in one box of the key tile's rows
    (two boxes of 64 rows wider than their swizzle would lie a column span at a time, not as one tile), and
    its swizzle span is those columns' bytes, so that the second consumer's half starts a span."""
    from triton.experimental.gluon import language as gl

    from faverify.kernels.triton.hopper import backward_fused as fused
    q = torch.zeros(1, 200, 2, block_d, dtype=torch.float16)
    k_desc = fused.descriptors(q, q, q, q, q, q, fused.dq_buffer(q, block_d), block_d)[1]
    assert list(k_desc.block_shape) == [1, fused.CONSUMERS.value * fused.HALF.value, 1, block_d]
    assert k_desc.layout == fused.k_layout(block_d, gl.float16, 4)
    assert k_desc.layout.swizzle_byte_width == fused.dq_cols(block_d) * 2 == block_d


def _is_hopper() -> bool:
    return HAS_GPU and torch.cuda.get_device_capability()[0] == 9


HOPPER_ONLY = pytest.mark.skipif(HAS_GPU and not _is_hopper(), reason="the fused Hopper backward runs on sm_90 only")


@pytest.mark.gpu
@HOPPER_ONLY
@settings(max_examples=40, deadline=None)
@given(cases(limits=Limits(max_seqlen=400, max_batch=2, max_heads=4, max_elements=1 << 17),
             dtypes=("bf16", "fp16"), head_dims=(48, 64, 80, 128), layouts=("contiguous", "transposed", "packed")))
def test_fused_backward_is_right_against_fp64(case):
    """Its gradients pass the verdict against FP64 on random cases (key tails at 64 and 128, query tails,
    causal with seqlen_q != seqlen_k, rows that see no key, GQA summed over the group, large logits), and
    dK and dV are the same bits on a second run (no atomics reach them; a race would show there)."""
    import dataclasses

    from faverify.kernels.triton import interface
    case = dataclasses.replace(case, head_dim=-(-case.head_dim // 16) * 16)  # 16-byte strides: TMA applies
    fused, again = (_gradients(case, interface.Launch(fused_backward=True)) for _ in range(2))
    assert "bwd fused hopper" in fused.pop("paths") and "bwd fused hopper" in again.pop("paths")
    x = fused.pop("inputs")
    metrics = judge(case, x, fused, Tolerance(), ("out", "lse", "dq", "dk", "dv"))
    assert all(m.passed for m in metrics.values()), {t: m.reason for t, m in metrics.items() if not m.passed}
    for name in ("dk", "dv"):
        torch.testing.assert_close(fused[name], again[name], rtol=0, atol=0, equal_nan=True)


@pytest.mark.gpu
@HOPPER_ONLY
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-d{v[1]}-{'causal' if v[2] else 'full'}")
def test_fused_backward_agrees_with_the_hopper_dkdv_and_the_triton_dq(variant):
    """On one case a build (several query and key tiles with tails, a GQA group of 2, seqlen_q > seqlen_k so
    that causal rows see no key): dK and dV within a few units of the last place (of the largest element)
    of the Hopper dK/dV's, which computes the same products, and dQ of the Triton backward's."""
    from faverify.cases.case import Case
    from faverify.kernels.triton import interface
    dtype, block_d, causal = variant
    case = Case(batch=2, seqlen_q=333, seqlen_k=211, nheads=4, nheads_k=2, head_dim=block_d - 16 * (block_d == 128),
                dtype=dtype, causal=causal, seed=7)
    fused = _gradients(case, interface.Launch(fused_backward=True))
    hopper = _gradients(case, interface.Launch(hopper_backward=True))
    assert "bwd fused hopper" in fused["paths"] and "bwd hopper" in hopper["paths"]
    ulp = 2.0 ** -8 if dtype == "bf16" else 2.0 ** -11
    for name in ("dq", "dk", "dv"):
        largest = hopper[name].float().abs().amax()
        assert largest > 0 and (fused[name].float() - hopper[name].float()).abs().amax() <= 8 * ulp * largest, name


def _gradients(case, launch) -> dict:
    from faverify.kernels.triton import interface
    x = make_inputs(case, DEVICE, requires_grad=True)
    interface.take_paths()
    out, lse = interface.flash_attn_func(x.q, x.k, x.v, causal=case.causal, softmax_scale=case.scale,
                                         init=case.init, return_lse=True, launch=launch)
    got = dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (x.q, x.k, x.v), x.dout)))
    return dict(got, out=out, lse=lse, inputs=x, paths=interface.take_paths())
