import dataclasses

import pytest
from hypothesis import given

from faverify.cases.case import Case
from faverify.cases.strategies import CPU_LIMITS, GPU_LIMITS, cases
from faverify.errors import UsageError


@given(cases(limits=GPU_LIMITS))
def test_json_round_trip(case):
    assert Case.from_json(case.to_json()) == case


@given(cases(limits=CPU_LIMITS))
def test_drawn_cases_respect_limits(case):
    assert case.batch <= CPU_LIMITS.max_batch and case.nheads <= CPU_LIMITS.max_heads
    assert max(case.seqlen_q, case.seqlen_k) <= CPU_LIMITS.max_seqlen
    assert case.batch * max(case.seqlen_q, case.seqlen_k) * case.nheads * case.head_dim <= CPU_LIMITS.max_elements
    assert case.nheads % case.nheads_k == 0


@pytest.mark.parametrize("field,value,rule", [
    ("nheads_k", 3, "must divide nheads"),
    ("head_dim", 600, "<= 576"),
    ("dtype", "fp8", "must be one of"),
    ("regime", "wild", "must be one of"),
    ("softmax_scale", -1.0, "in (0, "),
    ("seqlen_q", 0, ">= 1"),
    ("batch", 1.5, "integer"),
])
def test_invalid_fields_name_the_field_value_and_rule(field, value, rule):
    base = dict(batch=1, seqlen_q=4, seqlen_k=4, nheads=4, nheads_k=2, head_dim=16)
    with pytest.raises(UsageError) as e:
        Case(**{**base, field: value})
    assert e.value.argument == field and e.value.value == value and rule in str(e.value)


def test_from_json_rejects_unknown_and_missing_fields():
    good = Case(1, 2, 3, 2, 1, 16).to_dict()
    with pytest.raises(UsageError, match="unknown field"):
        Case.from_dict({**good, "colour": 1})
    with pytest.raises(UsageError, match="missing required"):
        Case.from_dict({k: v for k, v in good.items() if k != "head_dim"})
    with pytest.raises(UsageError, match="not valid JSON"):
        Case.from_json("{not json")


def test_bottom_right_causal_visibility():
    c = Case(1, seqlen_q=5, seqlen_k=3, nheads=1, nheads_k=1, head_dim=8, causal=True)
    assert [c.visible_keys(i) for i in range(5)] == [0, 0, 1, 2, 3]
    assert c.has_masked_rows and c.masked_rows == 2
    assert not dataclasses.replace(c, seqlen_k=5).has_masked_rows


def test_exact_head_dims_draw_only_the_listed_ones():
    from hypothesis import given, settings

    from faverify.cases.strategies import cases

    @settings(max_examples=60, deadline=None)
    @given(cases(head_dims=(48, 96), exact_head_dims=True))
    def check(case):
        assert case.head_dim in (48, 96)
    check()


def test_a_subjects_head_dim_multiple_rounds_its_drawn_head_dims_and_skips_others():
    """Capabilities.head_dim_multiple (flash-attn-4: 8): its fuzz draws q/k's and v's head dims as multiples,
    the rest of each case as drawn without it; a case given by hand off the multiple is skipped, naming it."""
    import torch
    from hypothesis import find, settings

    from faverify.subjects.base import Capabilities

    caps = Capabilities.of(head_dim_multiple=8, head_dim_v=True)
    # v's head dims no larger than the subject takes (its max_head_dim, 256)
    assert caps.draw() == {"head_dim_multiple": 8, "max_head_dim_v": 256} and Capabilities.of().draw() == {}

    @settings(max_examples=80, deadline=None, database=None)
    @given(cases(features=("head_dim_v",), **caps.draw()))
    def check(case):
        assert case.head_dim % 8 == 0 and case.dv % 8 == 0 and 8 <= case.head_dim <= 256 and case.dv <= 512
    check()
    from faverify.cases.strategies import aligned
    assert (aligned(43, 8, 256), aligned(256, 8, 256), aligned(1, 8, 256), aligned(250, 48, 256)) == (48, 256, 8, 240)
    # an odd head dim is drawn where the multiple is 1; a case off the multiple is skipped with the reason
    odd = find(cases(features=("head_dim_v",)), lambda c: c.head_dim % 8 == 3 and c.head_dim_v is None,
               settings=settings(database=None, max_examples=2000))
    assert caps.reason_unsupported(odd, torch.device("cpu")) == \
        f"head dims must be multiples of 8 (q/k {odd.head_dim}, v {odd.head_dim})"
    assert caps.reason_unsupported(dataclasses.replace(odd, head_dim=odd.head_dim + 5), torch.device("cpu")) is None
    with pytest.raises(ValueError, match="head_dim_multiple must be an integer >= 1"):
        Capabilities.of(head_dim_multiple=0)


def test_a_subjects_listed_head_dims_are_all_it_draws_and_the_rest_are_skipped():
    """Capabilities.head_dims (FlashInfer: 64, 128, 256): its fuzz draws q/k's and v's head dims among them
    alone; a case given by hand with another is skipped, naming them; a list outside min..max is refused."""
    import torch
    from hypothesis import settings

    from faverify.subjects.base import Capabilities

    caps = Capabilities.of(head_dims=[64, 128], head_dim_v=True)
    assert caps.head_dims == (64, 128) and caps.draw() == {"head_dims": (64, 128), "exact_head_dims": True,
                                                           "max_head_dim_v": 256}

    @settings(max_examples=80, deadline=None, database=None)
    @given(cases(features=("head_dim_v",), **caps.draw()))
    def check(case):
        assert case.head_dim in (64, 128) and case.dv in (64, 128), case
    check()
    cpu = torch.device("cpu")
    assert caps.reason_unsupported(Case(1, 4, 4, 1, 1, 64, head_dim_v=128), cpu) is None
    assert caps.reason_unsupported(Case(1, 4, 4, 1, 1, 64, head_dim_v=96), cpu) == \
        "head dims q/k 64, v 96: takes only 64, 128"
    assert "takes only" in caps.reason_unsupported(Case(1, 4, 4, 1, 1, 80), cpu)
    with pytest.raises(ValueError, match="head_dims must be a list of integers in min_head_dim..max_head_dim"):
        Capabilities.of(head_dims=[64, 512])
    with pytest.raises(ValueError, match="head_dims must be"):
        Capabilities.of(head_dims=["64"])


def test_a_shape_budget_draws_every_case_in_one_of_its_shapes_the_same_for_the_same_seed():
    """--shapes N: the pool is the first N distinct shapes of the seed's own draw, and every case takes one of
    them (SHAPE_FIELDS), its values, regime, layout and variants its own."""
    from faverify.cases.strategies import SHAPE_FIELDS
    from faverify.run.draw import budget_pool, draw_cases
    from faverify.run.plan import FuzzPlan

    plan = FuzzPlan(iters=60, seed=3, dtypes=("bf16", "fp16"), limits=CPU_LIMITS, database=None,
                    features=("window", "head_dim_v"), shapes=3)
    pool = budget_pool(plan)
    assert len(pool) == 3 and pool == budget_pool(plan)
    # from dense cases alone: a paged case whose caches are all empty has seqlen_k 0, no dense case's
    ragged = [c for c in draw_cases(dataclasses.replace(plan, iters=200, features=("paged", "varlen")))
              if c.kind != "dense"]
    assert ragged and all(s["seqlen_k"] >= 1 for s in budget_pool(dataclasses.replace(plan, features=("paged",),
                                                                                         shapes=40)))
    budgeted = dataclasses.replace(plan, narrow={"shapes": pool})
    drawn = draw_cases(budgeted)
    shapes = [{f: getattr(c, f) for f in SHAPE_FIELDS} for c in drawn]
    assert len(drawn) == 60 and all(s in pool for s in shapes) and all(s in shapes for s in pool)
    assert drawn == draw_cases(budgeted)
    free = draw_cases(dataclasses.replace(plan, shapes=0))
    unbudgeted = {tuple(getattr(c, f) for f in SHAPE_FIELDS) for c in free}
    assert len(unbudgeted) > 20

    def rest(cases) -> int:  # distinct values, regimes, layouts and windows
        return len({(c.seed, c.regime, c.layout, c.window) for c in cases})
    assert rest(drawn) >= 0.8 * rest(free) > 20, (rest(drawn), rest(free))  # the rest varies as without a budget


_LITERALS = """# a module of the caller's with numbers Hypothesis could take for constants worth drawing
SIZES = (3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103,
         107, 109, 113, 127, 131, 137, 139, 149, 151, 157, 163, 167, 173, 179, 181, 191, 193, 197, 199, 211)
SCALES = (0.0123, 0.37, 1.75, 2.5e-3, 3.25, 7.5, 12.5, 1e-6, 6e-8, 33.0)
"""


def test_the_same_seed_draws_the_same_cases_whatever_modules_are_loaded(tmp_path, monkeypatch):
    """Hypothesis also draws literals from the source of the local modules loaded so far; faverify's draws
    leave those out (plan.seed_only), so a module the caller imports between two draws (or an editable
    install beside a wheel) changes no case, and a replay reaches the case it replays. The literals stay
    Hypothesis's own elsewhere."""
    import importlib

    from hypothesis.internal.conjecture import providers

    from faverify.run.draw import draw_cases
    from faverify.run.plan import FuzzPlan, seed_only

    plan = FuzzPlan(iters=80, seed=11, dtypes=("bf16", "fp16"), limits=CPU_LIMITS, database=None,
                    features=("window", "softcap", "alibi", "sinks", "head_dim_v"))
    before = draw_cases(plan)
    (tmp_path / "caller_sizes.py").write_text(_LITERALS)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("caller_sizes")
    assert 211 in providers._get_local_constants().integers  # Hypothesis took the module's literals
    assert draw_cases(plan) == before
    with seed_only():
        assert not providers._get_local_constants().integers
    assert 211 in providers._get_local_constants().integers
