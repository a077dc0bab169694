"""faverify bench --decode: the configurations, the rows a subject gives (paged where it declares it, the
dense path otherwise), the bandwidth figures and the ratios against sdpa-flash and flex. The timing itself
needs a GPU; here it is replaced by a fixed time so the rest runs on any machine."""
import math

import pytest
import torch

from faverify.commands import bench, bench_decode
from faverify.commands.bench_decode import DecodeConfig
from property_tests.cli_helpers import cli


def test_every_configuration_reads_the_same_cache_bytes_with_gqa_8():
    configs = bench_decode.configs(("bf16",), (128,), bench_decode.CACHE_LENS, (16, 64))
    assert len(configs) == 8 and {c.cache_bytes(2) for c in configs} == {2 * 131072 * 4 * 128 * 2}
    paged = DecodeConfig("bf16", 128, 4096, 64).case(paged=True, splits=3)
    assert (paged.batch, paged.seqlen_q, paged.nheads // paged.nheads_k) == (32, 1, 8)
    assert paged.paged.cache_seqlens == (4096,) * 32 and paged.paged.page_size == 64 and paged.splits == 3
    dense = DecodeConfig("bf16", 128, 131072, 16).case(paged=False)
    assert dense.kind == "dense" and (dense.batch, dense.seqlen_k) == (1, 131072)


def test_a_paged_subject_is_timed_paged_and_split_by_its_rule_the_others_contiguous(monkeypatch):
    from faverify.kernels.triton.interface import num_splits_for
    from faverify.subjects import resolve
    timed = []

    def fake_time(fn):  # one call, as do_bench's first would make, then a fixed 0.5 ms
        timed.append(fn())
        return 0.5
    monkeypatch.setattr(bench, "_time", fake_time)
    # the call itself is timed, not a CUDA graph's replay (which returns nothing): bench.graphed as without a GPU
    monkeypatch.setattr(bench, "graphed", lambda fn, device: (fn, "eager"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = DecodeConfig("fp32", 16, 64, 16, tokens=128)  # batch 2
    paged = bench_decode.time_row(resolve("triton-paged"), config, device, peak=1e12)
    assert paged["validated"] == "pass" and paged["layout"] == "paged" and paged["page_size"] == 16
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 8
    assert paged["splits"] == num_splits_for(config.batch, 32, 1, 64, sms, 4)
    assert paged["cache_tbps"] == pytest.approx(config.cache_bytes(4) / 0.5e-3 * 1e-12)
    assert paged["of_copy"] == pytest.approx(paged["cache_tbps"])  # peak 1 TB/s
    # the kernels the timed call ran, in the row and its table's last column: the packed decode
    assert paged["paths"] == ["fwd variant decode split"], paged["paths"]
    assert bench_decode.table_rows([paged])[0][-1] == "fwd variant decode split"
    dense = bench_decode.time_row(resolve("triton"), config, device, peak=1e12)
    assert dense["validated"] == "pass" and dense["layout"] == "contiguous" and dense["page_size"] == 0
    assert timed[0][0].shape == timed[1][0].shape == (config.batch, 1, 32, 16)


def test_a_decode_the_subject_cannot_run_is_a_row_with_the_reason():
    from faverify.subjects import resolve
    row = bench_decode.time_row(resolve("triton-varlen"), DecodeConfig("bf16", 16, 64, 16), "cpu", peak=1e12)
    assert row["validated"] == "skip" and row["note"] and "ms" not in row


def test_ratios_are_against_the_dense_path_and_flex_of_the_same_cache():
    rows = [dict(kernel=k, dtype="bf16", head_dim=128, cache_len=n, page_size=p, batch=1, validated="pass", ms=ms)
            for k, n, p, ms in (("triton-paged", 4096, 16, 0.2), ("triton-paged", 4096, 64, 0.1),
                                ("sdpa-flash", 4096, 0, 0.3), ("flex", 4096, 0, 0.4), ("triton-paged", 8192, 16, 1.0))]
    rows = bench_decode.ratios(rows)
    assert rows[0]["vs_sdpa-flash"] == pytest.approx(1.5) and rows[1]["vs_flex"] == pytest.approx(4.0)
    assert math.isnan(rows[4]["vs_flex"])  # no flex row at that cache length
    table = bench_decode.table_rows(rows)
    assert len(table[0]) == len(bench_decode.HEADERS) and table[2][5] == "-"  # the dense path has no pages


@pytest.mark.parametrize("args, message", [(("--page-sizes", "0"), "--page-sizes='0': must be integers >= 1"),
                                           (("--seqlens", "4k"), "--seqlens='4k': must be comma separated integers")])
def test_bench_decode_refuses_bad_sizes_naming_the_argument(args, message):
    r = cli("bench", "--decode", *args, "--device", "cpu")
    assert r.exit_code == 2 and message in r.stderr, r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times GPU kernels")
def test_bench_decode_on_the_gpu_writes_rows_with_bandwidth(tmp_path):
    from property_tests.cli_helpers import read_json
    r = cli("bench", "--decode", "--kernel", "triton-paged", "--seqlens", "4096", "--headdims", "128",
            "--dtype", "bf16", "--page-sizes", "64", "--json", tmp_path / "d.json")
    report = read_json(tmp_path / "d.json")
    assert r.exit_code == 0, r.stdout
    assert 0.5e12 < report["copy_tbps"] * 1e12 < 10e12
    ours = [row for row in report["rows"] if row["kernel"] == "triton-paged"]
    assert ours and all(row["validated"] == "pass" and row["cache_tbps"] > 0 for row in ours), ours


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_decode_is_timed_from_a_cuda_graph_and_a_call_that_cannot_be_captured_eagerly():
    """bench.graphed: the replay runs the captured kernels on the captured buffers (a q changed in place
    changes the graph's out as a fresh call's); the bundled decode, whose block-table check syncs outside
    a capture only, is captured; a call that syncs with the host inside one too cannot be, and is timed
    eagerly with the reason, as is one that a capture refuses for any other reason."""
    from faverify.cases.inputs import make_inputs
    from faverify.commands.bench import graphed
    from faverify.subjects import resolve
    subject = resolve("triton-paged")
    config = DecodeConfig("bf16", 128, 4096, 16, tokens=8192)
    case = config.case(paged=True, splits=4)
    x = make_inputs(case, "cuda")
    outs = []
    with torch.no_grad():
        replay, how = graphed(lambda: outs.append(subject(x.q, x.k, x.v, case, x.extras())[0]), "cuda")
        assert how == "cuda graph"
        x.q.mul_(-1.5)
        replay()
        torch.cuda.synchronize()
        fresh = subject(x.q, x.k, x.v, case, x.extras())[0]
        assert torch.equal(outs[-1], fresh)  # the last append is the capture's: its buffer holds the replay's out

        def syncs():
            return subject(x.q, x.k, x.v, case, x.extras())[0].sum().item()
        timed, how = graphed(syncs, "cuda")
        assert timed is syncs and how.startswith("eager (a call waits on the device"), how

        def refuses():  # no sync: an error met only under capture
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("refused while capturing")
            return x.q * 2
        timed, how = graphed(refuses, "cuda")
    assert timed is refuses and how == "eager (CUDA graph capture failed: RuntimeError: refused while capturing)", how
    assert torch.randn(4, device="cuda").isfinite().all()  # the default generator draws again


def test_without_a_gpu_a_call_is_timed_as_it_is():
    from faverify.commands.bench import graphed

    def fn():
        return 1
    assert graphed(fn, "cpu") == (fn, "eager")
