"""The bundled Triton kernels' variants (variant/forward.py, variant/backward.py): windows, softcap, ALiBi,
sinks, v's own head dim, varlen batches, paged decode with split-KV. Judged by faverify's own reference and
verdict (run/evaluate.py), on the CPU through the interpreter, on the GPU compiled."""
import pytest
import torch

from faverify.cases.case import Case
from faverify.judge.verdict import Tolerance
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve

HAS_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_GPU else "cpu")

# One case per feature, each at an edge that feature invites: a window whose bounds cross tiles and leave
# rows with no key, a cap low enough that tanh bends, per-(batch, head) slopes with seqlen_q != seqlen_k,
# sinks with rows that see nothing, v wider than q/k with an odd q/k head dim.
DENSE = {
    "window": Case(1, 70, 97, 2, 1, 40, dtype="fp32", window=(9, 3), seed=1),
    "window-causal": Case(2, 97, 61, 4, 2, 16, dtype="bf16", causal=True, window=(20, -1), seed=2),
    "softcap": Case(1, 64, 80, 2, 2, 32, dtype="fp16", softcap=2.0, regime="large", seed=3),
    "alibi": Case(2, 33, 90, 2, 1, 24, dtype="fp32", alibi="batch-head", seed=4),
    # more queries than keys: key tiles after every row's position (the first query tiles), across it and
    # before it (the last), each a way of computing the bias (variant.forward.alibi_split)
    "alibi-tiles-after-across-and-before": Case(1, 200, 70, 2, 1, 32, dtype="fp32", alibi="head", seed=8),
    "sinks": Case(1, 90, 40, 2, 2, 32, dtype="bf16", causal=True, sinks="around", seed=5),
    "head_dim_v": Case(1, 50, 70, 2, 1, 40, dtype="fp32", head_dim_v=72, seed=6),
    "everything": Case(1, 65, 100, 4, 2, 24, dtype="bf16", causal=True, window=(30, -1), softcap=5.0,
                       alibi="head", sinks="around", head_dim_v=16, seed=7),
    # a sink above logits near 1e12: the GPU's fma contraction of z / scale into z / scale - M gave every
    # row lse inf
    "sinks-above-logits-1e12": Case(1, 65, 63, 4, 2, 192, dtype="bf16", regime="bf16-scale", window=(49, 57),
                                    alibi="batch-head", sinks="above", head_dim_v=64, init="-1e30", seed=13514),
    # fp32 logits near 1e10 cannot tell the sink from the key: they share the weight, dS reaches 1e5, and
    # its fp16 operand was inf (dk NaN; common.saturate); a row with no key had dsinks NaN on the H200
    "sinks-tied-with-a-key-fp16": Case(1, 17, 1, 1, 1, 16, dtype="fp16", regime="bf16-scale", sinks="above",
                                       head_dim_v=64, seed=0),
    "sinks-row-without-keys-fp16": Case(1, 2, 1, 1, 1, 32, dtype="fp16", regime="bf16-scale", window=(-1, 0),
                                        sinks="above", seed=0),
}


def _passes(subject, case):
    r = evaluate(subject, case, DEVICE, tolerance=Tolerance())
    assert r.status == "pass", (r.status, r.reason)
    return r


@pytest.mark.parametrize("name", list(DENSE))
def test_each_variant_is_right_against_fp64_forward_and_backward(name):
    r = _passes(resolve("triton"), DENSE[name])
    judged = set(r.metrics)
    assert {"out", "lse", "dq", "dk", "dv"} <= judged
    if DENSE[name].sinks != "off":
        assert "dsinks" in judged


def test_a_dense_case_runs_the_dense_kernels_and_a_variant_the_variant_kernels():
    """flash_attn_func with no variant keyword is the dense path, bit for bit what it was: the variant
    kernels are reached only when a case uses a variant."""
    from faverify.kernels.triton import interface
    subject = resolve("triton")
    dense = Case(1, 64, 64, 2, 2, 32, dtype="fp32", seed=0)
    assert evaluate(subject, dense, DEVICE, tolerance=Tolerance()).status == "pass"
    paths = evaluate(subject, dense, DEVICE, tolerance=Tolerance()).paths
    assert not any("variant" in p for p in paths), paths
    assert all(p.startswith(("fwd variant", "bwd variant"))
               for p in evaluate(subject, DENSE["window"], DEVICE, tolerance=Tolerance()).paths)
    assert set(interface.PATHS) >= {"fwd variant", "bwd variant", "fwd variant varlen", "fwd variant paged split"}


def test_sinks_and_alibi_take_the_dense_backward_and_beside_a_variant_the_variant_backward():
    """With nothing but sinks and ALiBi, the sinks are in the forward's log2 l, so the dense backward kernels
    take the gradients (variant.interface.backward), causal or not, GQA among them, ALiBi through their
    ALIBI build (its tiles after, across and before the diagonal, slopes per head and per batch); dsinks is
    judged as before. A variant beside them keeps the variant kernels."""
    subject = resolve("triton")
    alone = (DENSE["sinks"], DENSE["sinks-row-without-keys-fp16"],
             Case(1, 40, 70, 4, 2, 64, dtype="fp16", sinks="below", seed=8),
             # fp16 dS past 65504, as in sinks-tied-with-a-key-fp16: dk NaN without the clamp (common.saturate)
             Case(1, 17, 1, 1, 1, 16, dtype="fp16", regime="bf16-scale", sinks="above", seed=0),
             DENSE["alibi"], DENSE["alibi-tiles-after-across-and-before"],
             Case(2, 150, 97, 4, 2, 64, dtype="bf16", causal=True, alibi="batch-head", sinks="around", seed=9))
    for case in alone:
        r = _passes(subject, case)
        backward = [p for p in r.paths if p.startswith("bwd")]
        suffix = " alibi" if case.alibi != "off" else ""
        assert backward and set(backward) <= {"bwd triton" + suffix, "bwd triton generic" + suffix}, (case, r.paths)
        assert {"dq", "dk", "dv"} | ({"dsinks"} if case.sinks != "off" else set()) <= set(r.metrics)
    r = _passes(subject, DENSE["sinks-tied-with-a-key-fp16"])  # v's own head dim beside them
    assert any(p.startswith("bwd variant") for p in r.paths), r.paths


@pytest.mark.skipif(HAS_GPU, reason="the GPU's dense kernels take other tiles (and TMA or the Hopper forward)")
def test_the_variant_kernel_with_no_variant_gives_the_dense_kernels_bits():
    """Same algorithm, same tiles under the interpreter, same order of keys: with no-op variant values the
    variant forward and backward give the dense kernels' bits, so a variant's error is the variant's own."""
    from faverify.cases.inputs import make_inputs
    from faverify.kernels.triton import interface
    from faverify.kernels.triton.variant import interface as vinterface
    for case in (Case(2, 97, 130, 4, 2, 40, dtype="bf16", causal=True, seed=11),
                 Case(1, 64, 33, 2, 1, 64, dtype="fp16", seed=12)):
        x = make_inputs(case, "cpu", requires_grad=True)
        dense = interface.FlashAttnFunction.apply(x.q, x.k, x.v, case.causal, case.scale, "-inf", interface.DEFAULT)
        var = vinterface.KernelVariant.of(case.scale, case.causal, (-1, -1), 0.0, None, None)
        other = vinterface.attention(x.q, x.k, x.v, var)
        assert len(dense) == len(other) == 4  # out, lse and the rows' statistics
        for a, b in zip(dense, other):
            assert torch.equal(a, b)
        for a, b in zip(torch.autograd.grad(dense[0], (x.q, x.k, x.v), x.dout),
                        torch.autograd.grad(other[0], (x.q, x.k, x.v), x.dout)):
            assert torch.equal(a, b)


RAGGED = {
    "varlen": Case.of(3, 70, 97, 2, 1, 24, dtype="bf16", causal=True, seqlens=((5, 7), (0, 3), (70, 97)), tail=3,
                      seed=8),
    "varlen-empty-keys-sinks": Case.of(2, 33, 40, 2, 2, 16, dtype="fp32", sinks="around", seqlens=((33, 0), (1, 40)),
                                       seed=9),
    "varlen-window-dv": Case.of(2, 65, 65, 4, 2, 40, dtype="fp16", window=(5, 5), head_dim_v=24,
                                seqlens=((65, 65), (64, 1)), seed=10),
}
PAGED = {
    "decode": Case.of(3, 1, 200, 2, 1, 32, dtype="bf16", cache_seqlens=(17, 0, 200), page_size=7, pages="random",
                      splits=3, seed=13),
    "prefill-causal-window": Case.of(2, 9, 150, 4, 2, 24, dtype="fp16", causal=True, window=(40, -1),
                                     cache_seqlens=(150, 9), page_size=16, pages="shared", splits=4, seed=14),
    "softcap-alibi-one-split": Case.of(2, 5, 64, 2, 2, 16, dtype="fp32", softcap=3.0, alibi="head",
                                       cache_seqlens=(64, 31), page_size=1, pages="reverse", splits=1, seed=15),
    "more-splits-than-blocks": Case.of(1, 3, 40, 2, 1, 16, dtype="bf16", window=(0, 0), cache_seqlens=(40,),
                                       page_size=3, pages="in-order", splits=16, seed=16),
}


@pytest.mark.parametrize("name", list(RAGGED))
def test_varlen_is_right_against_fp64_and_touches_nothing_past_its_sequences(name):
    """The inputs' margins, the gaps and the tail hold NaN: a read past a sequence poisons out."""
    r = _passes(resolve("triton-varlen"), RAGGED[name])
    assert {"out", "lse", "dq", "dk", "dv"} <= set(r.metrics)


@pytest.mark.parametrize("name", list(PAGED))
def test_paged_decode_and_its_split_partials_are_right_against_fp64(name):
    r = _passes(resolve("triton-paged"), PAGED[name])
    assert {"out", "lse", "out_splits", "lse_splits"} <= set(r.metrics)


def test_the_split_rule_fills_the_sms_and_no_more():
    from faverify.kernels.triton.interface import num_splits_for
    from faverify.kernels.triton.variant.interface import SPLIT_BLOCK
    assert num_splits_for(1, 8, 1, 1 << 15, 132) == 17  # 8 programs: 17 splits fill 132 SMs
    assert num_splits_for(64, 32, 1, 1 << 15, 132) == 1  # 2048 programs fill them already
    assert num_splits_for(1, 1, 1, SPLIT_BLOCK * 3, 132) == 3  # no more splits than blocks of keys
    assert num_splits_for(1, 1, 1, 1 << 20, 132) == 128  # at most MAX_SPLITS
    assert num_splits_for(1, 1, 1, 0, 132) == 1


def test_the_split_rule_counts_the_packed_decode_s_programs():
    """Where the decode kernel packs a GQA group into its rows, a program is a (batch, kv head, tile of 16
    rows), and the splits fill the 3 slots an SM has for them once: 32 query heads over 4 kv heads at
    seqlen_q 1 are 4 programs, 99 splits on 132 SMs (396 programs, one wave), where 32 per-head programs
    take 5 (one program an SM)."""
    from faverify.kernels.triton.interface import num_splits_for
    from faverify.kernels.triton.launch import Launch
    assert num_splits_for(1, 32, 1, 1 << 17, 132, 4) == 99
    assert num_splits_for(32, 32, 1, 1 << 12, 132, 4) == 3  # 128 programs: 384 in one wave, not 512 in two
    assert num_splits_for(1, 32, 4, 1 << 17, 132, 4) == 49  # 8 x 4 rows a kv head: 2 tiles each
    assert num_splits_for(1, 32, 17, 1 << 17, 132, 4) == 5  # past DECODE_ROWS: per head
    assert num_splits_for(128, 32, 1, 1 << 12, 132, 4) == 1  # 512 programs are more than a wave already
    assert num_splits_for(1, 32, 1, 1 << 17, 132, 4, Launch(packed_decode=False)) == 5


def _inputs():
    q = torch.randn(2, 8, 4, 16, device=DEVICE)
    return q, torch.randn(2, 8, 2, 16, device=DEVICE), torch.randn(2, 8, 2, 16, device=DEVICE)


@pytest.mark.parametrize("kwargs, message", [
    (dict(window_size=(-2, 0)), "window_size must be (left, right), each an int >= -1"),
    (dict(window_size=5), "window_size must be (left, right)"),
    (dict(softcap=-1.0), "softcap must be a finite number >= 0 (0: off), got -1.0"),
    (dict(softcap=float("nan")), "softcap must be a finite number >= 0"),
    (dict(alibi_slopes=torch.ones(3)),
     "alibi_slopes must be a float32 tensor of shape [4] or [2, 4], got torch.float32 (3,)"),
    (dict(alibi_slopes=torch.ones(4, dtype=torch.float16)), "alibi_slopes must be a float32 tensor"),
    (dict(sinks=torch.ones(2, 4)), "sinks must be a float32 tensor of shape [4], got torch.float32 (2, 4)"),
])
def test_bad_variant_arguments_name_the_argument_and_the_rule(kwargs, message):
    from faverify.kernels.triton import flash_attn_func
    q, k, v = _inputs()
    kwargs = {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in kwargs.items()}
    with pytest.raises(ValueError, match=None) as e:
        flash_attn_func(q, k, v, **kwargs)
    assert message in str(e.value), str(e.value)


def test_bad_varlen_offsets_are_refused_before_any_launch():
    from faverify.kernels.triton import flash_attn_varlen_func
    q, k, v = (t.reshape(-1, *t.shape[2:]) for t in _inputs())  # 16 tokens each
    cu = torch.tensor([0, 5, 16], dtype=torch.int32, device=DEVICE)
    for args, message in (
            ((torch.tensor([0, 9, 5], dtype=torch.int32, device=DEVICE), cu, 9, 11),
             "cu_seqlens_q must be non-decreasing from >= 0, got [0, 9, 5]"),
            ((cu, torch.tensor([0, 5, 17], dtype=torch.int32, device=DEVICE), 11, 11),
             "cu_seqlens_k ends at 17, past the 16 tokens of its tensor"),
            ((cu, cu, 10, 11), "max_seqlen_q must be an int >= the longest sequence (11), got 10"),
            ((cu.long(), cu, 11, 11), "cu_seqlens_q must be a 1-dimensional int32 tensor, got torch.int64"),
            ((cu, cu[:2], 11, 11), "cu_seqlens_k must have 3 entries, got 2")):
        with pytest.raises(ValueError) as e:
            flash_attn_varlen_func(q, k, v, *args)
        assert message in str(e.value), str(e.value)


def test_bad_cache_arguments_are_refused_before_any_launch():
    from faverify.kernels.triton import flash_attn_with_kvcache
    q = torch.randn(2, 1, 4, 16, device=DEVICE)
    pool = torch.randn(5, 4, 2, 16, device=DEVICE)  # 5 pages of 4 tokens
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEVICE)
    lengths = torch.tensor([8, 3], dtype=torch.int32, device=DEVICE)
    for args, kwargs, message in (
            ((lengths + 1, table), {}, "cache_seqlens[0] = 9 must be in 0..8 (max_pages 2 x page_size 4)"),
            ((lengths, table + 3), {}, "block_table[1] names page 5, outside the pool's 5 pages"),
            ((lengths, table[:1]), {}, "block_table must be an int32 tensor [batch=2, max_pages]"),
            ((lengths, table), {"num_splits": -1},
             "num_splits must be an int >= 0 (0: chosen by the launcher), got -1")):
        with pytest.raises(ValueError) as e:
            flash_attn_with_kvcache(q, pool, pool, *args, **kwargs)
        assert message in str(e.value), str(e.value)
    # entries past a sequence's pages are never read: any value may sit there (-1 here)
    unused = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32, device=DEVICE)
    assert flash_attn_with_kvcache(q, pool, pool, lengths, unused).shape == q.shape


@pytest.mark.parametrize("kind", ["triton", "triton-varlen", "triton-paged"])
def test_the_warm_up_compiles_each_common_variant_build_once(kind):
    """On a GPU a fuzz first runs Subject.warmup, one case per build, so its workers load the kernels from
    Triton's cache instead of each compiling them: one case per (padded head dim, dtype, switches), each a
    case the subject takes."""
    from faverify.kernels.triton.common import BLOCK_DS, block_d
    from faverify.kernels.triton.subject import variant_warmup_cases
    warm = variant_warmup_cases(("bf16", "fp16"), kind)
    switches = ("bias", "bias_dtype", "bias_grad", "mask")
    builds = {(c.dtype, block_d(c.head_dim), c.head_dim == block_d(c.head_dim), c.softcap > 0, c.seqlen_q <= 16,
               c.window, c.causal, c.alibi, c.sinks, *(c.flat()[f] for f in switches)) for c in warm}
    # per padded head dim, dtype and softcap, the fast build and the generic one: the paged decode's and
    # prefill's tiles; for triton, the plain build, and (generic) a bias's in the inputs' dtype and in
    # fp32, each with and without its gradient, and a block mask's
    each = {"triton": 2 + 5, "triton-varlen": 2, "triton-paged": 4}[kind]
    assert len(builds) == len(warm) == len(BLOCK_DS) * 2 * 2 * each
    subject = resolve(kind)
    assert all(subject.unsupported(c, DEVICE) is None for c in warm), [subject.unsupported(c, DEVICE) for c in warm]
    small = next(c for c in warm if c.head_dim == 16 and c.softcap > 0 and c.alibi != "off")
    _passes(subject, small)


# The Hopper forward's variants (interface._hopper_variant): windows crossing tiles at both ends, rows that
# see no key, one key per row, a cap that bends, ALiBi per head and per batch, sinks about the rows' lse and
# far above it (all weight on the sink), all four at once, the third consumer of d64's 192-row blocks, a
# head dim padded to 128, fp16 and bf16; the backward is the variant kernels' on its row statistics.
HOPPER = {
    "window-both-bounds": Case(1, 300, 333, 2, 1, 64, dtype="bf16", window=(100, 20), seed=21),
    "window-causal-empty-rows": Case(2, 257, 200, 4, 2, 128, dtype="fp16", causal=True, window=(64, -1), seed=22),
    "softcap-large": Case(1, 190, 700, 2, 2, 128, dtype="bf16", softcap=5.0, regime="large", seed=23),
    "softcap-causal": Case(1, 200, 260, 2, 2, 64, dtype="fp16", causal=True, softcap=2.0, seed=24),
    "window-0-0-softcap": Case(1, 400, 129, 2, 1, 64, dtype="bf16", window=(0, 0), softcap=3.0, seed=25),
    "window-wide-d112": Case(1, 1000, 1000, 1, 1, 112, dtype="bf16", window=(3, 200), seed=26),
    "window-left-only-long": Case(1, 2048, 4096, 2, 2, 128, dtype="bf16", window=(300, -1), seed=27),
    "alibi-causal": Case(1, 300, 333, 4, 2, 128, dtype="bf16", causal=True, alibi="head", seed=28),
    "alibi-per-batch-window": Case(2, 200, 170, 2, 1, 64, dtype="fp16", window=(40, 7), alibi="batch-head", seed=29),
    "alibi-tiles-after-across-and-before": Case(1, 300, 140, 2, 2, 128, dtype="bf16", alibi="head", seed=33),
    "sinks-around": Case(1, 257, 300, 2, 2, 128, dtype="bf16", sinks="around", seed=30),
    "sinks-above-causal-empty-rows": Case(1, 300, 200, 2, 1, 64, dtype="bf16", causal=True, sinks="above", seed=31),
    "all-four": Case(1, 400, 500, 2, 2, 128, dtype="fp16", window=(64, 16), softcap=4.0, alibi="head", sinks="below",
                     seed=32),
}


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Hopper forward runs on sm_90 only")
@pytest.mark.parametrize("name", list(HOPPER))
def test_the_hopper_forward_runs_its_variants_right_against_fp64(name):
    r = _passes(resolve("triton"), HOPPER[name])
    case = HOPPER[name]
    # sinks and ALiBi without a window or softcap: the dense backward (KernelVariant.backward_is_dense)
    backward = "bwd triton" if tuple(case.window) == (-1, -1) and not case.softcap else "bwd variant"
    assert "fwd hopper variant" in r.paths and any(p.startswith(backward) for p in r.paths), r.paths
    assert {"out", "lse", "dq", "dk", "dv"} <= set(r.metrics)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Hopper forward runs on sm_90 only")
def test_the_hopper_forward_declines_what_it_does_not_run():
    """v's own head dim, fp32 and a bias go to the variant forward."""
    import dataclasses
    base = HOPPER["window-both-bounds"]
    for case in (dataclasses.replace(base, head_dim_v=32), dataclasses.replace(base, dtype="fp32"),
                 base.replace(bias="normal")):
        r = _passes(resolve("triton"), case)
        assert any(p.startswith("fwd variant") for p in r.paths) and "fwd hopper variant" not in r.paths, \
            (case, r.paths)


@pytest.mark.gpu
def test_the_paged_kernel_reads_pages_past_two_to_the_31_elements():
    """129 pages of 2^16 tokens x 256 (2^31 + 2^24 elements, 4 GiB in bf16), the sequence's page the last
    one: an int32 page offset would wrap and read the wrong page (test_ragged.py plants that bug)."""
    import dataclasses

    from faverify.cases.ragged import page_table
    from faverify.cases.ragged_draws import INT32_ELEMENTS
    c = Case.of(1, 1, 4, 1, 1, 256, dtype="bf16", cache_seqlens=(4,), page_size=1 << 16, pages="random", pool=129)
    page = c.paged.page_size * c.head_dim
    seed = next(s for s in range(2000) if page_table(dataclasses.replace(c, seed=s))[0][0][0] * page >= INT32_ELEMENTS)
    _passes(resolve("triton-paged"), dataclasses.replace(c, seed=seed))


class _Recorder:
    """A kernel that runs nothing and records the build a launch would compile: the dtype of each tensor
    (Triton compiles per pointer type: a bias in fp32 and one in the inputs' dtype are two builds), its
    compile-time arguments (ALL_CAPS) and launch options; not the runtime values passed by keyword (a
    window's bounds, the softcap's scales)."""

    def __init__(self, name: str, seen: set):
        self.name, self.seen = name, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            build = {k: v for k, v in kwargs.items() if k.isupper() or k in ("num_warps", "num_stages")}
            dtypes = tuple(str(a.dtype) for a in args if isinstance(a, torch.Tensor))
            self.seen.add((self.name, dtypes, tuple(sorted(build.items()))))
        return launch


@pytest.mark.parametrize("kind", ["triton", "triton-varlen", "triton-paged"])
def test_the_warm_up_launches_every_variant_build_a_fuzz_draws(kind, monkeypatch):
    """Every variant-kernel build that 300 drawn bf16/fp16 cases launch is one the warm-up launches too
    (recorded from the launchers, with kernels that run nothing): a build it missed would compile in each
    GPU worker that meets it. The tiles are the interpreter's, the decisions that pick a build the GPU's
    (its shared padding of q/k and v too)."""
    from faverify.cases.strategies import CPU_LIMITS
    from faverify.kernels.triton.dense import backward as dbackward
    from faverify.kernels.triton.dense import forward as dforward
    from faverify.kernels.triton.subject import variant_warmup_cases
    from faverify.kernels.triton.variant import backward as vbackward
    from faverify.kernels.triton.variant import decode as vdecode
    from faverify.kernels.triton.variant import forward as vforward
    from faverify.kernels.triton.variant import interface as vinterface
    from faverify.run.draw import draw_cases
    from faverify.run.evaluate import exercise
    from faverify.run.plan import FuzzPlan
    seen: set = set()
    monkeypatch.setattr(vinterface, "SHARED_PADDING", True)
    for module, name in ((vforward, "_fwd_kernel"), (vforward, "_combine_kernel"),
                         (vbackward, "_dkdv_kernel"), (vbackward, "_dq_kernel"),
                         (vforward, "_fwd_kernel_fast"), (vbackward, "_dkdv_kernel_fast"),
                         (vbackward, "_dq_kernel_fast"), (vdecode, "_decode_kernel"),
                         (vdecode, "_decode_kernel_fast")):
        monkeypatch.setattr(module, name, _Recorder(name, seen))
    # the dense kernels, which cases with a feature they take launch (ALiBi alone, a loss on lse, the max
    # logit), run nothing either: their builds are test_triton_kernels.py's to check, and under the
    # interpreter they were nearly all of this test's time
    for module, name in ((dforward, "_fwd_kernel"), (dbackward, "_bwd_preprocess"), (dbackward, "_bwd_dkdv"),
                         (dbackward, "_bwd_dq")):
        monkeypatch.setattr(module, name, _Recorder(name, set()))  # recorded nowhere
    subject = resolve(kind)
    dtypes = ("bf16", "fp16")

    def builds(cases) -> set:
        seen.clear()
        for case in cases:  # the dense cases run the dense kernels, the sparse ones sparse.py: tests of their own
            if case.features() and case.sparse is None:
                exercise(subject, case, DEVICE)
        return set(seen)

    plan = FuzzPlan(iters=300, seed=5, dtypes=dtypes, limits=CPU_LIMITS, database=None,
                    features=subject.caps.features(), narrow={"ragged_only": True} if kind != "triton" else None)
    drawn = builds(draw_cases(plan))
    warmed = builds(variant_warmup_cases(dtypes, kind))
    assert {b[0] for b in drawn} >= {"_fwd_kernel"} and drawn <= warmed, sorted(drawn - warmed)


@pytest.mark.parametrize("precise", [True, False], ids=["fp32-build", "16-bit-build"])
def test_the_softcap_derivative_keeps_its_precision_where_the_cap_saturates(precise):
    """common.tanh_slope against FP64 over |x| up to 40: 1 - tanh^2 from an fp32 tanh is 0 past |x| = 9,
    where the derivative is still 6e-8 (a fuzz case with softcap 5 and logits 30x normal lost dq and dk
    there); the slope must keep fp32's relative precision down to e^-80, and the tanh its own: to fp32's
    rounding in the fp32 builds (PRECISE), to 5e-5 in the 16-bit ones (a tiny logit's lse is the logit)."""
    from property_tests.triton_probes import tanh_slope_probe

    x = torch.cat([torch.linspace(-40, 40, 1001), torch.tensor([0.0, 1e-30, -1e-7, 3e-4, 0.0121, 0.0123, 0.2499,
                                                                 0.25, 9.0, -9.0, 17.3])])
    x = torch.nn.functional.pad(x, (0, 1024 - x.numel())).to(DEVICE)
    t, d = torch.empty_like(x), torch.empty_like(x)
    tanh_slope_probe[(1,)](x, t, d, N=1024, PRECISE=precise)
    exact_t = torch.tanh(x.double())
    exact_d = 1.0 / torch.cosh(x.double()) ** 2
    bound = 4e-7 if precise else 6e-5
    rel_t = (t.double() - exact_t).abs() / exact_t.abs().clamp(min=1e-300)
    assert rel_t.max() <= bound, (rel_t.max(), x[rel_t.argmax()])
    rel = (d.double() - exact_d).abs() / exact_d
    assert rel.max() < 1e-5, (rel.max(), x[rel.argmax()])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU or torch.cuda.get_device_capability()[0] != 9,
                    reason="hopper.layouts.tanh_approx is Gluon for sm_90 (PTX's tanh.approx.f32), no interpreter")
def test_the_hopper_forwards_tanh_keeps_its_relative_error_and_saturates():
    """hopper.layouts.tanh_approx (the Hopper forward's softcap) against FP64: a relative error under
    2^-10.9 at every x, tiny ones included (a row with one key has its capped logit for lse), +-1 past
    |x| = 10, and the sign of x; a NaN logit stays NaN."""
    from property_tests.triton_probes import tanh_approx_probe

    x = torch.cat([torch.linspace(-40, 40, 1001), torch.tensor([0.0, 1e-30, -1e-7, 3e-4, 0.0121, -0.0123, 0.2499,
                                                                 10.0, -10.0, 60.0, -60.0, 1e30, -1e30,
                                                                 float("inf"), -float("inf"), float("nan")])])
    x = torch.nn.functional.pad(x, (0, 1024 - x.numel())).to(DEVICE)
    t = torch.empty_like(x)
    tanh_approx_probe[(1,)](x, t, N=1024, num_warps=4)
    exact = torch.tanh(x.double())
    finite = ~x.isnan()
    rel = (t.double() - exact).abs()[finite] / exact[finite].abs().clamp(min=1e-300)
    assert rel.max() <= 2 ** -10.9, (rel.max(), x[finite][rel.argmax()])
    assert (t[x.abs() >= 10] == x[x.abs() >= 10].sign()).all() and t[x.isnan()].isnan().all()
    assert ((t > 0) == (x > 0))[finite & (x != 0)].all()


DECODE_CASES = {  # paged caches with a few query rows a sequence: GQA groups packed into the decode tile
    "gqa8-decode": Case.of(2, 1, 45, 8, 1, 64, dtype="bf16", cache_seqlens=(45, 13), page_size=8, pages="random",
                           seed=7),
    "gqa4-window-softcap-alibi-splits": Case.of(3, 1, 150, 8, 2, 128, dtype="fp16", cache_seqlens=(150, 1, 77),
                                                page_size=16, pages="random", window=(9, -1), softcap=5.0,
                                                alibi="head", seed=9, splits=3),
    # a tile's rows are (head, query) pairs: group and seqlen_q with a common factor, where a mapping that
    # is no bijection (row r as head r % group and query r % seqlen_q) leaves pairs uncomputed
    "gqa4-two-queries-causal": Case.of(1, 2, 50, 8, 2, 64, dtype="bf16", cache_seqlens=(50,), page_size=16,
                                       causal=True, seed=11),
    "gqa3-five-queries-causal-window": Case.of(2, 5, 70, 6, 2, 40, dtype="bf16", cache_seqlens=(70, 0), page_size=7,
                                               causal=True, window=(3, 2), alibi="batch-head", seed=3, splits=2),
    "gqa16-rows-past-one-tile": Case.of(1, 3, 33, 16, 1, 32, dtype="bf16", cache_seqlens=(33,), page_size=1,
                                        head_dim_v=64, seed=5),
    "mha-16-rows-fp32": Case.of(1, 16, 100, 4, 4, 64, dtype="fp32", cache_seqlens=(100,), page_size=16, causal=True,
                                seed=4),
}


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_the_packed_decode_matches_fp64_and_so_does_the_per_head_path(name, packed):
    """Launch.packed_decode: a paged cache's few query rows go to the decode kernel, which packs
    the query heads of a kv head into one tile (rows past one tile, GQA 1 to 16, windows, softcap, ALiBi,
    splits, an empty cache, pages of 1 and 7 keys); without it, to the per-head forward. Both against
    FP64, on any device."""
    import dataclasses

    from faverify.kernels.triton.launch import Launch
    paged, launch = resolve("triton-paged"), Launch(packed_decode=packed)
    subject = dataclasses.replace(paged, fn=lambda *args, **kwargs: paged.fn(*args, launch=launch, **kwargs))
    r = evaluate(subject, DECODE_CASES[name], DEVICE, mode="fwd")
    assert r.status == "pass", (r.status, r.reason)
    assert r.paths and all(p.startswith("fwd variant decode" if packed else "fwd variant paged") for p in r.paths), \
        r.paths


def test_the_decode_kernel_writes_every_split_partial(monkeypatch):
    """The decode's split partials are allocated empty (a decode step launches no fill ahead of its kernel):
    every entry must be the kernel's, those of splits that see no key included (out 0, lse -inf). Here
    every float allocation comes filled with NaN, so an entry left unwritten poisons the partials' verdict
    and the combined out."""
    real = torch.empty

    def poisoned(*args, **kwargs):
        t = real(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)
    case = Case.of(2, 1, 100, 8, 2, 32, dtype="bf16", cache_seqlens=(100, 0), page_size=16, pages="random",
                   splits=9, seed=21)
    r = evaluate(resolve("triton-paged"), case, DEVICE, mode="fwd")
    assert r.status == "pass", (r.status, r.reason)
    assert {"out", "lse", "out_splits", "lse_splits"} <= set(r.metrics)
    assert r.paths and all(p.startswith("fwd variant decode split") for p in r.paths), r.paths


def test_the_no_alibi_and_no_sinks_vectors_are_kept_from_call_to_call():
    from faverify.kernels.triton.variant.args import _filled
    zeros = _filled(6, 0.0, DEVICE)
    assert zeros is _filled(6, 0.0, DEVICE) and (zeros == 0).all() and zeros.dtype == torch.float32
    assert _filled(6, float("-inf"), DEVICE).isneginf().all()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="CUDA graph capture needs a GPU")
def test_a_vector_first_made_inside_a_cuda_graph_capture_is_not_kept(monkeypatch):
    """Inside a capture the fill is only recorded: kept, the vector would hold nothing for a later eager
    call until the graph were replayed."""
    from faverify.kernels.triton.variant import args as vargs
    monkeypatch.setattr(vargs, "_KEPT", {})
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        vargs._filled(8, -1.5, "cuda")
    assert not vargs._KEPT
    outside = vargs._filled(8, -1.5, "cuda")
    assert (outside == -1.5).all() and vargs._filled(8, -1.5, "cuda") is outside


def test_the_warm_up_runs_both_builds_of_each_hopper_forward_it_reaches():
    """The Hopper forward has a build for seqlens that are both multiples of 16 and one for any others
    (hopper.forward.kernel): the warm-up runs each of its compiled variants (dtype, head dim, causal and
    the switches) at both, so no GPU worker compiles one when a drawn case has seqlens 128 or 1024."""
    from faverify.cases.vocabulary import FEATURES
    from faverify.kernels.triton.hopper import forward as hopper_forward
    from faverify.kernels.triton.subject import WARMUPS

    def hopper(c) -> bool:  # interface._use_hopper and _hopper_variant, off the GPU
        return (c.dtype in ("bf16", "fp16") and c.layout == "contiguous" and c.head_dim % 16 == 0
                and 48 <= c.head_dim <= 128 and c.head_dim_v is None and c.mask is None and c.bias is None)

    builds: dict = {}
    for c in WARMUPS["triton"](("bf16", "fp16"), FEATURES):
        if hopper(c):
            key = (c.dtype, c.head_dim > 64, c.causal, c.window != (-1, -1), c.softcap > 0, c.alibi != "off",
                   c.sinks != "off")
            builds.setdefault(key, set()).add(hopper_forward.kernel(c.seqlen_q, c.seqlen_k))
    # per dtype and head dim: dense causal or not, the 8 switch sets with a window, the 7 without causal or not
    assert len(builds) == 2 * 2 * (2 + 8 + 7 * 2)
    both = {hopper_forward._fwd_hopper, hopper_forward._fwd_hopper_aligned}
    assert all(found == both for found in builds.values()), [k for k, found in builds.items() if found != both]


def test_the_warm_up_compiles_only_what_the_drawn_features_need():
    """subject.for_features: a fuzz that draws no feature warms the dense kernels only; one that draws
    windows warms no softcap, bias or block-mask build, and its cases keep the window but drop ALiBi (a
    runtime value: no build of its own); the Hopper forward's builds (its window, ALiBi and sinks are
    compile-time) only for switch sets wholly drawn: 15 sets of window, softcap, ALiBi and sinks, the 7
    without a window causal or not, at head dims 64 and 128 and each 16-bit dtype, each at seqlens that
    are multiples of 16 and at others."""
    from faverify.cases.vocabulary import FEATURES
    from faverify.kernels.triton.subject import WARMUPS, hopper_variant_warmup_cases
    dtypes = ("bf16", "fp16")
    assert len(hopper_variant_warmup_cases(dtypes)) == 2 * 2 * (15 + 7) * 2
    everything = WARMUPS["triton"](dtypes, FEATURES)
    dense = WARMUPS["triton"](dtypes, ())
    assert dense and all(c.features() == () for c in dense) and len(dense) < len(everything)
    windows = WARMUPS["triton"](dtypes, ("window",))
    assert {c.features() for c in windows} == {(), ("window",)}
    assert len(WARMUPS["triton"](dtypes, ("window",))) < len(WARMUPS["triton"](dtypes, ("window", "softcap")))
    assert len({c for c in everything}) == len(everything)  # no case twice
    paged = WARMUPS["triton-paged"](dtypes, ("paged",))
    assert paged and all(set(c.features()) <= {"paged", "splits"} for c in paged)
    assert all(c.softcap == 0 for c in paged)


@pytest.mark.parametrize("case", [
    Case(1, 90, 40, 2, 1, 32, dtype="bf16", causal=True, max_logit=True, seed=21),  # rows that see no key
    Case(1, 40, 64, 4, 2, 24, dtype="fp16", softcap=3.0, alibi="head", sinks="above", max_logit=True, seed=22),
    # a finfo.min bias beside a sink: log2 l overflows to +inf on a row that saw its key
    Case.of(1, 1, 1, 1, 1, 16, dtype="bf16", sinks="around", bias="min", max_logit=True, seed=0),
    Case(1, 33, 47, 2, 2, 40, dtype="fp32", window=(5, 2), softmax_scale=0.3, max_logit=True, seed=23),
], ids=["dense-causal-empty-rows", "softcap-alibi-sinks", "min-bias-sink", "window-fp32"])
def test_the_max_logit_is_each_rows_largest_scaled_logit(case):
    """return_max_logit: the largest logit a row sees after scale, softcap, ALiBi and bias, never the sink's,
    -inf where a row sees no key; judged against the FP64 reference on the dense and the variant kernels."""
    result = evaluate(resolve("triton"), case, DEVICE, mode="fwd")
    assert result.status == "pass", result.reason
    assert "max_logit" in result.metrics


@pytest.mark.parametrize("case", [
    Case.of(2, 5, 40, 4, 2, 32, dtype="bf16", sparse="duplicates", topk=20, seed=31),  # keys listed twice
    Case.of(1, 9, 30, 2, 1, 24, dtype="fp16", sparse="invalid", topk=17, lse_grad="with", seed=32),  # -1 slots, rows
    Case.of(1, 6, 12, 2, 2, 40, dtype="fp32", sparse="out-of-range", topk=12, head_dim_v=24, seed=33),
    Case.of(1, 4, 7, 3, 1, 16, dtype="bf16", sparse="distinct", topk=9, max_logit=True, seed=34),  # topk > keys
], ids=["duplicates", "invalid-lse-grad", "out-of-range-dv", "distinct-past-the-keys"])
def test_the_sparse_kernel_gathers_the_listed_keys_forward_and_backward(case):
    """kernels/triton/sparse.py against the FP64 reference of the listed keys: duplicates weigh twice, -1 and
    indices past seqlen_k name no key, a row with none gives out 0 and lse -inf; dk and dv by atomics."""
    result = evaluate(resolve("triton"), case, DEVICE, mode="both")
    assert result.status == "pass", result.reason
    assert {"dq", "dk", "dv"} <= set(result.metrics) and {"fwd sparse", "bwd sparse"} <= set(result.paths)


def test_the_sparse_kernel_skips_a_variant_it_does_not_take_naming_it():
    case = Case.of(1, 4, 8, 2, 1, 16, dtype="bf16", sparse="distinct", topk=4, softcap=5.0, seed=35)
    result = evaluate(resolve("triton"), case, DEVICE, mode="fwd")
    assert result.status == "skip" and "softcap" in result.reason and "indices" in result.reason, result.reason
