"""faverify mutants: every seeded bug is caught, and the unmutated kernels pass under the same settings."""
import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from faverify.kernels.mutants.build import KERNELS, MARKER, source
from faverify.kernels.mutants.catalog import HOPPER_MUTANTS, MUTANTS, Mutant, applicable
from property_tests.cli_helpers import cli, read_json

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the tests that fuzz mutants on the CPU: the Triton kernels run there only under the interpreter
on_the_interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the Triton kernels run on the CPU only under TRITON_INTERPRET=1; this machine runs them on its GPU, "
           "where test_a_hopper_mutant_fails_in_a_worker_process and the full mutants run fuzz them")


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutant_replaces_its_marked_statement_and_nothing_else(mutant):
    import difflib
    original = (KERNELS / mutant.file).read_text().split("\n")
    mutated = source(mutant)[mutant.file].split("\n")
    removed, added = [], []
    for line in difflib.ndiff(original, mutated):
        if line.startswith("- "):
            removed.append(line[2:])
        elif line.startswith("+ "):
            added.append(line[2:])
    imports = [line for line in removed if line.startswith("from faverify.kernels.triton")]
    marked = [line for line in removed if line not in imports]
    assert len(marked) == 1, removed
    # the marker is on the statement's line, or alone on the comment line just above it
    index = original.index(marked[0])
    assert MARKER.format(mutant.site) in marked[0] or (
        original[index - 1].lstrip().startswith("#") and MARKER.format(mutant.site) in original[index - 1]), removed
    indent = marked[0][:len(marked[0]) - len(marked[0].lstrip())]
    body = [line for line in added if not line.startswith("from faverify_mutant_")]
    assert body == ([indent + part for part in mutant.new.split("\n")] if mutant.new else []), added


def test_every_marked_site_has_a_mutant():
    """A site marked in the kernels but used by no mutant is a claim of coverage nobody tests."""
    import re
    marked = {(f.relative_to(KERNELS).as_posix(), site) for f in KERNELS.rglob("*.py")
              for site in re.findall(r"\[mutant site: ([a-z0-9-]+)\]", f.read_text())}
    assert marked == {(m.file, m.site) for m in MUTANTS}


def test_the_copy_imports_its_copied_modules_from_itself_and_the_others_from_the_kernels():
    """A mutant's copy (build.py, _FILES) must run its own modules: an import of a copied module left to the
    real kernels would run the unmutated code, and the mutant would survive for nothing."""
    from faverify.kernels.mutants.build import _imports_of_the_copy
    text = ("from faverify.kernels.triton import configs\n"
            "from faverify.kernels.triton import sparse as _sparse\n"
            "from faverify.kernels.triton.dense import forward as _fwd\n"
            "from faverify.kernels.triton.hopper import layouts as _layouts\n"
            "    from faverify.kernels.triton.variant.forward import (  # a note (in parentheses)\n"
            "        extra_scores,\n    )\n")
    assert _imports_of_the_copy(text, "copy") == (
        "from faverify.kernels.triton import configs\n"
        "from copy import sparse as _sparse\n"
        "from copy.dense import forward as _fwd\n"
        "from faverify.kernels.triton.hopper import layouts as _layouts\n"
        "    from copy.variant.forward import (  # a note (in parentheses)\n"
        "        extra_scores,\n    )\n")
    with pytest.raises(RuntimeError, match="imports copied and shared modules together"):
        _imports_of_the_copy("from faverify.kernels.triton import configs, sparse\n", "copy")


def test_a_mutant_survives_reformatting_of_its_statement(tmp_path):
    """The marker anchors the mutant: a statement reformatted (spacing, a longer comment) still takes it."""
    from faverify.kernels.mutants.build import mutate
    from faverify.kernels.mutants.catalog import BY_NAME
    mutant = BY_NAME["no-l-guard"]
    text = (KERNELS / mutant.file).read_text()
    marked = "  # [mutant site: final-division]"
    reformatted = text.replace("out = acc / tl.where(seen, l_i, 1.0)[:, None]" + marked,
                               "out = acc/tl.where(seen, l_i, 1.0)[:, None]  # the division" + marked)
    assert reformatted != text
    assert mutate(reformatted, mutant) == mutate(text, mutant)


def test_a_stale_mutant_is_an_error_not_a_silent_survivor():
    with pytest.raises(RuntimeError, match="marks 0 lines"):
        source(Mutant("stale", "dense/forward.py", "no-such-site", "x", "bug", "why"))
    with pytest.raises(RuntimeError, match="would change nothing"):
        source(Mutant("same", "dense/forward.py", "qk", "qk = mm(q, k, INTERPRETED, IEEE)", "bug", "why"))


def test_unknown_mutant_is_a_usage_error():
    r = cli("mutants", "--only", "nosuch", "--device", "cpu")
    assert r.exit_code == 2 and "--only='nosuch': unknown mutant" in r.stderr


def test_control_iters_below_one_is_a_usage_error():
    r = cli("mutants", "--control-iters", "0", "--device", "cpu")
    assert r.exit_code == 2 and "--control-iters=0: must be >= 1" in r.stderr, r.stderr


def test_mutants_of_the_hopper_kernels_run_only_where_they_do():
    """The Hopper forward and backward run on sm_90 only: their mutants are left out elsewhere (they would
    survive for nothing), and asking for one there is a usage error that names the rule. The backward's
    run under the subject that takes it (triton-hopper-bwd-fast, triton-hopper-bwd-fused: they are opt-in)."""
    from faverify.kernels.mutants.catalog import FUSED_BWD_MUTANTS, HOPPER_BWD_MUTANTS
    cpu = torch.device("cpu")
    hopper = HOPPER_MUTANTS + HOPPER_BWD_MUTANTS + FUSED_BWD_MUTANTS
    assert HOPPER_BWD_MUTANTS and FUSED_BWD_MUTANTS and not any(applicable(m, cpu) for m in hopper)
    assert all(applicable(m, cpu) for m in MUTANTS if m not in hopper)
    assert {m.subject for m in HOPPER_BWD_MUTANTS} == {"triton-hopper-bwd-fast"}
    assert {m.subject for m in FUSED_BWD_MUTANTS} == {"triton-hopper-bwd-fused"}
    assert all(m.reaches("bwd hopper fused-dq") and not m.reaches("bwd triton") for m in HOPPER_BWD_MUTANTS)
    assert all(m.reaches("bwd fused hopper") and not m.reaches("bwd hopper") and not m.reaches("bwd hopper fused-dq")
               for m in FUSED_BWD_MUTANTS)
    assert not any(m.reaches("bwd fused hopper") for m in HOPPER_BWD_MUTANTS)
    for name in ("hopper-consumer-rows", "hopper-bwd-dk-unscaled", "fused-bwd-reduce-before-dq"):
        r = cli("mutants", "--only", name, "--device", "cpu")
        assert r.exit_code == 2 and f"--only='{name}': its code runs only on sm_90 GPUs" in r.stderr, r.stderr


def test_a_device_the_mutated_kernels_do_not_run_on_is_a_usage_error():
    """Without the interpreter the Triton kernels run on the GPU alone: --device cpu would skip every case and
    report each mutant as surviving, for nothing."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    r = subprocess.run([sys.executable, "-m", "faverify", "mutants", "--only", "no-final-division", "--device",
                        "cpu"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--device='cpu': the mutated kernels (triton) run on cuda in this process" \
        in r.stderr and "Traceback" not in r.stderr, r.stderr


@on_the_interpreter
def test_mutants_in_parallel_jobs(tmp_path):
    """The GPU default: mutants fuzzed at once, each in a job process with its own worker (the slow test
    below runs them one after another, the CPU default)."""
    r = cli("mutants", "--only", "no-final-division,scale-inverse-d", "--iters", "10", "--control-iters", "3",
            "--device", "cpu", "--shrink-budget", "2", "--jobs", "2", "--isolate", "--json", tmp_path / "m.json")
    report = read_json(tmp_path / "m.json")
    assert report["settings"]["jobs"] == 2
    assert [(m["mutant"], m["killed"]) for m in report["mutants"]] == [("no-final-division", True),
                                                                       ("scale-inverse-d", True)]
    # the job process hands back how many cases ran the mutated code: dense/forward.py's and interface.py's, every
    # case here. Counted per case: an interface.py case takes a forward and a backward path, and a sum of
    # the per-path counts would say 2 of 1
    assert all(m["reached"] == m["cases"] >= 1 for m in report["mutants"]), report["mutants"]
    assert sum(report["mutants"][1]["paths"].values()) > report["mutants"][1]["cases"], report["mutants"][1]
    assert report["control"]["cases"] == 3 and r.exit_code == 0, r.stdout


def test_parallel_mutants_need_worker_processes():
    r = cli("mutants", "--jobs", "2", "--no-isolate", "--device", "cpu")
    assert r.exit_code == 2 and "--jobs=2: more than one needs --isolate" in r.stderr, r.stderr


@pytest.mark.slow
def test_every_mutant_is_killed_and_the_control_passes(mutants_run):
    """CI's budget (conftest.MUTANTS_ARGS; the run starts at collection, beside the rest of the suite): 100
    cases per mutant (split-count-floor took 18-29: only caches whose key blocks the split count does not
    divide show it), 20 for the control (the unmutated kernels' own fuzz tests take more; the 200-case fuzz
    of `faverify mutants --iters 200` is the full run), one mutant after another in that process, where
    Hypothesis steers each case toward the edge of its tolerance (the up-front draw of job processes left
    pv-fp16-accumulation and dsinks-wrong-sign alive at 60 cases), one shrink step (a kill needs the
    failure, not its minimal case); the control on two workers."""
    returncode, out, err, path = mutants_run
    report = read_json(path)
    assert len(report["mutants"]) == len([m for m in MUTANTS if applicable(m, torch.device(DEVICE))])
    survivors = [m["mutant"] for m in report["mutants"] if not m["killed"]]
    assert not survivors, survivors
    # a mutant is killed by a case that ran its code (Subject.paths: what the launcher took)
    assert all(m["reached"] >= 1 for m in report["mutants"]), [(m["mutant"], m["reached"]) for m in report["mutants"]]
    # the control: 20 cases of each unmutated subject behind the mutants (triton, triton-fp8)
    controls = report["control"]["kernel"].split(",")
    assert controls == ["triton", "triton-fp8"], report["control"]
    assert report["control"]["failed"] == 0 and report["control"]["cases"] == 20 * len(controls), report["control"]
    assert report["median_cases_to_kill"] <= 50
    # a mutant with a cap on its lengths (catalog.Mutant.max_seqlen) was drawn under it, the others under the
    # run's own limit, and the run says which
    caps = {m.name: m.max_seqlen for m in MUTANTS if m.max_seqlen}
    assert caps and {m["mutant"]: m["max_seqlen"] for m in report["mutants"] if m["mutant"] in caps} == caps
    from faverify.cases.strategies import limits_for
    assert {m["max_seqlen"] for m in report["mutants"] if m["mutant"] not in caps} == {limits_for(DEVICE).max_seqlen}
    assert "(catalog.Mutant.max_seqlen): " + ", ".join(f"{n} ({c})" for n, c in caps.items()) in out, out[-3000:]
    assert returncode == 0, out[-3000:] + err[-3000:]


def test_a_mutants_cap_lowers_the_limits_and_never_raises_them():
    from faverify.cases.strategies import CPU_LIMITS, GPU_LIMITS
    from faverify.commands.mutants import capped
    mutant = next(m for m in MUTANTS if m.max_seqlen == 64)
    assert (capped(CPU_LIMITS, mutant).max_seqlen, capped(CPU_LIMITS, mutant).max_cache) == (64, 0)
    assert (capped(GPU_LIMITS, mutant).max_seqlen, capped(GPU_LIMITS, mutant).max_cache) == (64, 64)
    short = dataclasses.replace(CPU_LIMITS, max_seqlen=32)
    assert capped(short, mutant) == short and capped(CPU_LIMITS, MUTANTS[0]) == CPU_LIMITS


def test_a_mutant_reaches_only_the_paths_of_its_file():
    """A case reaches a mutant's code if it took a code path of the mutated file (interface.PATHS)."""
    from faverify.kernels.triton.interface import PATHS
    by_file = {m.file: m for m in MUTANTS}
    assert [p for p in PATHS if by_file["hopper/forward.py"].reaches(p)] == ["fwd hopper", "fwd hopper variant"]
    assert [p for p in PATHS if by_file["dense/forward.py"].reaches(p)] == ["fwd triton-tma", "fwd triton",
                                                                      "fwd triton generic"]
    assert [p for p in PATHS if by_file["dense/backward.py"].reaches(p)] == ["bwd triton", "bwd triton generic",
                                                                       "bwd triton alibi", "bwd triton generic alibi"]
    assert all(by_file["interface.py"].reaches(p) for p in PATHS)
    decode = next(m for m in MUTANTS if m.site == "decode-rows")  # a mutant of one kernel of its file
    assert [p for p in PATHS if decode.reaches(p)] == [p for p in PATHS if p.startswith("fwd variant decode")] != []
    assert not decode.reaches("fwd variant paged split")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Hopper forward runs on sm_90 only")
def test_a_hopper_mutant_fails_in_a_worker_process():
    """faverify mutants on a GPU runs each case in a worker process: there, a mutant of the Hopper forward
    must launch its own mutated kernel and fail, not the unmutated one the parent process imported."""
    from faverify.cases.case import Case
    from faverify.run.isolation import Worker
    from faverify.run.plan import Judging
    case = Case(1, 129, 129, 2, 2, 64, dtype="bf16", seed=1)  # rows past 64: the second consumer's
    results = {}
    for kernel in ("triton", "mutant:hopper-consumer-rows"):
        worker = Worker(kernel, "cuda:0", Judging(mode="fwd"))
        try:
            results[kernel] = worker.evaluate(case)
        finally:
            worker.stop()
    assert results["triton"].status == "pass" and results["triton"].paths == ["fwd hopper"], results["triton"]
    mutant = results["mutant:hopper-consumer-rows"]
    assert mutant.paths == ["fwd hopper"] and mutant.status == "fail", (mutant.status, mutant.reason)


def test_a_hopper_mutant_is_fuzzed_only_with_cases_that_reach_the_hopper_forward():
    """A Hopper mutant's fuzz draws from HOPPER_CASES (FuzzPlan.narrow): every case must be one the launcher
    sends to the Hopper forward on sm_90 (16-bit, padded head dim 64 or 128, strides multiples of 16), and
    the case mix must stay wide (both dtypes, causal and not, each allowed layout, tails)."""
    from faverify.cases.inputs import make_inputs
    from faverify.cases.strategies import Limits
    from faverify.kernels.constants import HOPPER_CASES
    from faverify.kernels.triton import configs
    from faverify.kernels.triton.common import block_d
    from faverify.kernels.triton.interface import _aligned
    from faverify.run.draw import draw_cases
    from faverify.run.plan import FuzzPlan
    limits = Limits(max_seqlen=300, max_batch=2, max_heads=8, max_elements=1 << 16)
    plan = FuzzPlan(iters=150, seed=3, dtypes=("bf16", "fp16", "fp32"), limits=limits, database=None,
                    narrow=HOPPER_CASES)
    drawn = draw_cases(plan)
    assert len(drawn) == 150
    for case in drawn:
        x = make_inputs(case, "cpu")
        out = torch.empty(x.q.shape, dtype=x.q.dtype)
        elem = x.q.element_size()
        assert configs.hopper_forward(elem, 9, block_d(case.head_dim)) and _aligned(x.q, x.k, x.v, out), case
    assert {c.dtype for c in drawn} == {"bf16", "fp16"} and {c.causal for c in drawn} == {False, True}
    assert {c.layout for c in drawn} == set(HOPPER_CASES["layouts"])
    assert any(c.seqlen_k % 128 for c in drawn) and {block_d(c.head_dim) for c in drawn} == {64, 128}


def test_a_mutant_whose_dtypes_were_not_asked_for_is_left_out_with_the_rule():
    from faverify.kernels.mutants.catalog import left_out
    m = Mutant("bf16-only", "dense/forward.py", "x", "y", "bug", "why", cases={"dtypes": ("bf16",)})
    assert left_out(m, torch.device("cpu"), ("bf16", "fp32")) is None
    assert left_out(m, torch.device("cpu"), ("fp32",)) == "its code runs only for bf16, not for fp32"
    assert "runs only on sm_90 GPUs" in left_out(HOPPER_MUTANTS[0], torch.device("cpu"), ("bf16",))


def test_a_mutant_that_does_not_parse_is_an_error_row_not_a_kill():
    """A replacement that leaves a stray indent would make the worker fail to import the mutant, and a crash
    would count as a kill. The mutated source must parse, and kill() reports it as an error row."""
    from faverify.cases.strategies import Limits
    from faverify.commands.mutants import kill
    from faverify.kernels.mutants import catalog
    from faverify.run.plan import FuzzPlan, Judging
    broken = Mutant("broken-indent", "dense/forward.py", "causal-diagonal", "    diag = 0", "bug", "why")
    with pytest.raises(RuntimeError, match="no longer parses"):
        source(broken)
    catalog.BY_NAME["broken-indent"] = broken
    try:
        row = kill("broken-indent", FuzzPlan(iters=3, seed=0, dtypes=("fp32",), limits=Limits(8, 1, 1, 64),
                                             database=None), [torch.device("cpu")], judging=Judging(timeout=30.0),
                   isolate=False)
    finally:
        del catalog.BY_NAME["broken-indent"]
    assert not row["killed"] and "no longer parses" in row["reason"], row


@on_the_interpreter
def test_a_kill_counts_only_where_the_control_passes_what_the_mutant_failed():
    """The unmutated kernels are run on a kill's minimal case in the mode of the mutant's failure: the
    forward alone for out or lse (the interpreter's backward costs twice the forward), both otherwise. A
    failure the control shares there is the kernels' own, not a kill."""
    from faverify.cases.strategies import Limits
    from faverify.commands.mutants import control_mode, kill
    from faverify.reports.case_result import CaseResult
    from faverify.run.plan import FuzzPlan, Judging
    assert [control_mode(s) for s in ("out:tolerance", "lse:nan", "out_splits:inf", "dq:nan", "dv:tolerance",
                                      "error:RuntimeError", "gradcheck", "crash")] == ["fwd"] * 3 + ["both"] * 5
    asked = []

    def control(status):
        def check(case, judging):
            asked.append(judging.mode)
            return CaseResult("triton", case, status, "")
        return check
    plan = FuzzPlan(iters=20, seed=0, dtypes=("fp32",), limits=Limits(64, 1, 2, 4096), database=None, shrink_budget=1)
    rows = [kill("no-final-division", plan, [torch.device("cpu")], judging=Judging(timeout=60.0), isolate=False,
                 check=control(status)) for status in ("pass", "fail")]
    assert asked == ["fwd", "fwd"] and rows[0]["signature"].startswith(("out:", "lse:")), rows[0]
    assert rows[0]["killed"] and rows[0]["control_mode"] == "fwd"
    assert not rows[1]["killed"] and rows[1]["control_on_minimal_case"] == "fail"
