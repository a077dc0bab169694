"""Instructions in the main loops of a CUDA kernel, from its SASS, on a machine without a GPU: how the CUDA
kernels' address arithmetic was found (docs/measurements.md, "CUDA kernels") before spending device time.

    python3 devtools/sass_loops.py mma_bwd.cu 'dkdv_kernelI13__nv_bfloat16Li128' [--arch sm_90] [--all-paths]

Compiles kernels/cuda/FILE with nvcc to a cubin, disassembles it with cuobjdump, and prints, for each loop
of the matching kernels (a backward branch closes a loop) longer than --min instructions, its length and
its opcodes. By default the sources are first copied and the common path pinned: `aligned` true, and the
edge-tile mask branches (`if (m0 + BN > p.sq ...` / `if (n0 + BN > p.sk ...`) never taken, so that the
count is what a warp issues per tile, not the sum over paths it skips. --all-paths keeps the sources as they are.

cuobjdump is not in nvcc-only installs: `pip download --no-deps nvidia-cuda-cuobjdump`, unzip the wheel,
and pass --cuobjdump PATH/nvidia/cu13/bin/cuobjdump (or put it on PATH).
"""
import argparse
import collections
import pathlib
import re
import shutil
import subprocess
import tempfile

SOURCES = pathlib.Path(__file__).resolve().parent.parent / "kernels" / "cuda"
# The common path: loads through cp.async, and a tile inside the sequence and off the causal diagonal.
PINS = [(r"const bool aligned = p\.aligned;", "const bool aligned = true;"),
        (r"if \((m0 \+ BN > p\.sq|n0 \+ BN > p\.sk)[^{]*\{", "if (false) {")]


def loops(sass: str, want: str, shortest: int):
    """(kernel, total instructions, [(start, end, length, opcode counts)]) for each kernel matching want."""
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        name = function.split("\n", 1)[0].strip()
        if want not in name:
            continue
        code = [(int(m.group(1), 16), m.group(2).strip())
                for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", function)]
        at = {address: i for i, (address, _) in enumerate(code)}
        found = []
        for i, (address, text) in enumerate(code):
            branch = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
            target = int(branch.group(1), 16) if branch else None
            if target is not None and target < address and target in at:
                body = code[at[target]:i + 1]
                if len(body) >= shortest:
                    ops = collections.Counter((t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0]
                                              for _, t in body)
                    found.append((target, address, len(body), ops))
        yield name, len(code), found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", help="a .cu file in kernels/cuda")
    parser.add_argument("kernel", help="a substring of the mangled kernel name")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--min", type=int, default=100, help="shortest loop to print, in instructions")
    parser.add_argument("--all-paths", action="store_true", help="do not pin the common path")
    parser.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp) / "cuda"
        shutil.copytree(SOURCES, work)
        if not args.all_paths:
            for source in work.glob("*.cu"):
                text = source.read_text()
                for pattern, replacement in PINS:
                    text = re.sub(pattern, replacement, text)
                source.write_text(text)
        cubin = pathlib.Path(tmp) / "kernels.cubin"
        subprocess.run([args.nvcc, "-std=c++17", "-O3", f"-arch={args.arch}", "-cubin", "-o", str(cubin),
                        str(work / args.file)], check=True)
        sass = subprocess.run([args.cuobjdump, "-sass", str(cubin)], check=True, capture_output=True,
                              text=True).stdout
    for name, total, found in loops(sass, args.kernel, args.min):
        print(f"{name}: {total} instructions")
        for start, end, length, ops in found:
            print(f"  loop {start:#x}-{end:#x}: {length} instructions: "
                  + ", ".join(f"{op} {n}" for op, n in ops.most_common(20)))


if __name__ == "__main__":
    main()
