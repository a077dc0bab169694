"""Large cases (faverify/cases/large.py, `fuzz --scale large`): offsets past 2^31 - 1.

No test here allocates a case past 2^31 elements: the draw at 2^31 is checked by arithmetic, and the draw,
the partial reference and the judge run on the small analogue, whose boundary is planted_large.WRAP (2^12)
elements, through the same code. The memory guard is checked against cards of stated sizes."""
import dataclasses

import pytest
import torch

from faverify.cases import large
from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.cases.ragged import page_table
from faverify.cases.strategies import CPU_LIMITS, GPU_LIMITS
from faverify.judge.judging import judge
from faverify.judge.partial import narrowed
from faverify.judge.reference import reference
from faverify.judge.verdict import Tolerance
from faverify.run.draw import draw_cases
from faverify.run.evaluate import MODES, evaluate
from faverify.run.plan import FuzzPlan
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json
from property_tests.planted_large import WRAP

ANALOGUE = {"boundary": WRAP, "head_dims": (16,), "exact_head_dims": True}
SEED = 5
GIB = 1 << 30


def _draw(count: int, limits=CPU_LIMITS, narrow=None, dtypes=("fp32",)) -> list:
    """The first `count` large cases of seed SEED, as a fuzz of a subject with dense and paged cases draws them."""
    print(f"seed {SEED}")
    plan = FuzzPlan(iters=count, seed=SEED, dtypes=dtypes, limits=limits, database=None, narrow=narrow,
                    features=("paged",), scale="large")
    return draw_cases(plan)


def _target(case: Case, boundary: int) -> str:
    """Which offsets of a drawn case cross the boundary: its target (cases/large.TARGETS)."""
    if case.kind == "paged":
        return "pool"
    crossing = {name for name, per in large.spaces(case) if case.batch * per > boundary}
    return "q" if "q" in crossing else "kv" if "k" in crossing else "accumulator"


def _real(t: torch.Tensor, offset: int) -> bool:
    """The elements at `offset` - 1 and `offset` of t's store, counted from its first element, are drawn
    values (not the NaN of a margin, an unused page or a gap)."""
    pair = torch.as_strided(t.detach(), (2,), (1,), t.storage_offset() + offset - 1)
    return bool(torch.isfinite(pair).all())


def test_each_target_puts_the_boundary_inside_drawn_values():
    """On the analogue: every target is drawn, and where its offsets cross the boundary the element before
    it and the one at it are values a kernel reads (q, k, v and dO in their stores; a pool's pages)."""
    drawn = _draw(60, narrow=ANALOGUE)
    targets = {}
    for case in drawn:
        targets.setdefault(_target(case, WRAP), []).append(case)
        x = make_inputs(case, "cpu")
        if case.kind == "paged":
            multiples = range(WRAP, x.k.numel(), WRAP)
            assert any(_real(x.k, m) and _real(x.v, m) for m in multiples), case.to_json()
            continue
        crossing = [t for t in (x.q, x.k, x.v, x.dout) if t.numel() > WRAP]
        assert all(_real(t, WRAP) for t in crossing), case.to_json()
        if _target(case, WRAP) == "accumulator":  # the inputs below the boundary, the padded rows past it
            assert not crossing, case.to_json()
    assert set(targets) == set(large.TARGETS), {t: len(c) for t, c in targets.items()}


def test_the_draw_at_2_31_crosses_it_in_every_target():
    """At the real boundary (arithmetic only): the dense targets cross 2^31 with a few entries judged of
    many; an accumulator case's inputs stay below it; a pool's pages in use hold the page that starts at
    the boundary (or at 2^32) and the one before it, both full."""
    drawn = _draw(80, limits=GPU_LIMITS, dtypes=("bf16", "fp16"))
    seen = set()
    for case in drawn:
        target = _target(case, large.BOUNDARY)
        seen.add(target)
        if target == "pool":
            table, pool, _ = page_table(case)
            paged = case.paged
            elements = paged.page_size * case.nheads_k * case.head_dim
            used = {p for row, n in zip(table, paged.cache_seqlens) for p in row[:n // paged.page_size]}
            firsts = [-(-m * large.BOUNDARY // elements) for m in (1, 2)]
            assert any({f - 1, f} <= used for f in firsts), case.to_json()
            assert all(n % paged.page_size == 0 for n in paged.cache_seqlens)
            continue
        entries = large.judged_entries(case)
        assert entries is not None and len(entries) <= 12 and case.batch >= 4 * len(entries), case.to_json()
        if target == "accumulator":
            assert max(case.batch * per for name, per in large.spaces(case) if name != "dq accumulator") \
                < large.BOUNDARY
    assert seen == set(large.TARGETS)


def test_judged_entries_surround_each_boundary():
    """flash-attention's dq_accum case: 8300 entries of 128 padded rows x 16 heads x d128, 2^18 elements
    each, put 2^31 at entry 8192. An ordinary case, a ragged one or one with a feature crosses nothing."""
    case = Case(8300, 1, 17, 16, 16, 128, dtype="bf16", seed=3)
    entries = large.judged_entries(case)
    assert {0, 8191, 8192, 8193, 8299} <= set(entries) and len(entries) <= 5 + large.OTHER_ENTRIES, entries
    assert large.judged_entries(Case(4, 2048, 2048, 16, 16, 256)) is None  # the largest ordinary GPU draw
    assert large.judged_entries(dataclasses.replace(case, window=(8, 0))) is None
    assert large.judged_entries(Case.of(2, 1, 16, 4, 4, 64, cache_seqlens=(16, 16), page_size=16,
                                        pages="reverse", pool=1 << 20)) is None


def test_the_partial_reference_equals_the_full_reference_on_its_entries():
    """The reference of the entries judged, computed as a case of their own, is the whole case's on them:
    out, lse and dq of their rows, dk and dv of their keys (an accumulator case of the analogue at 2^16).
    An error in one of them is reported where it is in the whole batch."""
    case = Case(34, 100, 20, 2, 1, 16, dtype="fp32", causal=True, seed=3)
    entries = large.judged_entries(case, 1 << 16)
    assert entries is not None and len(entries) < case.batch / 3, entries
    x = make_inputs(case, "cpu")
    full, _ = reference(x.q, x.k, x.v, x.dout, causal=True, scale=case.scale)
    sub, part, _ = narrowed(case, x, {}, entries)
    partial, _ = reference(part.q, part.k, part.v, part.dout, causal=True, scale=sub.scale)
    for name, t in partial.items():
        assert torch.equal(t, full[name][list(entries)]), name
    got = {name: t.float() for name, t in full.items()}
    wrong = (entries[-2], 5, 1, 3)  # one element of dq off, in an entry past the boundary
    got["dq"][wrong] += 1.0
    metrics = judge(case, x, got, Tolerance(), MODES["both"], boundary=1 << 16)
    assert [t for t, m in metrics.items() if not m.passed] == ["dq"]
    assert tuple(metrics["dq"].worst_index) == wrong, metrics["dq"].worst_index


@pytest.mark.slow
def test_the_dq_accumulator_case_at_2_31_runs_whole_on_the_cpu(monkeypatch):
    """flash-attention's 8300 x 1 x 16 x d128 case: its inputs are 2^24 elements, and only its padded dq
    accumulator (the guard's model of the subject's workspace) passes 2^31. sdpa-math runs it on the CPU
    (about 13 s, 1.5 GB), judged on the 7 entries around entry 8192, with its finite-difference check on
    one entry."""
    from faverify.judge import judging
    from faverify.run import memory
    monkeypatch.setattr(memory, "free_memory", lambda device: 64 * GIB)
    read = []
    monkeypatch.setattr(judging, "narrowed", lambda *args: read.append(args[3]) or narrowed(*args))
    case = Case(8300, 1, 2, 16, 16, 128, dtype="bf16", seed=1)
    result = evaluate(resolve("sdpa-math"), case, "cpu", gradcheck=True)
    assert result.status == "pass" and result.gradcheck["passed"], result.reason
    assert set(result.metrics) == {"out", "dq", "dk", "dv"}  # sdpa-math returns no lse
    assert read == [large.judged_entries(case)] and {8191, 8192, 8193} <= set(read[0]) and len(read[0]) == 7


def _judged(spec: str, case: Case, boundary: int) -> tuple:
    """What evaluate does on a dense case, in this process, the judge told the boundary: the subject's
    forward and backward on the case's inputs, judged on the entries around it; (metrics, its tensors,
    their inputs)."""
    subject = resolve(spec)
    x = make_inputs(case, "cpu", requires_grad=True)
    out, _ = subject(x.q, x.k, x.v, case)
    got = {"out": out, **dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, x.tensors(), x.dout)))}
    return judge(case, x.copy(), got, Tolerance(), MODES["both"], boundary=boundary), got, x.copy()


def test_a_planted_offset_wrap_fails_where_its_offsets_cross_and_the_control_passes():
    """On the analogue: a subject that reads q, k and v at offsets wrapped at the boundary fails the cases
    whose inputs cross it, and passes an accumulator case's; one whose dq accumulator wraps fails every
    case (its padded rows cross the boundary in each); the control passes all. The failure names the
    entries read back, in the batch's own numbering."""
    dense = [c for c in _draw(40, narrow=ANALOGUE) if c.kind == "dense"][:9]
    assert {_target(c, WRAP) for c in dense} == {"q", "kv", "accumulator"}
    for case in dense:
        control, _, _ = _judged("property_tests.planted:correct", case, WRAP)
        assert all(m.passed for m in control.values()), case.to_json()
        wrapped, _, _ = _judged("property_tests.planted_large:wrapped_inputs", case, WRAP)
        assert any(not m.passed for m in wrapped.values()) == (_target(case, WRAP) != "accumulator"), case.to_json()
        accumulated, got, x = _judged("property_tests.planted_large:wrapped_accumulator", case, WRAP)
        failing = [m for m in accumulated.values() if not m.passed]
        assert [m.tensor for m in failing] == ["dq"], case.to_json()
        assert "read back: batch entries" in failing[0].reason
        full, _ = reference(x.q, x.k, x.v, x.dout, causal=case.causal, scale=case.scale)
        worst = tuple(failing[0].worst_index)  # in the whole batch: the error there is the one reported
        assert abs(got["dq"][worst].item() - full["dq"][worst].item()) == pytest.approx(failing[0].max_abs)


def test_a_planted_pool_wrap_fails_and_the_control_passes():
    """A paged subject that reads its pool at page offsets wrapped at the boundary fails each pool case of
    the analogue; the same read unwrapped passes."""
    pools = [c for c in _draw(40, narrow=ANALOGUE) if c.kind == "paged"][:4]
    assert pools
    for case in pools:
        assert evaluate(resolve("property_tests.planted_large:wrapped_pool"), case, "cpu", mode="fwd").failed
        assert evaluate(resolve("property_tests.planted_large:pool_correct"), case, "cpu",
                        mode="fwd").status == "pass", case.to_json()


@pytest.mark.parametrize("card, runs", [(80, {"q", "kv", "accumulator", "pool"}), (24, {"accumulator", "pool"}),
                                        (8, set())])
def test_a_large_case_runs_only_on_a_card_with_its_memory(monkeypatch, card, runs):
    """The guard counts a large case's tensors (inputs, their untouched copies, outputs, gradients) and the
    subject's workspace (flash-attention's padded dq accumulator, and dk and dv per query head under GQA)
    beside the entries' FP64 reference: in bf16 the q case needs about 43 GiB, the kv case 68, the dq
    accumulator case (8300 x 1 x 16 x d128) 14 and a pool of 2^31 elements a side 17. A case refused says
    what is free."""
    from faverify.run import memory
    monkeypatch.setattr(memory, "free_memory", lambda device: card * GIB)
    cases = {"q": Case(449, 2338, 57, 16, 4, 128), "kv": Case(1685, 12, 2491, 16, 4, 128),
             "accumulator": Case(8300, 1, 17, 16, 16, 128),
             "pool": Case.of(2, 16, 64, 16, 4, 128, cache_seqlens=(64, 64), page_size=16, pages="reverse",
                             pool=(1 << 31) // (16 * 4 * 128) + 3)}
    for target, case in cases.items():
        reason = memory.too_big(case, torch.device("cuda"), backward=case.kind == "dense")
        assert (reason is None) == (target in runs), (target, reason)
        if reason:
            assert f"{card:.1f} GiB free" in reason
    accumulator = 8300 * 128 * 16 * 128 * 4  # fp32: what flash-attention's backward allocates for dq
    assert memory.bytes_needed_by(cases["accumulator"], torch.device("cuda"), True) > accumulator


def test_the_finite_difference_check_of_a_large_case_runs_on_one_batch_entry(monkeypatch):
    """A check of the whole batch would run the subject in fp32 on every entry, and its FP64 reference too."""
    from faverify.run import gradcheck
    seen = []

    class Seen(Exception):
        pass

    def spy(case, device, **kw):
        seen.append(case)
        raise Seen
    monkeypatch.setattr(gradcheck, "make_inputs", spy)
    with pytest.raises(Seen):
        gradcheck.directional(resolve("sdpa-math"), Case(8300, 1, 17, 16, 16, 128), torch.device("cpu"))
    assert seen[0].batch == 1


def test_fuzz_scale_large_draws_large_cases_and_skips_those_the_device_cannot_hold(monkeypatch, tmp_path):
    """On a device with 1 GiB free every large case is skipped with the reason, and nothing ran is exit 2."""
    from faverify.run import memory
    monkeypatch.setattr(memory, "free_memory", lambda device: GIB)
    r = cli("fuzz", "--scale", "large", "--kernel", "sdpa-math", "--device", "cpu", "--no-isolate", "--no-db",
            "--iters", "4", "--seed", SEED, "--json", tmp_path / "run.json")
    assert r.exit_code == 2 and "too large for this device" in r.stderr, r.stderr[-2000:]
    run = read_json(tmp_path / "run.json")
    assert "--scale large" in run["command"] and run["kernels"][0]["summary"]["skipped"] == 4, run["command"]


@pytest.mark.parametrize("args, needle", [(("--sequence", "4"), "--sequence"),
                                          (("--relations", "batch"), "--relations"), (("--repeat", "2"), "--repeat"),
                                          (("--dtype", "fp8"), "--dtype"), (("--layouts", "strided"), "--layouts")])
def test_what_a_large_case_does_not_take_is_refused_in_one_line(args, needle):
    r = cli("fuzz", "--scale", "large", "--kernel", "sdpa-math", "--device", "cpu", "--no-db", "--iters", "1", *args)
    assert r.exit_code == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
