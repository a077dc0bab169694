"""Compile every .cu file of the CUDA kernels for sm_80 and sm_90 with `-Xptxas -v`, no GPU needed, and
report registers, shared memory and spill bytes per kernel.

    python -m faverify.kernels.cuda.compile_report [--arch 80,90]

Exit status 1 on a compile error or on any kernel that spills (every kernel here is a main variant).
Static shared memory is what ptxas reports; the mma kernels take theirs dynamically, so their launchers'
sizes are listed from the same formula the launchers use.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from faverify.kernels.cuda import build

_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(sm_\d+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse(log: str) -> list:
    """ptxas -v output -> [{kernel, arch, registers, smem, stack, spill_stores, spill_loads}]."""
    rows, current = [], None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = {"kernel": m.group(1), "arch": m.group(2), "registers": 0, "smem": 0, "stack": 0,
                       "spill_stores": 0, "spill_loads": 0}
            rows.append(current)
        elif current and (m := _SPILL.search(line)):
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif current and (m := _USED.search(line)):
            current.update(registers=int(m.group(1)), smem=int(m.group(2) or 0))
    return rows


def demangle(names: list) -> dict:
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def compile_one(nvcc: str, source: Path, sm: str, workdir: str) -> tuple:
    """(source, arch, returncode, ptxas log)."""
    cmd = build.compile_command(nvcc, sm, source, Path(workdir) / f"{source.stem}_{sm}.o", extra=("-Xptxas", "-v"))
    done = subprocess.run(cmd, capture_output=True, text=True)
    return source.name, sm, done.returncode, done.stdout + done.stderr


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="80,90")
    args = parser.parse_args(argv)
    nvcc = build.find_nvcc()
    jobs = [(src, f"sm_{a}") for src in build.sources() for a in args.arch.split(",")]
    workers = min(len(jobs), os.cpu_count() or 1)  # more nvcc processes than cores only thrash
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda j: compile_one(nvcc, j[0], j[1], tmp), jobs))
    from tabulate import tabulate
    failed, rows = [], []
    for name, sm, code, log in results:
        if code != 0:
            failed.append(f"{name} for {sm}:\n{log}")
            continue
        rows += [dict(r, source=name) for r in parse(log)]
    names = demangle([r["kernel"] for r in rows])
    spills = [r for r in rows if r["spill_stores"] or r["spill_loads"]]
    table = [(r["source"], names[r["kernel"]].replace("fa::", ""), r["arch"], r["registers"], r["smem"],
              r["spill_stores"] + r["spill_loads"]) for r in rows]
    print(tabulate(table, headers=["file", "kernel", "arch", "registers", "static smem B", "spill B"]))
    for f in failed:
        print(f"\nCOMPILE ERROR {f}", file=sys.stderr)
    print(f"\n{len(rows)} kernels compiled from {len(results) - len(failed)}/{len(results)} (file, arch) builds; "
          f"{len(failed)} failed; {len(spills)} spill")
    return 1 if failed or spills or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
