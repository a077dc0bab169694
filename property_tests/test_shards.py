"""Shards of one fuzz and their merge, the fleet table of many doctors, and the Slurm and
Kubernetes examples of docs/ci.md."""
import copy
import json
import re
from pathlib import Path

import pytest

from faverify.cases.strategies import CPU_LIMITS
from faverify.reports.merge import parse_shard
from faverify.run.draw import draw_cases
from faverify.run.plan import FuzzPlan
from property_tests.cli_helpers import assert_commands_exist, cli, read_json

ROOT = Path(__file__).resolve().parent.parent


def test_the_shards_of_a_seed_run_every_case_once():
    plan = FuzzPlan(iters=200, seed=3, dtypes=("bf16", "fp16"), limits=CPU_LIMITS, database=None)
    cases = draw_cases(plan)
    shards = [[c for i, c in enumerate(cases) if i % 4 == k] for k in range(4)]
    assert sum(len(s) for s in shards) == 200
    assert sorted((c.to_json() for s in shards for c in s)) == sorted(c.to_json() for c in cases)


def _fuzz(kernel, out, *extra, iters=24):
    return cli("fuzz", "--kernel", kernel, "--iters", str(iters), "--seed", "3", "--device", "cpu", "--no-db",
               "--shrink-budget", "30", "--json", out, *extra)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["sdpa-math", "property_tests.planted:top_left_mask"])
def test_four_merged_shards_give_the_unsharded_runs_tables_and_failures(kernel, tmp_path):
    whole = _fuzz(kernel, tmp_path / "whole.json", "--workers", "2")
    for i in range(4):
        r = _fuzz(kernel, tmp_path / f"shard{i}.json", "--shard", f"{i}/4")
        assert r.exit_code in (0, 1), r.stderr[-2000:]
        assert read_json(tmp_path / f"shard{i}.json")["settings"]["shard"] == f"{i}/4"
    merged = cli("merge", *[tmp_path / f"shard{i}.json" for i in (2, 0, 3, 1)], "--json", tmp_path / "all.json")
    assert merged.exit_code == whole.exit_code
    a, b = read_json(tmp_path / "all.json")["kernels"][0], read_json(tmp_path / "whole.json")["kernels"][0]
    for key in ("cases", "passed", "failed", "skipped", "features", "skip_reasons", "regimes", "layouts"):
        assert a["summary"][key] == b["summary"][key], key
    rows = lambda k: {(r["dtype"], r["tensor"], r["outcome"]): r for r in k["stats"]}  # noqa: E731
    assert rows(a).keys() == rows(b).keys()
    for key, r in rows(a).items():
        for stat in ("cases", "failed", "waived", "max_abs", "max_ulp", "ratio_p50", "ratio_p99", "usage_p50",
                     "usage_max", "nan", "inf", "ref_max", "floor_share_p50"):
            assert r[stat] == rows(b)[key][stat], (key, stat)
        # nan_ok: a row of waived cases alone has no error to average, NaN on both sides
        assert float(r["mean_abs"]) == pytest.approx(float(rows(b)[key]["mean_abs"]), rel=1e-12, nan_ok=True)
    assert {f["signature"]: f["occurrences"] for f in a["failures"]} == \
        {f["signature"]: f["occurrences"] for f in b["failures"]}
    assert [(g["dtype"], g["checks"], g["failed"]) for g in a["gradcheck"]] == \
        [(g["dtype"], g["checks"], g["failed"]) for g in b["gradcheck"]]
    assert cli("report", tmp_path / "all.json").exit_code == 0
    assert "merged from 4 shards" in cli("report", tmp_path / "all.json").stdout


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    for i in range(2):
        assert _fuzz("sdpa-math", d / f"s{i}.json", "--shard", f"{i}/2", iters=8).exit_code == 0
    assert _fuzz("sdpa-math", d / "seed4.json", "--shard", "1/2", "--seed", "4", iters=8).exit_code == 0
    return d


@pytest.mark.parametrize("files,needle", [
    (["s0.json"], "RUN.json=['1/2']: shard(s) missing"),
    (["s0.json", "s0.json", "s1.json"], "is given twice"),
    (["s0.json", "seed4.json"], "seed=4: differs between shards"),
])
def test_merge_refuses_a_missing_doubled_or_foreign_shard(shards, files, needle):
    r = cli("merge", *[shards / f for f in files])
    assert r.exit_code == 2 and needle in r.stderr, r.stderr


def test_merge_refuses_a_run_that_is_not_a_shard(shards, tmp_path):
    _fuzz("sdpa-math", tmp_path / "plain.json", "--no-isolate", iters=4)
    r = cli("merge", tmp_path / "plain.json", shards / "s1.json")
    assert r.exit_code == 2 and "is not a shard" in r.stderr


@pytest.mark.parametrize("value", ["4/4", "1", "a/b", "-1/2", "0/0"])
def test_a_bad_shard_is_refused_naming_it(value):
    with pytest.raises(Exception, match="--shard"):
        parse_shard(value)
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "2", "--device", "cpu", "--no-db", "--shard", value)
    assert r.exit_code == 2 and "--shard" in r.stderr


def _doctor(node: str, triton_bits: str) -> dict:
    checks = [{"check": "golden: triton", "device": "cuda:0 NVIDIA H200", "status": "Pass", "detail": "47 cases pass"},
              {"check": "determinism: triton, 5 runs", "device": "cuda:0 NVIDIA H200", "status": "Pass",
               "detail": f"identical bits, sha256 {triton_bits}"}]
    return {"schema": "faverify.doctor", "version": 1, "level": "full", "node": node, "checks": checks,
            "environment": {"torch": "2.11.0", "driver": "580", "gpus": [{"name": "NVIDIA H200"}]},
            "failed": False, "passed_any": True}


def test_the_fleet_table_marks_the_node_whose_bits_differ(tmp_path):
    files = []
    for node, bits in (("a", "3a22"), ("b", "3a22"), ("c", "ffff")):
        files.append(tmp_path / f"{node}.json")
        files[-1].write_text(json.dumps(_doctor(node, bits)))
    r = cli("merge", *files, "--json", tmp_path / "fleet.json", "--markdown", tmp_path / "fleet.md")
    assert r.exit_code == 1 and r.stdout.startswith("FAIL: 1 row(s) failing or outlying on 1 node(s)")
    fleet = read_json(tmp_path / "fleet.json")
    outliers = [row for row in fleet["rows"] if row["outlier"]]
    assert [(o["node"], o["check"]) for o in outliers] == [("c", "determinism: triton, 5 runs")]
    assert "bits differ from 2 of 3 nodes' NVIDIA H200" in outliers[0]["outlier"]
    same = copy.deepcopy(_doctor("c", "3a22"))
    files[2].write_text(json.dumps(same))
    r = cli("merge", *files)
    assert r.exit_code == 0 and r.stdout.startswith("PASS: 3 nodes")


@pytest.mark.parametrize("fence", ["slurm", "kubernetes"])
def test_every_command_and_flag_of_the_scheduler_examples_exists(fence):
    text = (ROOT / "docs" / "ci.md").read_text()
    block = re.search(rf"```{fence}\n(.+?)\n```", text, re.S).group(1)
    calls = re.findall(r"faverify ([a-z]+ [^&|>\n\"]+)", block)
    assert {c.split()[0] for c in calls} >= {"fuzz", "merge"}
    assert_commands_exist(calls)
