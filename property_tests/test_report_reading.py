"""The report as a reviewer reads it: numbers that explain themselves, the passing and failing cases'
statistics apart, Mermaid charts GitHub renders (parsed here), and compare across schema versions."""
import json
import math
import re

import pytest

from faverify.commands.bench import markdown as bench_markdown
from faverify.env import header_lines
from property_tests.cli_helpers import cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    # seqlen_k = 1 and exact baselines are frequent in 60 cases: the ratios that were inf there. No sinks:
    # a sink far above every logit leaves out about 1e-48, which rounds to 0, a relative error of 1 that
    # means nothing
    for name, kernel in (("good", "sdpa-math"), ("bad", "property_tests.planted:top_left_mask")):
        r = cli("fuzz", "--kernel", kernel, "--iters", "60", "--device", "cpu", "--no-db", "--seed", "7",
                "--no-isolate", "--dtype", "bf16,fp32", "--json", d / f"{name}.json",
                *(("--features", "window,softcap,alibi,head_dim_v,varlen,paged") if name == "good" else ()))
        assert r.exit_code in (0, 1), r.stderr[-2000:]
    return d


def parse_xychart(block: str) -> dict:
    """What GitHub's Mermaid needs of an xychart: the header, a quoted x-axis of categories, a y-axis
    range, and each bar and line series a list of numbers, one per category."""
    lines = [line.strip() for line in block.strip().splitlines()]
    assert lines[0] == "```mermaid" and lines[1] == "xychart-beta" and lines[-1] == "```", lines
    chart = {"bars": [], "lines": []}
    for line in lines[2:-1]:
        if line.startswith("title "):
            chart["title"] = re.fullmatch(r'title "([^"]*)"', line).group(1)
        elif line.startswith("x-axis "):
            inside = re.fullmatch(r"x-axis \[(.*)\]", line).group(1)
            chart["x"] = re.findall(r'"([^"]*)"', inside)
            assert inside.count('"') == 2 * len(chart["x"])
        elif line.startswith("y-axis "):
            m = re.fullmatch(r'y-axis "([^"]*)" (\S+) --> (\S+)', line)
            chart["y"] = (float(m.group(2)), float(m.group(3)))
        else:
            kind, values = re.fullmatch(r"(bar|line) \[(.*)\]", line).groups()
            chart[kind + "s"].append([float(v) for v in values.split(",")])
    for series in chart["bars"] + chart["lines"]:
        assert len(series) == len(chart["x"]) and all(math.isfinite(v) for v in series)
        assert max(series) <= chart["y"][1]
    return chart


def _charts(text: str) -> list:
    return [parse_xychart(b) for b in re.findall(r"```mermaid\n.*?\n```", text, re.S)]


def _stats(path):
    return json.loads(path.read_text())["kernels"][0]["stats"]


def test_no_ratio_is_inf_and_ulps_of_a_correct_subject_are_a_few(runs):
    rows = _stats(runs / "good.json")
    assert rows and all(r["outcome"] == "passing" for r in rows)
    for r in rows:
        assert math.isfinite(float(r["ratio_max"])), r
        # counted at the tensor's magnitude, not next to 0: a few ulps of a 16-bit output (sdpa-math computes
        # in fp32); lse and dsinks are fp32 whatever the case's dtype, and fp32 sums drift by hundreds
        if r["dtype"] != "fp32" and r["tensor"] not in ("lse", "dsinks"):
            assert float(r["max_ulp"]) <= 4, r
            assert float(r["max_rel"]) < 0.1, r
    md = cli("report", runs / "good.json", "--format", "md").stdout
    stats = md.split("## Error statistics")[1].split("##")[0]
    cells = [c.strip() for line in stats.splitlines() if line.startswith("| sdpa-math") for c in line.split("|")]
    assert cells and "inf" not in cells and "-inf" not in cells
    assert "max abs ref" in stats and "one rounding of the tensor's terms" in md


def test_passing_and_failing_cases_have_statistics_apart(runs):
    rows = _stats(runs / "bad.json")
    passing = [r for r in rows if r["outcome"] == "passing"]
    failing = [r for r in rows if r["outcome"] == "failing"]
    assert passing and failing
    assert all(r["failed"] == 0 and float(r["usage_max"]) <= 1 for r in passing)
    assert all(float(r["usage_max"]) > 1 for r in failing if r["tensor"] == "out")
    md = cli("report", runs / "bad.json", "--format", "md").stdout
    assert md.index("## Error statistics of the passing cases") < md.index("## Error statistics of the failing cases")


def test_the_margin_chart_parses_and_plots_the_passing_rows(runs):
    md = cli("report", runs / "good.json", "--format", "md").stdout
    [chart] = _charts(md)
    rows = _stats(runs / "good.json")
    assert chart["x"] == [f"{r['dtype']} {r['tensor']}" for r in rows]
    assert chart["bars"][0] == pytest.approx([float(r["usage_max"]) for r in rows], rel=1e-3)
    assert chart["lines"][0] == pytest.approx([float(r["usage_p50"]) for r in rows], rel=1e-3, abs=1e-12)
    assert chart["lines"][1] == [1.0] * len(rows) and chart["y"][1] >= 1.2
    assert "```mermaid" not in cli("report", runs / "good.json").stdout  # the terminal keeps tables, with bars
    assert re.search(r"#*\.*\|", cli("report", runs / "good.json").stdout)


def _bench_row(kernel, seqlen, fwd, bwd, causal=False):
    return {"kernel": kernel, "dtype": "bf16", "head_dim": 128, "causal": causal, "seqlen": seqlen,
            "fwd_tflops": fwd, "bwd_tflops": bwd, "validated": "pass", "fwd_vs_sdpa-flash": math.nan}


def test_bench_markdown_charts_tflops_against_seqlen_a_line_per_kernel():
    rows = [_bench_row(k, s, f * s / 1024, b * s / 1024) for k, f, b in (("triton", 300, 200), ("sdpa-flash", 400, 250))
            for s in (1024, 4096, 16384)]
    rows.append(_bench_row("triton", 4096, 150.0, math.nan, causal=True))  # no backward measured there
    md = bench_markdown(rows, "bench --kernel triton", ["GPUs: test"])
    assert md.startswith("**7 measurements**") and "| triton" in md
    charts = _charts(md)
    assert [c["title"].split(",")[0] for c in charts] == ["fwd TF/s", "bwd TF/s", "fwd TF/s"]
    full_fwd = charts[0]
    assert full_fwd["x"] == ["1024", "4096", "16384"] and "lines: triton, sdpa-flash" in full_fwd["title"]
    assert full_fwd["lines"] == [[300.0, 1200.0, 4800.0], [400.0, 1600.0, 6400.0]]
    assert charts[2]["x"] == ["4096"] and charts[2]["lines"] == [[150.0]]


def test_the_header_says_a_cpu_build_of_torch_in_words():
    lines = header_lines({"torch": "2.13.0+cpu", "torch_cuda": "cpu build", "gpus": []})
    assert "torch 2.13.0+cpu (a CPU build, no CUDA)" in lines[1]
    assert "(built for CUDA 13.0)" in header_lines({"torch": "2.11.0", "torch_cuda": "13.0"})[1]


def _as_version_2(data: dict) -> dict:
    """A run file as version 2 wrote it: one stats row of every case, the older ratio and ulps."""
    data["version"] = 2
    for k in data["kernels"]:
        k["stats"] = [{key: v for key, v in r.items() if key not in ("outcome", "usage_p50", "usage_p99", "ref_max")}
                      for r in k["stats"] if r["outcome"] == "passing"]
    return data


def test_compare_reads_version_2_and_leaves_the_redefined_statistics_uncompared(runs, tmp_path):
    old = tmp_path / "v2.json"
    old.write_text(json.dumps(_as_version_2(json.loads((runs / "good.json").read_text()))))
    assert cli("report", old).exit_code == 0
    r = cli("compare", old, runs / "good.json", "--all")
    assert r.exit_code == 0, r.stdout
    from faverify.reports.results import VERSION
    assert f"run schema version 2 -> {VERSION}: max_rel, max_ulp, ratio_p99 defined anew, not compared" in r.stdout
    marks = {line.split()[3]: line.split()[-1] for line in r.stdout.splitlines() if line.startswith("sdpa-math ")
             and line.split()[2] == "out"}
    assert marks["max_ulp"] == "x" and marks["ratio_p99"] == "x" and marks["max_abs"] != "x"


def test_compare_puts_the_tensors_whose_margin_shrank_first_among_the_worse(runs, tmp_path):
    head = json.loads((runs / "good.json").read_text())
    for r in head["kernels"][0]["stats"]:
        r["usage_max"] = float(r["usage_max"]) * 1.8  # closer to the limit
        r["max_abs"] = float(r["max_abs"]) * 4
    (tmp_path / "head.json").write_text(json.dumps(head))
    r = cli("compare", runs / "good.json", tmp_path / "head.json")
    assert r.exit_code == 1
    first = r.stdout.splitlines()[0]
    assert first.startswith("REGRESSION: the head is worse (0 newly failing (!)")
    assert "the margin shrank on sdpa-math bf16 " in first
    marked = [line.split() for line in r.stdout.splitlines() if line.startswith("sdpa-math ") and line.endswith("+")]
    n = len(head["kernels"][0]["stats"])
    assert [row[3] for row in marked[:n]] == ["usage_max"] * n and {row[3] for row in marked[n:]} == {"max_abs"}


def test_bench_variants_count_their_pairs_and_compare_with_dense_and_flex():
    """A window's FLOPs count the (query, key) pairs it keeps; a variant row's time is given against the
    same subject's dense row and its speed against flex's row of the same variant; the variant is a column
    and a chart of its own."""
    from faverify.commands.bench import Config, headers, ratios, table_rows
    dense, wide = Config("bf16", 128, True, 1024), Config("bf16", 128, True, 1024, "window=1023")
    assert wide.pairs() == dense.pairs() + 512  # the diagonal: n(n+1)/2 against flash-attn's n^2/2
    assert Config("bf16", 128, True, 1024, "window=0").pairs() == 1024
    assert Config("bf16", 64, False, 8, "window=2").pairs() == 8 * 5 - 2 * (1 + 2)  # rows at both edges lose keys
    assert Config("bf16", 64, False, 8, "window=2").case().window == (2, 2) and wide.case().window == (1023, 0)
    assert Config("fp16", 64, False, 8, "softcap=30").case().softcap == 30.0
    rows = [dict(_bench_row(k, 1024, f, b, causal=True), variant=v, fwd_ms=m, bwd_ms=2 * m)
            for k, v, f, b, m in (("triton", "dense", 400.0, 300.0, 1.0), ("triton", "window=256", 100.0, 80.0, 0.3),
                                  ("flex", "window=256", 60.0, 40.0, 0.6), ("sdpa-flash", "dense", 500.0, 320.0, 0.8))]
    rows = ratios(rows)
    mine = rows[1]
    assert mine["fwd_time_vs_dense"] == pytest.approx(0.3) and mine["bwd_vs_flex"] == pytest.approx(2.0)
    assert mine["fwd_vs_sdpa-flash"] == pytest.approx(100 / 500)  # against flash's dense row
    assert math.isnan(rows[2]["fwd_vs_flex"])  # flex against itself: nothing to say
    assert "variant" in headers(rows) and len(headers(rows)) == len(table_rows(rows)[0])
    assert [r[5] for r in table_rows(rows)] == ["dense", "window=256", "window=256", "dense"]
    titles = [c["title"] for c in _charts(bench_markdown(rows, "bench", ["GPUs: test"]))]
    assert any("window=256" in t for t in titles) and any("window" not in t for t in titles)


def test_bench_rows_compare_with_each_library_the_run_timed():
    """With flash-attn-4 (an anchor library, bench.ANCHORS) in the run, every row gets its speed against
    flash-attn-4's row of the same configuration and variant, a column per direction; without it, none."""
    from faverify.commands.bench import headers, ratios, table_rows
    rows = [dict(_bench_row(k, 1024, f, b, causal=True), variant="dense")
            for k, f, b in (("triton", 400.0, 300.0), ("flash-attn-4", 500.0, 600.0), ("sdpa-cudnn", 450.0, 520.0))]
    rows = ratios(rows)
    assert rows[0]["fwd_vs_flash-attn-4"] == pytest.approx(0.8) and rows[0]["bwd_vs_flash-attn-4"] == pytest.approx(0.5)
    assert math.isnan(rows[1]["fwd_vs_flash-attn-4"])  # itself
    head = headers(rows)
    assert head.count("vs flash-attn-4") == 2 and len(head) == len(table_rows(rows)[0])
    assert table_rows(rows)[0][head.index("vs flash-attn-4")] == "0.80"
    assert "vs flash-attn-4" not in headers(ratios([r for r in rows if r["kernel"] != "flash-attn-4"]))
