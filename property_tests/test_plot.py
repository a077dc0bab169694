"""`faverify repro --plot`: the error of the failing tensor as a picture, a panel per head, tile edges marked."""
import pytest
import torch

from faverify.cases.case import Case
from faverify.errors import EnvironmentProblem
from faverify.reports.plot import error_map
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve
from faverify.subjects.base import Capabilities
from property_tests.cli_helpers import cli

PLANTED = "property_tests.planted:tile_edge_row"
CASE = Case(1, 130, 40, 3, 3, 32, dtype="bf16", seed=1)


def test_the_error_map_puts_a_tile_edge_bug_on_its_rows():
    """The planted bug scales the rows past each 64-row tile: those rows alone pass the allowance."""
    kept: dict = {}
    r = evaluate(resolve(PLANTED), CASE, "cpu", mode="fwd", keep=kept)
    assert r.status == "fail"
    ratio = error_map(kept["got"]["out"], kept["reference"]["out"], "out", r.metrics["out"].allowed)
    assert ratio.shape == (3, 130, 32)  # heads, query rows, head-dim columns
    rows = torch.nonzero(ratio.amax(dim=(0, 2)) > 1).flatten().tolist()
    assert rows == [64, 128], rows
    lse = error_map(torch.zeros(2, 3, 5), torch.ones(2, 3, 5), "lse", 0.5)
    assert lse.shape == (3, 5, 1) and torch.all(lse == 2.0)


def test_repro_plot_writes_an_svg_with_the_tile_edges(tmp_path):
    svg = tmp_path / "err.svg"
    r = cli("repro", "--kernel", PLANTED, "--case", CASE.to_json(), "--device", "cpu", "--mode", "fwd",
            "--plot", svg)
    assert r.exit_code == 1, r.stderr
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text and f"wrote {svg}: out (fails" in r.stdout
    assert "tile edges every 64 rows" in text and "head 2" in text and "head 3" not in text  # a panel per head


def test_plot_refuses_what_it_cannot_draw_and_names_the_extra():
    r = cli("repro", "--kernel", "sdpa-math", "--case", Case.of(1, 4, 4, 1, 1, 8, seqlens=((4, 4),)).to_json(),
            "--device", "cpu", "--plot", "x.svg")
    assert r.exit_code == 2 and "--plot" in r.stderr and "dense" in r.stderr, r.stderr
    import sys

    from faverify.reports import plot
    saved = sys.modules.get("matplotlib")
    sys.modules["matplotlib"] = None  # as if the extra were not installed
    try:
        with pytest.raises(EnvironmentProblem, match=r"pip install 'faverify\[plot\]'"):
            plot.write("x.svg", torch.zeros(1, 2, 2), "out", "t")
    finally:
        if saved is None:
            sys.modules.pop("matplotlib")
        else:
            sys.modules["matplotlib"] = saved
    with pytest.raises(ValueError, match="tile"):
        Capabilities.of(tile=(64,))


def test_the_markdown_report_of_a_dense_failure_says_how_to_draw_it(tmp_path):
    r = cli("fuzz", "--kernel", PLANTED, "--iters", "30", "--device", "cpu", "--mode", "fwd", "--no-db",
            "--max-seqlen", "200", "--markdown", tmp_path / "r.md")
    assert r.exit_code == 1, r.stderr
    assert "to see where its error sits, add `--plot err.svg`" in (tmp_path / "r.md").read_text()


def test_repro_plot_writes_the_format_its_suffix_names_or_refuses_it(tmp_path):
    png = tmp_path / "err.png"
    r = cli("repro", "--kernel", PLANTED, "--case", CASE.to_json(), "--device", "cpu", "--mode", "fwd",
            "--plot", png)
    assert r.exit_code == 1 and png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), r.stderr
    r = cli("repro", "--kernel", PLANTED, "--case", CASE.to_json(), "--device", "cpu", "--mode", "fwd",
            "--plot", tmp_path / "err.jpg")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "--plot" in lines[0] and ".svg or .png" in lines[0], r.stderr
    assert not (tmp_path / "err.jpg").exists() and "verdict" not in r.stdout  # refused before the case ran


def test_the_plot_title_fits_its_figure():
    """A title as long as a case's words (one head: the narrowest figure) is wrapped inside the figure."""
    from faverify.reports.plot import figure
    case = Case(2, 130, 1025, 8, 2, 192, dtype="fp16", causal=True, window=(3, 0), softcap=30.0, seed=12345)
    fig = figure(torch.rand(1, 130, 192), "out", f"property_tests.planted:tile_edge_row: {case.short()}: out fails",
                 (64, 64))
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent()
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height, (box, fig.bbox)
