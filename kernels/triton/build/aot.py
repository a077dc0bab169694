"""Compile every Triton kernel variant ahead of time for sm_80 and sm_90, with no GPU.

A variant is a kernel with its compile-time constants: dtype, padded head dim (16..256; fp16, whose code
is bf16's but for the conversions, at 64 and 128; fp32 from 64; on sm_80 bf16 alone: _compiled), causal,
and whether the head dim fills the padding (EVEN_D; the odd-head-dim path is compiled for bf16 from 64, it
differs from the others only in masks), each with the tile its launcher picks by default; on sm_90 also
the Hopper forward, the Hopper backwards and each of their mutants (kernels/mutants). Pointers and strides
are declared 16-byte aligned, as they are for contiguous inputs; so the 16-bit forward for sm_90 is the
one that loads through tensor descriptors (TMA), as it runs there. For each variant: shared memory from the
compiler, registers and stack frame from cuobjdump on the cubin (ptxas puts spilled registers in the
stack frame; a nonzero one is reported as a spill).

    python -m faverify.kernels.triton.build.aot [--jobs N] [--arch 80,90]

Run with TRITON_INTERPRET unset: interpreted kernels cannot be compiled. Exit status 1 on any failure.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

from faverify.kernels.triton.build import sass
from faverify.kernels.triton.build.sources import (
    FUSED_BWD_KERNEL,
    _fp8_source,
    _hopper_bwd_source,
    _hopper_source,
    _sparse_source,
    _triton_source,
    _variant_source,
)
from faverify.kernels.triton.common import BLOCK_DS

KERNELS = ("fwd", "dkdv", "dq", "preprocess")
HOPPER_KERNEL = "fwd-hopper"  # the Hopper forward (hopper/forward.py): sm_90 only, 16-bit, head dims 64 and 128
# a mutant of it (kernels/mutants/catalog.py, HOPPER_MUTANTS): they run on sm_90 only, so nowhere in CI; that
# each compiles is what the CPU can check of them
HOPPER_MUTANT_KERNEL = "fwd-hopper-mutant"
HOPPER_BWD_KERNEL = "bwd-hopper"  # the Hopper dK/dV (hopper/backward.py): sm_90 only, 16-bit, head dims 64 and 128


VARIANT_KERNELS = ("vfwd", "vdkdv", "vdq", "vcombine", "vdecode")  # variant/forward.py, variant/backward.py
SPARSE_KERNELS = ("sfwd", "sbwd")  # sparse.py: key indices, forward and backward
FP8_KERNEL = "ffwd"  # fp8.py: the FP8 forward, e4m3 tensor cores from sm_89: compiled for sm_90 alone


@dataclass(frozen=True)
class AotBuild:
    kernel: str
    dtype: str
    block_d: int
    causal: bool
    even_d: bool
    # the variant kernels: v's padded head dim (0: block_d) and the compile-time switches on, "+"-joined
    block_dv: int = 0
    switches: str = ""
    mutant: str = ""  # HOPPER_MUTANT_KERNEL's: the mutant's name

    def __str__(self) -> str:
        if self.kernel == HOPPER_MUTANT_KERNEL:
            return (f"{self.kernel} {self.mutant} {self.dtype} D{self.block_d} {'causal' if self.causal else 'full'}"
                    f" {self.switches or 'dense'}")
        if self.kernel in (HOPPER_BWD_KERNEL, FUSED_BWD_KERNEL) and self.mutant:
            return f"{self.kernel}-mutant {self.mutant} {self.dtype} D{self.block_d} causal {self.switches}".rstrip()
        if self.kernel == HOPPER_KERNEL and self.switches:
            return f"{self.kernel} {self.dtype} D{self.block_d} {self.switches}"
        if self.kernel in SPARSE_KERNELS:
            return f"{self.kernel} {self.dtype} D{self.block_d}"
        if self.kernel == FP8_KERNEL:
            return f"{self.kernel} e4m3 D{self.block_d} {'causal' if self.causal else 'full'}"
        if self.kernel in VARIANT_KERNELS:
            dv = f" DV{self.block_dv}" if self.block_dv and self.block_dv != self.block_d else ""
            build = " fast" if self.even_d and self.kernel != "vcombine" else ""
            return f"{self.kernel} {self.dtype} D{self.block_d}{dv} {self.switches or 'plain'}{build}"
        return (f"{self.kernel} {self.dtype} D{self.block_d} {'causal' if self.causal else 'full'}"
                f"{'' if self.even_d else ' odd-d'}{' ' + self.switches if self.switches else ''}")


# The variant kernels' compile-time switches as the subjects launch them: none (windows, causal, ALiBi and
# sinks are runtime values), softcap, varlen, paged split-KV decode. One kernel is compiled per set of
# switches, padded head dims and dtype whatever the shapes or values, so these sets, at the head dims and
# dtypes below, are the variants whose code differs; not every combination of values.
SWITCH_SETS = {"vfwd": ("", "softcap", "varlen+softcap", "paged+split+softcap", "bias+blocks"),
               "vdkdv": ("", "varlen+softcap", "bias+blocks"), "vdq": ("", "varlen+softcap", "bias+blocks+dbias")}


HOPPER_SWITCH_SETS = ("window", "softcap", "window+softcap", "alibi", "sinks", "window+softcap+alibi+sinks")

# Head dims whose fp32 and odd-head-dim builds are left out: those builds are the larger ones' code at a
# smaller constant, and at 16 and 32 they kept at most 48 bytes of stack and 33 KB of shared memory on both
# archs (the AOT report, 2026-12-03); the report's compile time is what CI waits on longest
SMALL = (16, 32)


def variant_kernel_variants() -> list:
    """q/k and v padded alike (variant.interface._dims), so block_dv is block_d for all of them; even_d
    names the fast build (head dims unmasked, the streamed tensors aligned: variant.interface.fast_build),
    its absence the generic one."""
    out = []
    for dtype, bd in (("bf16", 64), ("bf16", 128), ("fp32", 64)):
        out += [AotBuild(k, dtype, bd, False, even, bd, sw) for k, sets in SWITCH_SETS.items() for sw in sets
                for even in ((False, True) if dtype == "bf16" and "bias" not in sw else (False,))]
    out += [AotBuild("vfwd", "fp16", 128, False, False, 128, sw) for sw in SWITCH_SETS["vfwd"][:2]]
    out += [AotBuild(k, "bf16", 256, False, even, 256, "") for k in SWITCH_SETS for even in (False, True)]
    out += [AotBuild("vcombine", "bf16", 0, False, True, bdv, "") for bdv in (64, 128)]
    # the paged decode with a GQA group packed in its rows (variant.decode._decode): split, with softcap
    out += [AotBuild("vdecode", "bf16", bd, False, even, bd, "split+softcap") for bd in (64, 128, 256)
            for even in (False, True)]
    out += [AotBuild("vdecode", "fp32", 64, False, False, 64, "split")]
    return out


def variants(capability: int = 80) -> list:
    """The variants compiled for one compute capability: every Triton kernel's, and on sm_90 the Hopper
    forward's, whose tile is configs.HOPPER's (what the launcher takes there)."""
    out = []
    if capability == 90:
        out += [AotBuild(HOPPER_KERNEL, dtype, block_d, causal, True)
                for dtype in ("bf16", "fp16") for block_d in (64, 128) for causal in (False, True)]
        # the variants it takes (interface._hopper_variant): a window (both bounds), softcap, both
        out += [AotBuild(HOPPER_KERNEL, "bf16", block_d, False, True, switches=sw)
                for block_d in (64, 128) for sw in HOPPER_SWITCH_SETS]
        out += hopper_mutant_variants()
        out += [AotBuild(HOPPER_BWD_KERNEL, dtype, block_d, causal, True, switches=fused)
                for fused in ("", "fused-dq") for dtype in ("bf16", "fp16") for block_d in (64, 128)
                for causal in (False, True)]
        out += [AotBuild(FUSED_BWD_KERNEL, dtype, block_d, causal, True) for dtype in ("bf16", "fp16")
                for block_d in (64, 128) for causal in (False, True)]
        out += hopper_bwd_mutant_variants()
        out += [AotBuild(FP8_KERNEL, "fp8e4nv", block_d, causal, True) for block_d in (64, 128, 256)
                for causal in (False, True)]
    for kernel in KERNELS:
        for dtype in ("bf16", "fp16", "fp32"):
            # fp16's code is bf16's but for its conversions: its builds at the head dims the speed rows use
            for block_d in (64, 128) if dtype == "fp16" else BLOCK_DS:
                for causal in ((False,) if kernel == "preprocess" else (False, True)):
                    for even_d in ((True, False) if dtype == "bf16" else (True,)):
                        if _compiled(dtype, block_d, even_d, capability):
                            out.append(AotBuild(kernel, dtype, block_d, causal, even_d))
    # the dense backward's ALiBi build (dense/backward.py's ALIBI: what ALiBi alone, or with sinks, takes)
    out += [AotBuild(kernel, "bf16", block_d, causal, True, switches="alibi") for kernel in ("dkdv", "dq")
            for block_d in (64, 128) for causal in (False, True)]
    out += [AotBuild(kernel, dtype, block_d, False, True, block_d) for kernel in SPARSE_KERNELS
            for dtype, block_d in (("bf16", 64), ("bf16", 128), ("fp16", 128), ("fp32", 64))]
    return out + [v for v in variant_kernel_variants() if _compiled(v.dtype, v.block_d, True, capability)]


def _compiled(dtype: str, block_d: int, even_d: bool, capability: int) -> bool:
    """Whether the report compiles a build: on sm_80 bf16's alone (fp16's code is bf16's but for its
    conversions, and fp32's tiles are small ones, far from the shared memory sm_80 has); at head dims 16 and
    32 no fp32 or odd-head-dim build (SMALL)."""
    if capability == 80 and dtype != "bf16":
        return False
    return not (block_d in SMALL and (dtype == "fp32" or not even_d))


def hopper_bwd_mutant_variants() -> list:
    """Each Hopper backward mutant's causal build: the Hopper dK/dV's with dQ fused (its subject's mode; every
    marked statement is compiled there), the fused backward's (kernel FUSED_BWD_KERNEL)."""
    from faverify.kernels.mutants.catalog import FUSED_BWD_MUTANTS, HOPPER_BWD_MUTANTS
    return [AotBuild(HOPPER_BWD_KERNEL, "bf16", 128, True, True, switches="fused-dq", mutant=m.name)
            for m in HOPPER_BWD_MUTANTS] + [AotBuild(FUSED_BWD_KERNEL, "bf16", 128, True, True, mutant=m.name)
                                            for m in FUSED_BWD_MUTANTS]


def hopper_mutant_variants() -> list:
    """Each Hopper mutant's causal forward (the non-causal one's loop and more: the masked diagonal), with
    the switches of the features it is fuzzed with (a statement under a switch that is off is not compiled)."""
    from faverify.kernels.mutants.catalog import HOPPER_MUTANTS
    return [AotBuild(HOPPER_MUTANT_KERNEL, "bf16", 128, True, True, switches="+".join(m.cases.get("features", ())),
                    mutant=m.name) for m in HOPPER_MUTANTS]


def ptx_digest(ptx: str) -> str:
    """sha256 of the PTX without its debug lines (.loc, .file, the debug sections), which move with every
    edit of the source: equal digests mean a refactor left the generated code as it was."""
    import hashlib
    body = ptx.split("\t.section\t.debug", 1)[0]
    lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith((".loc", ".file", "$L__", "//"))]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def compile_variant(v: AotBuild, capability: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget

    from faverify.kernels.triton import configs

    build = _hopper_source if v.kernel in (HOPPER_KERNEL, HOPPER_MUTANT_KERNEL) else \
        _hopper_bwd_source if v.kernel in (HOPPER_BWD_KERNEL, FUSED_BWD_KERNEL) else \
        _variant_source if v.kernel in VARIANT_KERNELS else _sparse_source if v.kernel in SPARSE_KERNELS else \
        _fp8_source if v.kernel == FP8_KERNEL else _triton_source
    source, options, tile = build(v, capability)
    start = time.perf_counter()
    result = {"variant": str(v), **asdict(v), "sm": capability, "tile": tile}
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    except Exception as e:  # reported per variant; the other variants still compile
        result.update(ok=False, error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
        return result
    result.update(ok=True, shared=compiled.metadata.shared, seconds=round(time.perf_counter() - start, 2),
                  ptx=ptx_digest(compiled.asm["ptx"]), **sass.resources(compiled.asm["cubin"]))
    limit = configs.SMEM_LIMIT[capability // 10]
    if compiled.metadata.shared > limit:
        result.update(ok=False, error=f"needs {compiled.metadata.shared} B of shared memory, sm_{capability} "
                                      f"allows {limit}")
    return result


def _job(args):
    return compile_variant(*args)


def compile_all(capabilities=(80, 90), jobs: int = 2) -> list:
    work = [(v, cap) for cap in capabilities for v in variants(cap)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_job, work, chunksize=4))


def _outcome(r: dict) -> str:
    if not r["ok"]:
        return "FAIL: " + r["error"]
    return "ok" if r.get("stack", 0) + r.get("local", 0) == 0 else "ok, spills"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--arch", default="80,90", help="compute capabilities, e.g. 80,90")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("aot: unset TRITON_INTERPRET: interpreted kernels cannot be compiled", file=sys.stderr)
        return 2
    from tabulate import tabulate

    start = time.perf_counter()
    results = compile_all(tuple(int(a) for a in args.arch.split(",")), args.jobs)
    rows = [[r["variant"], f"sm_{r['sm']}", r["tile"], r.get("shared", "-"), r.get("registers", "-"),
             r.get("stack", "-"), r.get("seconds", "-"), _outcome(r)] for r in results]
    print(tabulate(rows, headers=["variant", "arch", "tile", "shared B", "regs", "stack B", "compile s", "result"],
                   tablefmt="simple"))
    failed = [r for r in results if not r["ok"]]
    spilled = [r for r in results if r["ok"] and r["stack"] + r["local"] > 0]
    print(f"{len(results)} variants compiled in {time.perf_counter() - start:.0f} s, {len(failed)} failed, "
          f"{len(spilled)} spill")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
