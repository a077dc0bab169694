"""`faverify repro --plot FILE.svg` (or FILE.png): where a tensor's error sits, as a picture.

One panel per head (the first MAX_PANELS), for the batch entry with the largest error: the error of each
element over the error allowed, on a log scale, over (query row, head-dim column) for out, dq and lse, and
(key, head-dim column) for dk and dv. Where the subject declares its tile (Capabilities.tile: query rows,
keys), the tile edges are drawn across the rows: a bug at row 64 of a 64-row tile shows as a line on one.
Drawn with matplotlib, an optional extra (`pip install 'faverify[plot]'`).
"""
from __future__ import annotations

from pathlib import Path

import torch

from faverify.errors import EnvironmentProblem

MAX_PANELS = 16
FORMATS = {".svg": "svg", ".png": "png"}  # the file's suffix: the format it is written in
TITLE_POINTS = 9
KEY_ROWS = ("dk", "dv")  # tensors whose rows are keys; the others' are query rows
FLOOR = 1e-3  # errors under a thousandth of the allowance share the lowest colour


def refusal(case) -> str | None:
    """Why --plot cannot draw this case, or None."""
    if case.before:
        return "takes a case of one call; this one has earlier calls"
    if case.kind != "dense" or case.splits > 1 or case.shards != "off":
        return "draws a dense case's tensors; this one is " + (case.kind if case.kind != "dense" else "split")
    return None


def format_refusal(path) -> str | None:
    """Why --plot cannot write a file of this name, or None."""
    if Path(path).suffix.lower() not in FORMATS:
        return f"names the format by its suffix: {' or '.join(FORMATS)}"
    return None


def error_map(got: torch.Tensor, ref: torch.Tensor, tensor: str, allowed: float) -> torch.Tensor:
    """|got - ref| / allowed as [heads, rows, columns] of the batch entry with the largest error; lse
    ([b, h, sq]) as one column. Non-finite values of got count as an infinite error."""
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    if tensor in ("lse", "max_logit") or got.dim() == 3:
        got, ref = got.transpose(1, 2)[..., None], ref.transpose(1, 2)[..., None]  # [b, sq, h, 1]
    err = (got - ref).abs()
    err = torch.where(torch.isfinite(got) | ~torch.isfinite(ref), torch.nan_to_num(err, nan=0.0), torch.inf)
    worst = int(err.flatten(1).amax(dim=1).argmax())
    return err[worst].transpose(0, 1) / max(allowed, 1e-300)  # [h, rows, columns]


def write(path: Path, ratio: torch.Tensor, tensor: str, title: str, tile: tuple = ()) -> None:
    """The picture at `path`, in the format its suffix names (FORMATS)."""
    fig = figure(ratio, tensor, title, tile)
    from matplotlib import pyplot
    fig.savefig(path, format=FORMATS[Path(path).suffix.lower()], dpi=150)
    pyplot.close(fig)


def figure(ratio: torch.Tensor, tensor: str, title: str, tile: tuple = ()):
    """A matplotlib figure: a panel per head of `ratio` ([h, rows, columns]), the tile edges across the
    rows, the title wrapped to the figure's width."""
    import textwrap
    try:
        import matplotlib
    except ImportError:
        raise EnvironmentProblem("--plot draws with matplotlib: pip install 'faverify[plot]'") from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: searchable, and the file smaller
    from matplotlib import colors, pyplot

    heads = min(ratio.shape[0], MAX_PANELS)
    cols = min(heads, 4)
    rows = -(-heads // cols)
    fig, axes = pyplot.subplots(rows, cols, figsize=(3.2 * cols + 1.2, 3.0 * rows + 0.6), squeeze=False,
                                layout="constrained")
    top = max(float(ratio[torch.isfinite(ratio)].max()) if torch.isfinite(ratio).any() else 1.0, 1.0)
    norm = colors.LogNorm(vmin=FLOOR, vmax=top)
    edge = (tile[1] if tensor in KEY_ROWS else tile[0]) if tile else 0
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= heads:
            ax.axis("off")
            continue
        shown = ratio[h].clamp(min=FLOOR).nan_to_num(posinf=top).numpy()
        image = ax.imshow(shown, aspect="auto", interpolation="nearest", norm=norm, cmap="magma")
        for y in range(edge, shown.shape[0], edge or shown.shape[0]):
            ax.axhline(y - 0.5, color="cyan", linewidth=0.6)
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xlabel("head-dim column", fontsize=8)
        ax.set_ylabel("key" if tensor in KEY_ROWS else "query row", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.8, label=f"|{tensor} - reference| / allowed")
    more = f" (the first {heads} of {ratio.shape[0]} heads)" if ratio.shape[0] > heads else ""
    text = title + more + (f"; lines: tile edges every {edge} rows" if edge else "")
    # lines as wide as the figure, at about 0.6 em a character: a title of one line ran off a narrow figure
    width = int(fig.get_figwidth() * 72 / (0.6 * TITLE_POINTS))
    fig.suptitle(textwrap.fill(text, width, break_long_words=False), fontsize=TITLE_POINTS)
    return fig
