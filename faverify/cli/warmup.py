"""faverify warmup."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from faverify.cli.app import app
from faverify.cli.common import MAX_WORKERS, Mode, say, within
from faverify.errors import UsageError
from faverify.files import check_writable


@app.command()
def warmup(
    kernel: Annotated[str, typer.Option(help="The subject whose builds to compile: a built-in name or "
                                             "mutant:NAME")] = "triton",
    target: Annotated[Optional[str], typer.Option(help="The GPU to compile for, as its compute capability "
                                                       "(sm_90, sm_80); default: this machine's GPU")] = None,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Triton's cache to fill (a fuzz reads it with "
                                                           "TRITON_CACHE_DIR=DIR); default: Triton's own "
                                                           "(TRITON_CACHE_DIR, else ~/.triton/cache)")] = None,
    dtype: Annotated[str, typer.Option(help="The fuzz's --dtype: comma separated bf16, fp16, fp32")] = "bf16,fp16",
    features: Annotated[Optional[str], typer.Option(help="The fuzz's --features; default: every feature the "
                                                         "kernel declares")] = None,
    mode: Annotated[Mode, typer.Option(help="The fuzz's --mode: the backward's builds are left out for fwd")]
    = Mode.both,
    gradcheck_every: Annotated[int, typer.Option(help="The fuzz's --gradcheck-every: 0 leaves the gradient "
                                                      "check's dtype out", callback=within(0))] = 25,
    jobs: Annotated[Optional[int], typer.Option(help="Processes compiling at once (default: one a core)",
                                                callback=within(1, MAX_WORKERS))] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write what was compiled as JSON: each "
                                                                     "build's cache key, kernel and outcome")]
    = None,
) -> int:
    """Compile the Triton builds a fuzz of the kernel will need, across every core, into Triton's on-disk cache,
    on any machine: the GPU's fuzz then only loads them."""
    from faverify.commands.fuzz import parse_features
    from faverify.dtypes import parse_dtypes
    from faverify.run.warmup import Request, precompile
    from faverify.subjects import resolve
    dtypes = parse_dtypes(dtype)
    wanted = parse_features(features)
    subject = resolve(kernel)
    undeclared = [f for f in wanted or () if f not in subject.caps.features()]
    if undeclared:
        raise UsageError("--features", features, f"{kernel} does not declare {', '.join(undeclared)}")
    if target is not None:
        _check_target(target)
    elif not _has_gpu():
        raise UsageError("--target", None, "this machine has no GPU: name the one to compile for, e.g. sm_90")
    check_writable("--cache-dir", cache_dir, directory=True)
    check_writable("--json", json_path)
    request = Request(kernel, mode.value, dtypes, subject.caps.features() if wanted is None else wanted,
                      gradcheck_every > 0, target=target or "", jobs=jobs or 0)
    done = precompile(request, str(cache_dir) if cache_dir else None)
    if done.error:
        raise UsageError("--kernel", kernel, f"its builds could not be listed here: {done.error}")
    if not done.cases:
        raise UsageError("--kernel", kernel, "declares no warm-up (Subject.warmup): nothing to compile ahead")
    say(f"{done.cases} warm-up cases: {done.describe()}")
    for b in done.failed[:10]:
        say(f"  failed to compile: {b['kernel']}: {b['error']}")
    if done.untraced:
        say(f"  {len(done.untraced)} cases whose builds could not be listed without their GPU (a fuzz warms them "
            f"in its workers); the first: {done.untraced[0][1]}")
    if json_path is not None:
        import json
        json_path.write_text(json.dumps(done.to_dict(), indent=1))
    return 1 if done.failed else 0


def _check_target(text: str) -> None:
    from faverify.kernels.triton.build.target import parse
    try:
        parse(text)
    except ValueError as e:
        raise UsageError("--target", text, str(e)) from None


def _has_gpu() -> bool:
    import torch
    return torch.cuda.is_available()
