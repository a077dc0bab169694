"""faverify fuzz / repro / kernels through CliRunner: exit codes, messages, minimal cases, output files."""
import json
import re

import pytest

from faverify.subjects.registry import LIBRARIES
from property_tests.cli_helpers import cli, read_json


def minimal_cases(report: str) -> list:
    return [json.loads(line) for line in report.splitlines() if line.startswith('{"batch"')]


def test_sdpa_math_200_cases_pass_on_cpu(tmp_path):
    # Its speed (6.1 s alone on the 2-core machine) is measured and reported, not asserted: beside the
    # suite's background compiles the same run took 80 s.
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "200", "--device", "cpu",
            "--json", tmp_path / "run.json", "--markdown", tmp_path / "run.md")
    assert r.exit_code == 0, r.stderr
    for section in ("Error statistics", "Gradient checks", "Summary", "tolerance:", "torch "):
        assert section in r.stdout
    run = read_json(tmp_path / "run.json")
    assert run["schema"] == "faverify.run" and run["kernels"][0]["summary"]["passed"] == 200
    # sdpa-math returns no lse; its sinks cases add dsinks
    assert {row["tensor"] for row in run["kernels"][0]["stats"]} == {"out", "dq", "dk", "dv", "dsinks", "dbias"}
    # every 25th of 200, and each case whose gradient errors were waived (ill-conditioned): its gradients
    # are judged by the check instead
    waived = sum(row["waived"] for row in run["kernels"][0]["stats"] if row["tensor"] in ("dq", "dk", "dv"))
    assert 8 <= run["kernels"][0]["gradcheck"][0]["checks"] <= 8 + waived, (waived, run["kernels"][0]["gradcheck"])
    assert "| sdpa-math" in (tmp_path / "run.md").read_text()


@pytest.mark.parametrize("bug,signature_prefix,check", [
    # softmax over one key is 1 whatever the scale: two keys is the smallest case that shows it
    ("wrong_scale", "", lambda c: c["seqlen_k"] == 2 and c["batch"] == 1 and c["seqlen_q"] == 1),
    # top-left vs bottom-right differ only when causal and seqlen_q != seqlen_k
    ("top_left_mask", "", lambda c: c["causal"] and c["seqlen_q"] != c["seqlen_k"]
        and max(c["seqlen_q"], c["seqlen_k"]) <= 2),
    # fp16 accumulation overflows at bf16 magnitudes: found at the smallest shape there is
    ("fp16_accumulation", "out:inf", lambda c: c["regime"] == "bf16-scale" and c["seqlen_k"] == 1),
])
def test_planted_bugs_exit_1_with_a_minimal_case(bug, signature_prefix, check):
    r = cli("fuzz", "--kernel", f"property_tests.planted:{bug}", "--iters", "200", "--device", "cpu")
    assert r.exit_code == 1, r.stderr
    found = minimal_cases(r.stdout)
    assert found, r.stdout
    assert any(check(c) for c in found), found
    assert signature_prefix in r.stdout
    assert "faverify repro --kernel property_tests.planted:" + bug in r.stdout


def test_control_of_the_planted_bugs_passes():
    r = cli("fuzz", "--kernel", "property_tests.planted:correct", "--iters", "100", "--device", "cpu",
            "--dtype", "bf16,fp16,fp32")
    assert r.exit_code == 0, r.stderr


def test_repro_reruns_a_printed_case():
    r = cli("fuzz", "--kernel", "property_tests.planted:wrong_scale", "--iters", "50", "--device", "cpu", "--no-db")
    command = re.search(r"reproduce: faverify repro --kernel (\S+) --device cpu --case '([^']+)'", r.stdout)
    assert command
    again = cli("repro", "--kernel", command.group(1), "--device", "cpu", "--case", command.group(2))
    assert again.exit_code == 1 and "FAIL" in again.stdout
    ok = cli("repro", "--kernel", "sdpa-math", "--device", "cpu", "--no-isolate", "--case", command.group(2))
    assert ok.exit_code == 0 and "verdict: pass" in ok.stdout


def test_same_seed_same_cases(tmp_path):
    runs = []
    for i in range(2):
        cli("fuzz", "--kernel", "sdpa-math", "--iters", "20", "--device", "cpu", "--no-db", "--seed", "7",
            "--json", tmp_path / f"{i}.json")
        runs.append(read_json(tmp_path / f"{i}.json")["kernels"][0]["stats"])
    strip = [[{k: v for k, v in row.items()} for row in run] for run in runs]
    assert strip[0] == strip[1]


def test_database_replays_a_failure_first(tmp_path):
    args = ("fuzz", "--kernel", "property_tests.planted:top_left_mask", "--iters", "30", "--device", "cpu",
            "--db", tmp_path / "db", "--json")
    cli(*args, tmp_path / "first.json")
    cli(*args, tmp_path / "second.json", "--seed", "99")
    second = read_json(tmp_path / "second.json")["kernels"][0]["failures"]
    assert second and second[0]["first"]["case"]["causal"]
    assert any((tmp_path / "db").iterdir())


@pytest.mark.parametrize("args,needle", [
    (("fuzz", "--kernel", "nosuch"), "--kernel='nosuch': unknown kernel"),
    (("fuzz", "--bogus-flag"), "No such option"),
    (("fuzz", "--dtype", "fp8"), "--dtype='fp8'"),
    (("fuzz", "--iters", "0"), "--iters=0: must be >= 1"),
    (("fuzz", "--max-seqlen", "0"), "--max-seqlen=0: must be >= 1"),
    (("mutants", "--max-seqlen", "0", "--device", "cpu"), "--max-seqlen=0: must be >= 1"),
    (("fuzz", "--iters", "many"), "many"),
    (("fuzz", "--device", "tpu"), "--device='tpu'"),
    (("fuzz", "--factor", "out=abc"), "--factor"),
    (("fuzz", "--tight", "out=-1"), "--tight='out=-1': must be a finite number >= 0"),
    (("golden", "verify", "--tight", "lse=nan"), "--tight='lse=nan'"),
    (("repro", "--kernel", "sdpa-math", "--case", "{bad"), "not valid JSON"),
    (("repro", "--kernel", "sdpa-math", "--case", '{"batch": 1}'), "missing required"),
])
def test_usage_errors_exit_2_with_one_line(args, needle):
    r = cli(*args)
    assert r.exit_code == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("faverify: error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_no_gpu_asked_for_exits_2():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the no-GPU path cannot be shown here")
    r = cli("fuzz", "--device", "cuda", "--iters", "1")
    assert r.exit_code == 2 and "no CUDA GPU" in r.stderr


def test_nothing_ran_is_never_exit_0():
    r = cli("fuzz", "--kernel", "property_tests.planted:declines_fp32", "--dtype", "fp32", "--iters", "5",
            "--device", "cpu")
    assert r.exit_code == 2 and "no case ran" in r.stderr and "fp32 is not implemented" in r.stderr


def test_a_user_kernel_that_declares_a_head_dim_multiple_is_fuzzed_on_multiples_alone(tmp_path):
    r = cli("fuzz", "--kernel", "property_tests.planted:takes_multiples_of_16", "--iters", "40", "--device", "cpu",
            "--no-db", "--json", tmp_path / "run.json")
    assert r.exit_code == 0, r.stderr[-2000:]
    summary = read_json(tmp_path / "run.json")["kernels"][0]["summary"]
    assert summary["passed"] == 40 and summary["skipped"] == 0, summary


def test_crashing_subject_is_a_failure_not_a_crash_of_the_run():
    r = cli("fuzz", "--kernel", "property_tests.planted:raises_type_error", "--iters", "30", "--device", "cpu")
    assert r.exit_code == 1 and "error:TypeError" in r.stdout and "planted crash" in r.stdout


def test_kernels_lists_the_builtins():
    r = cli("kernels")
    assert r.exit_code == 0
    for name in ("sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "triton"):
        assert name in r.stdout
    # every subject faverify ships loads; the adapters of other libraries only where their package imports
    unavailable = [line for line in r.stdout.splitlines() if " unavailable " in line]
    assert all(line.split()[0] in LIBRARIES and "does not import here" in line
               for line in unavailable), unavailable


@pytest.mark.parametrize("value", ["window=-1", "softcap=0", "softcap=x", "blocks", ""])
def test_bench_refuses_a_variant_it_does_not_know_naming_the_rule(value):
    r = cli("bench", "--variants", value, "--device", "cpu")
    assert r.exit_code == 2 and "--variants=" in r.stderr and "each must be dense, window=L" in r.stderr, r.stderr


def test_a_shape_budget_runs_shrinks_and_reports_within_its_shapes(tmp_path):
    """In the parallel mode (2 workers), a planted bug (a backward that zeroes dO: any shape shows it) found
    under --shapes 2 shrinks by replaying the budgeted draw (it reaches the failing case again) to a case of
    one of the two shapes, not to the least shape, where it would end without a budget; the settings say
    the budget; a budget below 0 is refused, naming the rule (0 lifts the default budget)."""
    from faverify.cases.strategies import CPU_LIMITS, SHAPE_FIELDS
    from faverify.run.draw import budget_pool
    from faverify.run.plan import FuzzPlan

    def pool(seed):
        return budget_pool(FuzzPlan(iters=12, seed=seed, dtypes=("bf16", "fp16"), limits=CPU_LIMITS, database=None,
                                    shapes=2))
    seed = next(s for s in range(50) if all((p["seqlen_q"], p["seqlen_k"]) != (1, 1) for p in pool(s)))
    r = cli("fuzz", "--kernel", "property_tests.planted:zeroes_dout", "--iters", "12", "--seed", seed, "--device",
            "cpu", "--workers", "2", "--shapes", "2", "--shrink-budget", "20", "--gradcheck-every", "0", "--no-db",
            "--json", tmp_path / "run.json")
    assert r.exit_code == 1, r.stderr[-2000:]
    run = read_json(tmp_path / "run.json")
    assert run["settings"]["shapes"] == 2 and "--shapes 2" in run["command"]
    failures = run["kernels"][0]["failures"]
    assert failures and all("did not reach" not in f["note"] for f in failures), [f["note"] for f in failures]
    for f in failures:
        for found in (f["first"]["case"], f["minimal"]["case"]):
            assert {k: found.get(k) for k in SHAPE_FIELDS} in pool(seed), (found, pool(seed))
    r = cli("fuzz", "--kernel", "sdpa-math", "--shapes", "-1", "--device", "cpu", "--no-db")
    assert r.exit_code == 2 and "--shapes" in r.stderr and "must be >= 0" in r.stderr


def test_the_command_line_of_a_fuzz_request_names_what_it_draws_and_parses_back():
    """The run file's command line (FuzzRequest.command) shows every option that says which cases ran and how
    they were judged where it differs from what leaving it out gives, and the fuzz command parses it back to
    the same values; the outputs and the run's resources stay out of it."""
    import dataclasses
    import shlex
    from pathlib import Path

    import typer

    from faverify.cli import app
    from faverify.commands.fuzz import FuzzRequest

    request = FuzzRequest(kernel="sdpa-math", iters=7, seed=3, dtype="fp16, bf16", mode="fwd", device="cpu",
                          max_seqlen=64, features="window", regimes="-tiny", layouts="contiguous", shard=" 1/3",
                          repeat=2, sequence=3, relations="batch", shapes=0, all_failures=True, scale="large",
                          json=Path("run.json"), workers=2, timeout=60.0)
    line = request.command()
    assert line.startswith("fuzz --kernel sdpa-math --iters 7 --seed 3 --dtype fp16,bf16 --mode fwd --device cpu "
                           "--max-seqlen 64"), line
    assert "--shard 1/3" in line and "--all-failures" in line and "--shapes 0" in line
    assert not {"--json", "--workers", "--timeout"} & set(line.split())
    words = shlex.split(line)
    params = typer.main.get_command(app).commands["fuzz"].make_context("fuzz", words[1:]).params
    for f in dataclasses.fields(FuzzRequest):
        if f.metadata["shown"]:
            given, show = getattr(request, f.name), f.metadata["show"]
            parsed = params["json_path" if f.name == "json" else f.name]
            assert show(getattr(parsed, "value", parsed)) == show(given), f.name
    assert FuzzRequest(kernel="triton").command() == ("fuzz --kernel triton --iters 100 --seed 0 --dtype bf16,fp16 "
                                                      "--mode both --device auto")
