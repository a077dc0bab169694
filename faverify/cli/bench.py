"""faverify bench."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cli.app import app
from faverify.cli.common import DeviceOpt, Mode, progress_bar, show, write_outputs
from faverify.errors import EnvironmentProblem, UsageError
from faverify.files import check_writable
from faverify.run.signals import held, sigterm_interrupts


def ints(text: str, argument: str) -> list:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(argument, text, "must be comma separated integers") from None
    if not values or min(values) < 1:
        raise UsageError(argument, text, "must be integers >= 1")
    return values


@app.command()
def bench(
    kernel: Annotated[str, typer.Option(help="Subjects to time next to the SDPA backends, comma separated")] = "triton",
    seqlens: Annotated[Optional[str], typer.Option(
        help="Comma separated (default 1024,4096,16384; with --decode the cache lengths, default "
             "4096,16384,65536,131072)")] = None,
    headdims: Annotated[str, typer.Option(help="Comma separated")] = "64,128",
    dtype: Annotated[str, typer.Option(help="Comma separated: bf16, fp16")] = "bf16,fp16",
    causal: Annotated[str, typer.Option(help="both | true | false")] = "both",
    variants: Annotated[str, typer.Option(help="Comma separated: dense, window=L, softcap=C, alibi, sinks "
                                               "(each timed where a subject declares it)")] = "dense",
    decode: Annotated[bool, typer.Option(help="Time decode instead: one query token against a KV cache, GQA 8, "
                                              "paged where a subject declares it (the cache read's "
                                              "bandwidth)")] = False,
    page_sizes: Annotated[str, typer.Option(help="With --decode: comma separated page sizes")] = "16,64",
    mode: Annotated[Mode, typer.Option(help="Time the forward, the backward, or both")] = Mode.both,
    tune: Annotated[bool, typer.Option(help="Try the candidate tiles of the bundled Triton kernels per shape")] = True,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the rows as JSON")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="Write the table and TF/s charts as Markdown")] = None,
    device: DeviceOpt = "cuda",
) -> int:
    """TFLOP/s of kernels next to torch SDPA (flash, cuDNN, efficient), each validated against FP64 first."""
    import json

    from faverify import devices
    from faverify.commands.bench import YARDSTICKS, configs, headers, parse_variants, ratios, table_rows
    from faverify.commands.bench import markdown as bench_markdown
    from faverify.dtypes import parse_dtypes
    from faverify.reports.tables import table
    from faverify.run.isolation import check_imports
    from faverify.subjects import resolve_many

    check_writable("--json", json_path)
    check_writable("--markdown", markdown)
    choices = {"both": (False, True), "true": (True,), "false": (False,)}
    if causal not in choices:
        raise UsageError("--causal", causal, "must be both, true or false")
    head_dims = ints(headdims, "--headdims")
    variant_names = parse_variants(variants)
    if max(head_dims) > 256:
        raise UsageError("--headdims", headdims, "each head dim must be <= 256")
    from faverify.commands.bench_decode import CACHE_LENS
    seqlens = seqlens or ",".join(str(n) for n in (CACHE_LENS if decode else (1024, 4096, 16384)))
    lengths = ints(seqlens, "--seqlens")
    pages = ints(page_sizes, "--page-sizes")
    target = devices.resolve(device)[0]
    if target.type != "cuda":
        raise EnvironmentProblem("bench times GPU kernels: it needs --device cuda and a GPU")
    check_imports(kernel, 300.0)  # a module that ends its process at import ends a worker's, not this one
    if decode:
        return _decode(kernel, lengths, head_dims, dtype, pages, target, json_path, markdown)
    names = list(dict.fromkeys([s.strip() for s in kernel.split(",") if s.strip()] + list(YARDSTICKS)))
    subjects = resolve_many(",".join(names))
    modes = ("fwd", "bwd") if mode == Mode.both else (mode.value,)
    todo = configs(parse_dtypes(dtype), head_dims, lengths, choices[causal], variant_names)
    rows, interrupted = _measure(subjects, todo, target, modes, tune)
    with held():  # a signal now waits until the rows are written
        from faverify import env as environment
        rows = ratios(rows)
        command = (f"bench --kernel {kernel} --seqlens {seqlens} --headdims {headdims} --dtype {dtype} "
                   f"--causal {causal} --variants {variants} --mode {mode.value}")
        document = {"schema": "faverify.bench", "version": 1, "interrupted": interrupted, "rows": rows}
        heading = environment.header_lines(environment.collect())
        write_outputs([("--json", json_path, lambda: json.dumps(document, indent=1, default=str)),
                       ("--markdown", markdown, lambda: bench_markdown(rows, command, heading, interrupted))])
    show(table(table_rows(rows), headers(rows), "table"))
    failed = [r for r in rows if r["validated"] == "fail"]
    if interrupted and not failed:
        raise EnvironmentProblem(f"interrupted after {len(rows)} measurements; those were written")
    return 1 if failed else 0


def _measure(subjects: list, todo: list, target, modes: tuple, tune: bool) -> tuple:
    """(a row per config and subject, whether a stop cut the measuring short)."""
    from faverify.commands.bench import time_row
    rows = []
    with progress_bar() as progress, sigterm_interrupts():
        task = progress.add_task("bench", total=len(todo) * len(subjects), failed=0)
        try:
            for config in todo:
                for subject in subjects:
                    # tiles tuned for one 16-bit dtype serve the other (same element size, same tiles)
                    tuned_already = config.dtype != todo[0].dtype or config.variant != "dense"
                    rows.append(time_row(subject, config, target, modes=modes, tune=tune and not tuned_already))
                    progress.update(task, advance=1)
        except KeyboardInterrupt:  # the rows measured so far are still written
            return rows, True
    return rows, False


DECODE_YARDSTICKS = ("sdpa-flash", "sdpa-cudnn", "flex")


def _decode(kernel: str, lengths: list, head_dims: list, dtype: str, page_sizes: list, target,
            json_path, markdown) -> int:
    """bench --decode: bench_decode's rows, each subject against the dense path and flex."""
    import json

    from faverify.commands import bench_decode
    from faverify.dtypes import parse_dtypes
    from faverify.reports.tables import table
    from faverify.subjects import resolve_many

    kernel = "triton-paged" if kernel == "triton" else kernel  # the bundled decode kernel by default
    names = list(dict.fromkeys([s.strip() for s in kernel.split(",") if s.strip()] + list(DECODE_YARDSTICKS)))
    subjects = resolve_many(",".join(names))
    rows, interrupted = [], False
    with progress_bar() as progress, sigterm_interrupts():
        peak = bench_decode.copy_bandwidth(target)
        todo = bench_decode.configs(parse_dtypes(dtype), head_dims, lengths, page_sizes)
        task = progress.add_task("bench --decode", total=len(todo) * len(subjects), failed=0)
        try:
            for config in todo:
                for subject in subjects:
                    # the dense path has no pages: its row once per cache length
                    if subject.caps.ragged.paged or config.page_size == page_sizes[0]:
                        rows.append(bench_decode.time_row(subject, config, target, peak))
                    progress.update(task, advance=1)
        except KeyboardInterrupt:  # the rows measured so far are still written
            interrupted = True
    with held():
        rows = bench_decode.ratios(rows)
        text = table(bench_decode.table_rows(rows), bench_decode.HEADERS, "table")
        header = f"device copy bandwidth {peak * 1e-12:.2f} TB/s (read + write of 2 GiB), measured first"
        seqlens = ",".join(map(str, lengths))
        document = {"schema": "faverify.bench-decode", "version": 1, "interrupted": interrupted,
                    "copy_tbps": peak * 1e-12, "rows": rows}
        write_outputs([("--json", json_path, lambda: json.dumps(document, indent=1, default=str)),
                       ("--markdown", markdown, lambda: f"# faverify bench --decode --kernel {kernel} --seqlens "
                        f"{seqlens}\n\n- {header}\n\n" + table(bench_decode.table_rows(rows), bench_decode.HEADERS,
                                                              "md") + "\n")])
    show(header + "\n" + text)
    failed = [r for r in rows if r["validated"] == "fail"]
    if interrupted and not failed:
        raise EnvironmentProblem(f"interrupted after {len(rows)} measurements; those were written")
    return 1 if failed else 0
