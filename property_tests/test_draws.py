"""The same seed draws the same cases: the first 200 cases of seed 0 for three subjects' declarations, kept
as a fixture. A change to faverify that moves code about must leave them as they are; a change that means to
draw differently rewrites the fixture (`python property_tests/test_draws.py`) and says why in its commit."""
import json
import pathlib

import pytest

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "draws.json"
SUBJECTS = ("sdpa-math", "triton", "triton-paged")  # every feature; the bundled kernel's; a ragged-only one
CASES = 200


def _draw(kernel: str) -> list:
    from faverify.cases.strategies import CPU_LIMITS
    from faverify.run.draw import draw_cases
    from faverify.run.plan import FuzzPlan
    from faverify.subjects import resolve
    caps = resolve(kernel).caps
    plan = FuzzPlan(iters=CASES, seed=0, dtypes=("bf16", "fp16"), limits=CPU_LIMITS, database=None,
                    narrow=caps.draw() or None, features=caps.features())
    return [case.to_json() for case in draw_cases(plan)]


@pytest.mark.parametrize("kernel", SUBJECTS)
def test_seed_0_draws_the_cases_it_drew(kernel):
    kept = json.loads(FIXTURE.read_text())[kernel]
    drawn = _draw(kernel)
    differ = next((i for i, (a, b) in enumerate(zip(kept, drawn)) if a != b), None)
    assert len(drawn) == len(kept) and differ is None, f"case {differ} differs: {kept[differ]} -> {drawn[differ]}"


if __name__ == "__main__":
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps({k: _draw(k) for k in SUBJECTS}, indent=0) + "\n")
