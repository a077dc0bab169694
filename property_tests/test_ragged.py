"""Ragged and paged cases (docs/design.md, "Ragged and paged"): what a case can be, how its tensors sit in
memory, the per-sequence reference, the split-KV partials and combine, and the planted bugs of
property_tests/planted_ragged.py, each caught and shrunk to a case that names it."""
import dataclasses
import json

import pytest
import torch
from hypothesis import given, seed, settings

from faverify.cases.case import Case
from faverify.cases.conventions import DEFAULT
from faverify.cases.inputs import make_inputs
from faverify.cases.ragged_draws import INT32_ELEMENTS
from faverify.cases.strategies import CPU_LIMITS, GPU_LIMITS, cases
from faverify.cases.variant import Variant
from faverify.cases.vocabulary import PAGE_ORDERS
from faverify.errors import UsageError
from faverify.judge.reference import reference
from faverify.judge.sequences import yardsticks
from property_tests.cli_helpers import cli

VARLEN = Case.of(3, 4, 5, 2, 1, 16, dtype="fp32", causal=True, seqlens=((3, 5), (0, 2), (4, 1)), tail=2, seed=3)
PAGED = Case.of(2, 3, 9, 2, 2, 16, dtype="fp32", cache_seqlens=(9, 4), page_size=2, pages="random", seed=5)


@pytest.mark.parametrize("fields,argument", [
    (dict(batch=2), "batch"),  # three sequences
    (dict(seqlen_k=9), "seqlen_k"),  # their longest has 5 keys
    (dict(seqlens=[[1]]), "seqlens"),
    (dict(seqlens=[[1, -1]]), "seqlens"),
    (dict(layout="transposed"), "layout"),
    (dict(seqlens=None, tail=2), "tail"),
    (dict(seqlens=None, tail=0, page_size=4), "page_size"),
    (dict(splits=2, sinks="around"), "splits"),
    (dict(splits=0), "splits"),
])
def test_bad_ragged_fields_are_refused_naming_the_field(fields, argument):
    d = {**VARLEN.to_dict(), **fields}
    with pytest.raises(UsageError) as e:
        Case.from_dict(d)
    assert e.value.argument == argument


@pytest.mark.parametrize("fields,argument", [
    (dict(pool=3), "pool"),  # 7 pages are used
    (dict(pages="sideways"), "pages"),
    (dict(page_size=0), "page_size"),
    (dict(cache_seqlens=[9]), "batch"),
])
def test_bad_paged_fields_are_refused_naming_the_field(fields, argument):
    with pytest.raises(UsageError) as e:
        Case.from_dict({**PAGED.to_dict(), **fields})
    assert e.value.argument == argument


def test_ragged_cases_round_trip_through_json_and_dense_ones_print_as_before():
    for c in (VARLEN, PAGED, PAGED.replace(splits=3, pages="shared", pool=40)):
        assert Case.from_json(c.to_json()) == c
    dense = Case(2, 8, 8, 2, 2, 64)
    assert set(dense.to_dict()) == {"batch", "seqlen_q", "seqlen_k", "nheads", "nheads_k", "head_dim", "dtype",
                                    "causal", "softmax_scale", "regime", "layout", "init", "seed"}
    assert "varlen 3/5,0/2,4/1 tail=2" in VARLEN.short()
    assert "paged cache=9,4 page=2 pages=random" in PAGED.short()


def test_varlen_inputs_pack_the_sequences_with_a_nan_tail_inside_nan_margins():
    x = make_inputs(VARLEN, "cpu")
    padded = make_inputs(VARLEN.replace(seqlens=None, tail=0), "cpu")  # the same draw, dense
    assert x.q.shape == (7 + 2, 2, 16) and x.k.shape == (8 + 2, 1, 16)
    assert x.cu_seqlens_q.tolist() == [0, 3, 3, 7] and x.cu_seqlens_k.tolist() == [0, 5, 7, 8]
    assert x.cu_seqlens_q.dtype == torch.int32
    assert torch.equal(x.q[0:3], padded.q[0, :3]) and torch.equal(x.q[3:7], padded.q[2, :4])
    assert torch.equal(x.k[5:7], padded.k[1, :2])
    assert torch.isnan(x.q[7:]).all() and torch.isnan(x.k[8:]).all() and torch.isnan(x.dout[7:]).all()
    before = x.q.as_strided((16,), (1,), x.q.storage_offset() - 16)
    assert torch.isnan(before).all()


def _gathered(x, b, n):
    """Sequence b's first n tokens, read through the block table one token at a time."""
    ps = x.k.shape[1]
    return torch.stack([x.k[int(x.block_table[b, t // ps]), t % ps] for t in range(n)])


@pytest.mark.parametrize("pages", PAGE_ORDERS)
def test_paged_inputs_put_each_token_where_the_block_table_says_and_nan_elsewhere(pages):
    c = PAGED.replace(pages=pages, page_size=2, cache_seqlens=(9, 5))
    x = make_inputs(c, "cpu")
    table = x.block_table.tolist()
    for b, n in enumerate(c.paged.cache_seqlens):
        assert torch.equal(_gathered(x, b, n), x.k_logical[b, :n])
        assert torch.isnan(x.k[table[b][-1]]).all() or -(-n // 2) == len(table[b])  # entries past: an unused page
    used = {(table[b][t // 2], t % 2) for b, n in enumerate(c.paged.cache_seqlens) for t in range(n)}
    finite = {(p, s) for p in range(x.k.shape[0]) for s in range(2) if not torch.isnan(x.k[p, s]).any()}
    assert finite == used
    if pages == "reverse":
        assert table[0][:5] == sorted(table[0][:5], reverse=True)
    if pages == "random":
        assert x.k.shape[0] == 2 * c.pages_used + 1 and table[0][:5] != sorted(table[0][:5])
    if pages == "shared":  # the second sequence's two full pages are the first one's
        assert table[1][:2] == table[0][:2] and torch.equal(x.k_logical[1, :4], x.k_logical[0, :4])
        assert c.pages_used == 5 + 3 - 2


def test_the_reference_of_a_ragged_case_is_each_sequence_on_its_own():
    x = make_inputs(VARLEN, "cpu")
    ref, scales, base, empty = yardsticks(VARLEN, x, True, DEFAULT)
    cu_q, cu_k = x.cu_seqlens_q.tolist(), x.cu_seqlens_k.tolist()
    for b, (sq, sk) in enumerate(VARLEN.varlen.seqlens):
        q = x.q[cu_q[b]:cu_q[b + 1]][None]
        k, v = (t[cu_k[b]:cu_k[b + 1]][None] for t in (x.k, x.v))
        dout = x.dout[cu_q[b]:cu_q[b + 1]][None]
        if sq == 0:  # its two keys are seen by no query: no gradient
            assert not ref["dk"][0, cu_k[b]:cu_k[b + 1]].any()
            continue
        alone, _ = reference(q, k, v, dout, causal=True, scale=VARLEN.scale, variant=Variant(right=0))
        assert torch.equal(ref["out"][0, cu_q[b]:cu_q[b + 1]], alone["out"][0])
        assert torch.equal(ref["lse"][0, :, cu_q[b]:cu_q[b + 1]], alone["lse"][0])
        assert torch.equal(ref["dk"][0, cu_k[b]:cu_k[b + 1]], alone["dk"][0])
    # the third sequence: 4 queries against 1 key, causal bottom-right: its first 3 rows see nothing
    assert empty[0, :, 3:6].all() and not empty[0, :, 6].any() and not empty[0, :, :3].any()
    assert ref["out"].shape == (1, 7, 2, 16) and ref["dk"].shape == (1, 8, 1, 16)
    # the sequences are cut where the case says (ragged.offsets, on the host), not where the cu_seqlens
    # tensors say: reading those would wait for the device twice a sequence, and a subject may write them
    x.cu_seqlens_q.zero_()
    x.cu_seqlens_k.fill_(3)
    again, _, _, _ = yardsticks(VARLEN, x, True, DEFAULT)
    assert all(torch.equal(again[name], ref[name]) for name in ref)


def test_split_ranges_cut_whole_blocks_and_leave_the_last_splits_empty():
    c = dataclasses.replace(PAGED, splits=3)
    assert c.split_ranges(10) == [(0, 4), (4, 8), (8, 10)]
    assert dataclasses.replace(c, splits=4).split_ranges(2) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert c.split_ranges(10, block=4) == [(0, 4), (4, 8), (8, 10)]
    assert c.split_ranges(20, block=4) == [(0, 8), (8, 16), (16, 20)]
    assert c.split_ranges(0) == [(0, 0)] * 3


def test_the_draw_reaches_the_ragged_edges():
    seen = []

    @seed(1)
    @settings(max_examples=400, database=None)
    @given(cases(limits=CPU_LIMITS, features=("varlen", "paged", "splits")))
    def draw(case):
        seen.append(case)
    draw()
    varlen = [c.varlen for c in seen if c.kind == "varlen"]
    paged = [c for c in seen if c.kind == "paged"]
    assert any(0 in (sq, sk) for v in varlen for sq, sk in v.seqlens)  # zero-length sequences
    assert any(sq > sk for v in varlen for sq, sk in v.seqlens)
    assert any(v.tail for v in varlen) and any(len(v.seqlens) >= 3 for v in varlen)
    assert {c.paged.pages for c in paged} == set(PAGE_ORDERS)
    assert {1, 3}.issubset({c.paged.page_size for c in paged})
    assert any(c.seqlen_q == 1 for c in paged) and any(0 in c.paged.cache_seqlens for c in paged)
    assert any(c.splits > c.seqlen_k for c in seen)  # empty partials


def test_gpu_limits_draw_now_and_then_a_pool_past_32_bit_offsets():
    seen = []

    @seed(2)
    @settings(max_examples=800, database=None)
    @given(cases(limits=GPU_LIMITS, features=("paged",), ragged_only=True))
    def draw(case):
        seen.append(case)
    draw()
    huge = [c for c in seen if c.paged.pool and c.paged.pool * c.paged.page_size * c.nheads_k * c.head_dim
            >= 2 * INT32_ELEMENTS]
    assert huge and all(c.paged.pages == "random" for c in huge)
    assert max(c.seqlen_k for c in seen) > GPU_LIMITS.max_seqlen  # long caches too


@pytest.mark.parametrize("limits", [CPU_LIMITS, GPU_LIMITS], ids=["cpu-limits", "gpu-limits"])
def test_a_speculative_draw_is_paged_decodes_of_several_queries_under_gqa(limits):
    """speculative (the packed decode's mutant draws only these): every case a paged decode of 2 to 16
    query rows with a GQA group of 2 or more; groups and row counts vary, within the limits' heads."""
    seen = []

    @seed(3)
    @settings(max_examples=150, database=None)
    @given(cases(limits=limits, features=("paged",), ragged_only=True, speculative=True))
    def draw(case):
        seen.append(case)
    draw()
    assert all(c.kind == "paged" and 2 <= c.seqlen_q <= 16 and c.nheads // c.nheads_k >= 2
               and c.nheads <= limits.max_heads for c in seen)
    assert len({c.nheads // c.nheads_k for c in seen}) >= 2 and len({c.seqlen_q for c in seen}) >= 8


def _fuzz(kernel, tmp_path, *extra, iters=60):
    path = tmp_path / f"{kernel.rpartition(':')[2]}.json"
    r = cli("fuzz", "--kernel", kernel, "--iters", str(iters), "--device", "cpu", "--no-db", "--no-isolate",
            "--dtype", "fp32,bf16", "--mode", "fwd", "--json", path, *extra)
    return r, json.loads(path.read_text())["kernels"][0]


@pytest.mark.parametrize("bug,control,signature,names_it", [
    ("varlen_reads_next_key", "varlen_correct", "out:",
     lambda c: c.kind == "varlen" and (len(c.varlen.seqlens) == 2 or c.varlen.tail) and len(c.varlen.seqlens) <= 2),
    ("varlen_writes_tail", "varlen_into_buffer", "out:written-outside",
     lambda c: c.kind == "varlen" and c.varlen.tail == 1 and len(c.varlen.seqlens) == 1),
    ("varlen_first_sequence_only", "varlen_into_buffer", "out:unwritten",
     lambda c: c.kind == "varlen" and len(c.varlen.seqlens) == 2),
    ("paged_in_order", "paged_correct", "out:",
     lambda c: c.kind == "paged" and c.paged.pages != "in-order" and c.paged.page_size == 1 and c.batch <= 3
     and c.seqlen_k <= 2),
    ("paged_mtp_top_left", "paged_correct", "out:",  # the multi-token decode edge: a few queries, causal
     lambda c: c.kind == "paged" and c.causal and 2 <= c.seqlen_q <= 4),
    ("combine_nan_on_empty", "combine_correct", "out:nan",
     lambda c: c.splits == 2 and c.empty_rows() != (0, 0)),
    ("merge_fills_empty_lse", "merge_correct", "out:",  # an empty shard or split: its lse read as 0
     lambda c: c.splits == 2 and c.seqlen_k == 1 and not c.causal),
    ("splits_drop_last_key", "splits_correct", "out_splits:",
     lambda c: c.splits >= 1 and c.seqlen_k <= 2),
])
def test_each_ragged_bug_is_caught_and_shrunk_to_a_case_that_names_it(bug, control, signature, names_it, tmp_path):
    r, run = _fuzz(f"property_tests.planted_ragged:{bug}", tmp_path)
    assert r.exit_code == 1, r.stdout[-2000:]
    mine = [f for f in run["failures"] if any(s.startswith(signature) for s in [f["signature"], *f["companions"]])]
    assert mine, [(f["signature"], f["companions"]) for f in run["failures"]]  # as the root, or found with it
    minimal = Case.from_dict(mine[0]["minimal"]["case"])
    assert names_it(minimal), minimal.short()
    r, run = _fuzz(f"property_tests.planted_ragged:{control}", tmp_path)
    assert r.exit_code == 0 and run["summary"]["passed"] > 0, r.stdout[-2000:]


def test_sdpa_math_fuzz_draws_varlen_and_paged_cases_and_counts_them(tmp_path):
    path = tmp_path / "run.json"
    r = cli("fuzz", "--kernel", "sdpa-math,combine", "--iters", "120", "--device", "cpu", "--no-db", "--no-isolate",
            "--json", path)
    assert r.exit_code == 0, r.stdout[-2000:]
    sdpa, combine = json.loads(path.read_text())["kernels"]
    assert sdpa["summary"]["features"]["varlen"] > 10 and sdpa["summary"]["features"]["paged"] > 10
    assert sdpa["summary"]["by_feature"]["varlen"]["failed"] == 0
    assert combine["summary"]["features"]["splits"] == 120 and combine["summary"]["passed"] == 120


def test_a_dense_only_subject_never_gets_a_ragged_case(tmp_path):
    """Asked for features it does not declare, the fuzz stops before any case and names them; left to its
    own, a dense subject's draw holds no ragged case."""
    r = cli("fuzz", "--kernel", "property_tests.planted:correct", "--iters", "24", "--device", "cpu", "--no-db",
            "--no-isolate", "--features", "varlen,paged")
    assert r.exit_code == 2 and "does not declare varlen, paged" in r.stderr, r.stderr
    path = tmp_path / "run.json"
    r = cli("fuzz", "--kernel", "property_tests.planted:correct", "--iters", "24", "--device", "cpu", "--no-db",
            "--no-isolate", "--json", path)
    summary = json.loads(path.read_text())["kernels"][0]["summary"]
    assert r.exit_code == 0 and summary["features"] == {"dense": 24} and not summary["skip_reasons"], summary


def test_a_ragged_reproducer_replays_the_same_verdict(tmp_path):
    r, run = _fuzz("property_tests.planted_ragged:paged_in_order", tmp_path)
    line = run["failures"][0]["minimal"]["case"]
    again = cli("repro", "--kernel", "property_tests.planted_ragged:paged_in_order", "--device", "cpu",
                "--case", json.dumps(line))
    assert again.exit_code == 1, again.stdout[-1000:]
    fine = cli("repro", "--kernel", "sdpa-math", "--device", "cpu", "--case", json.dumps(line))
    assert fine.exit_code == 0, fine.stdout[-1000:]


def test_flex_runs_a_varlen_case_one_sequence_at_a_time():
    from faverify.run.evaluate import evaluate
    from faverify.subjects import resolve
    c = Case.of(2, 5, 7, 2, 2, 16, dtype="fp32", causal=True, seqlens=((5, 7), (3, 2)), tail=1, seed=4)
    r = evaluate(resolve("flex"), c, "cpu", mode="fwd")
    assert r.status == "pass", r.reason


@pytest.mark.gpu
def test_int32_page_offsets_fail_on_a_pool_past_two_to_the_31_elements():
    """A small pool of large pages: 129 pages of 2^16 tokens x 256 = 2^31 + 2^24 elements (4 GiB in bf16)."""
    from faverify.run.evaluate import evaluate
    from faverify.subjects import resolve
    c = Case.of(1, 1, 4, 1, 1, 256, dtype="bf16", cache_seqlens=(4,), page_size=1 << 16, pages="random",
                pool=129, seed=7)
    low = [s for s in range(2000) if _page_above(c, s)]  # the one page of 129 past 2^31 elements comes first
    c = dataclasses.replace(c, seed=low[0])  # a seed whose page lies past 2^31 elements
    bug = resolve("property_tests.planted_ragged:paged_int32_offsets")
    assert evaluate(bug, c, "cuda", mode="fwd").failed
    assert evaluate(resolve("property_tests.planted_ragged:paged_correct"), c, "cuda", mode="fwd").status == "pass"
    small = c.replace(pool=0, pages="in-order")
    assert evaluate(bug, small, "cuda", mode="fwd").status == "pass"


def _page_above(case, seed_value):
    from faverify.cases.ragged import page_table
    table, _, _ = page_table(dataclasses.replace(case, seed=seed_value))
    return table[0][0] * case.paged.page_size * case.head_dim >= INT32_ELEMENTS


def test_an_unwritten_output_names_the_rows_and_the_sequence():
    """A kernel that writes only the first sequence's rows of the buffer it is given: the second call into
    a filled buffer shows which rows nobody wrote."""
    from faverify.run.evaluate import evaluate
    from faverify.subjects import resolve
    case = Case.of(2, 3, 4, 2, 2, 16, dtype="fp32", seqlens=((1, 4), (3, 2)), seed=1)
    r = evaluate(resolve("property_tests.planted_ragged:varlen_first_sequence_only"), case, "cpu", mode="fwd")
    assert r.status == "fail" and "out:unwritten" in r.signatures, (r.signatures, r.reason)
    assert "96 elements of the out buffer never written: rows 0..2 of sequence 1" in r.reason, r.reason
    good = evaluate(resolve("property_tests.planted_ragged:varlen_into_buffer"), case, "cpu", mode="fwd")
    assert good.status == "pass", good.reason


@pytest.mark.parametrize("shards,splits,sq,sk,causal", [
    ("interleaved", 3, 7, 5, True),  # causal: the first rows see no key of the later shards
    ("contiguous", 4, 6, 7, False),  # ceil(7 / 4) = 2 keys a shard, the last holding one
    ("interleaved", 4, 2, 3, False),  # more shards than keys: shard 3 is empty for every row
])
def test_shards_partials_are_each_shards_attention_and_merge_into_the_whole(shards, splits, sq, sk, causal):
    """Context-parallel shards: each partial is the attention over its shard's keys at their own positions,
    (0, -inf) where a row sees none of them; merged by the combine formula they give the whole attention."""
    from faverify.cases.splits import combine
    from faverify.judge.sequences import split_yardsticks
    case = Case(1, sq, sk, 2, 1, 16, dtype="fp32", causal=causal, splits=splits, shards=shards, seed=3)
    keys = case.shard_keys(sk)
    assert sorted(j for shard in keys for j in shard) == list(range(sk))
    x = make_inputs(case, "cpu")
    parts, _, _, empty = split_yardsticks(case, x, DEFAULT, 1)
    whole, _ = reference(*x.tensors(), causal=causal, scale=case.scale)
    for s, shard in enumerate(keys):
        if not len(shard):
            assert bool(empty[s].all()) and not parts["out"][s].any()
    out, lse = combine(parts["out"].reshape(splits, 1, sq, 2, 16), parts["lse"].reshape(splits, 1, 2, sq))
    assert torch.allclose(out, whole["out"], atol=1e-12) and torch.allclose(lse, whole["lse"], atol=1e-12)


def test_a_shards_case_is_checked():
    with pytest.raises(UsageError, match="shards"):
        Case(1, 4, 4, 1, 1, 16, shards="ring")
    with pytest.raises(UsageError, match="splits >= 2"):
        Case(1, 4, 4, 1, 1, 16, shards="contiguous")
