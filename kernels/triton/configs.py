"""Tile configurations for the Triton kernels: candidates as data, a pruning predicate, defaults, and the
table of what tuning chose (filled by `faverify bench --tune`, which prints each choice).

A launch uses, in order: the tuned choice for its key if bench has tuned it, else the default for its
head dim. Tuning is explicit: a fuzz run draws thousands of shapes and must not stop to benchmark each.
"""
from __future__ import annotations

from dataclasses import dataclass

from faverify.kernels.triton.common import INTERPRET


@dataclass(frozen=True)
class Tile:
    block_m: int  # query rows per tile
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int
    hopper: bool = False  # the warp-specialized Hopper forward (hopper/forward.py) rather than dense/forward.py

    def __str__(self) -> str:
        text = f"M{self.block_m} N{self.block_n} w{self.num_warps} s{self.num_stages}"
        return text + " hopper" if self.hopper else text


CANDIDATES = {
    "fwd": [Tile(m, n, w, s) for m in (32, 64, 128) for n in (16, 32, 64, 128) for w in (4, 8) for s in (1, 2, 3, 4)],
    # dkdv: block_n keys stay on chip while block_m query rows stream past; dq the other way round
    "dkdv": [Tile(m, n, w, s) for m in (16, 32, 64) for n in (32, 64, 128) for w in (4, 8) for s in (1, 2, 3)],
    "dq": [Tile(m, n, w, s) for m in (32, 64, 128) for n in (16, 32, 64) for w in (4, 8) for s in (1, 2, 3)],
}
SMEM_LIMIT = {8: 163 * 1024, 9: 227 * 1024}  # usable shared memory per block, by compute capability major


def shared_bytes(kind: str, tile: Tile, block_d: int, elem: int) -> int:
    """Shared memory a config needs: the pipelined streaming tiles plus the resident ones (an estimate,
    checked against the compiler's own figure by the AOT compile test)."""
    if kind == "fwd":  # q resident, k and v streamed
        return (tile.block_m * block_d + tile.num_stages * 2 * tile.block_n * block_d) * elem
    if kind == "dkdv":  # k, v resident, q and dO streamed
        return (2 * tile.block_n * block_d + tile.num_stages * 2 * tile.block_m * block_d) * elem
    return (2 * tile.block_m * block_d + tile.num_stages * 2 * tile.block_n * block_d) * elem


def fp32_registers(kind: str, tile: Tile, block_d: int) -> float:
    """fp32 values each thread holds: accumulators plus score tiles, counted as if all were live at once.
    The compiler reuses some (s and p share registers), so up to 192 fits in 255 registers; past it, it
    spills to the stack (seen in the AOT report: M128 N128 w4 at head dim 128, 256 by this count, gets a
    12 KB stack frame on sm_80). The AOT report's stack column checks every default against this."""
    m, n = tile.block_m, tile.block_n
    if tile.hopper:  # the Hopper forward: consumer warpgroups of 64 rows each, block_m // 64 of them
        m = 64
    held = {"fwd": m * block_d + m * n,  # acc, s/p
            "dkdv": 2 * n * block_d + 2 * n * m,  # dk, dv, p^T, ds^T
            "dq": m * block_d + 2 * m * n}[kind]  # dq, p, ds
    return held / (32 * tile.num_warps)


def keep(kind: str, tile: Tile, block_d: int, elem: int, capability_major: int = 9) -> bool:
    """Prune configs that cannot fit or cannot pay off."""
    if shared_bytes(kind, tile, block_d, elem) > SMEM_LIMIT.get(capability_major, SMEM_LIMIT[8]):
        return False
    if fp32_registers(kind, tile, block_d) > 192:
        return False
    # the Hopper forward's three consumers get 160 registers each (hopper.layouts.registers), which a
    # 64 x 128 accumulator and a 64 x block_n score tile with two copies of p do not fit
    if tile.hopper and tile.block_m > 128 and block_d > 64:
        return False
    # 8 warps on a small tile leave each warp too little work (the Triton tutorial's rule)
    if tile.num_warps == 8 and tile.block_m * tile.block_n < 128 * 128 and kind == "fwd":
        return False
    return True


def candidates(kind: str, block_d: int, elem: int, capability_major: int = 9) -> list:
    return [t for t in CANDIDATES[kind] if keep(kind, t, block_d, elem, capability_major)]


# Interpreter: tiles small next to CPU-sized seqlens (<= 256) so every case still has several tiles and
# tails, unequal so a swapped BLOCK_M/BLOCK_N shows; large enough that NumPy does the work, not Python.
# What `faverify bench --tune` times: the candidates around the measured optimum (all of CANDIDATES would
# cost minutes of compilation per shape).
TUNING = {
    "fwd": [Tile(128, 64, 4, s) for s in (2, 3, 4)] + [Tile(128, 128, w, s) for w in (4, 8) for s in (2, 3)]
    + [Tile(64, 64, 4, 3), Tile(64, 64, 4, 4), Tile(64, 128, 4, 3)],
    "dkdv": [Tile(32, 128, 4, 2), Tile(32, 128, 4, 3), Tile(64, 128, 8, 2), Tile(64, 128, 8, 3),
             Tile(32, 64, 4, 3), Tile(64, 64, 4, 3)],
    "dq": [Tile(128, 32, 4, 2), Tile(128, 32, 4, 3), Tile(128, 64, 8, 2), Tile(128, 64, 8, 3),
           Tile(64, 32, 4, 3), Tile(64, 64, 4, 3)],
}


def tuning_candidates(kind: str, block_d: int, elem: int, capability_major: int = 9, hopper: bool = False) -> list:
    """hopper: the Hopper forward can run (hopper_forward), and its tiles compete too."""
    extra = [Tile(m, n, 4, s, hopper=True) for m in (128, 192) for n in (64, 128) for s in (2, 3)
             ] if hopper and kind == "fwd" else []
    return [t for t in TUNING[kind] + extra if keep(kind, t, block_d, elem, capability_major)]


_INTERPRETED = {"fwd": Tile(64, 32, 4, 1), "dkdv": Tile(32, 64, 4, 1), "dq": Tile(64, 32, 4, 1)}


DECODE_TILE = 16  # the decode kernel's rows: a GQA group's query heads (times its few queries), packed
# Programs of the decode kernel's 16-bit tile an SM holds at once (154 registers a thread over 4 warps, 64 KB
# of shared memory for its 2 stages; Nsight Compute on the H200): the split rule fills these slots once
# (interface.num_splits_for). sm_80's 164 KB of shared memory holds 2.
DECODE_PROGRAMS_PER_SM = 3


def decode(elem: int, fast: bool) -> Tile:
    """The tile of the paged decode kernel (variant.decode._decode): 16 rows (a GQA group's query heads,
    packed), keys in tiles that divide the split block (variant.interface.SPLIT_BLOCK). The 16-bit fast
    build takes 64 keys a step over 2 stages (no spill at head dims 64-256 on sm_80 or sm_90); the generic
    build, whose loads are element by element, and fp32 take 16 (at 32 keys the generic build kept 168-272
    bytes of stack at head dims 128 and 256; the AOT report). Not yet timed on a GPU."""
    if INTERPRET:
        return Tile(DECODE_TILE, 32, 4, 1)
    return Tile(DECODE_TILE, 64, 4, 2) if fast and elem == 2 else Tile(DECODE_TILE, 16, 4, 1)


def _fp32(kind: str, block_d: int) -> Tile:
    """fp32 runs its products on the CUDA cores (input_precision="ieee"), whose dot layout holds far more
    per thread than the tensor-core one: the 16-bit tiles, or even M64 N128, spilled up to 45 KB of stack
    and took 30-45 s each to compile (sm_80/sm_90, the AOT report). Small tiles over 8 warps spill at most
    16 bytes and compile in 1-4 s; fp32 is the gradient check's dtype, not a speed target."""
    if kind == "fwd":
        return Tile(64 if block_d <= 64 else 32 if block_d <= 128 else 16, 32, 8, 1)
    return Tile(16, 32, 8, 1)  # dq: 16 query rows, 32 keys; dkdv: 16 query rows past 32 keys


def tma_forward(elem: int, capability_major: int) -> bool:
    """Whether the forward loads through tensor descriptors (TMA) for this element size on this GPU, given
    16-byte aligned tensors (interface._use_tma checks those): 16-bit dtypes on sm_90 and later. fp32 keeps
    its small CUDA-core tiles (_fp32) and the pointer loads they were measured with."""
    return elem == 2 and capability_major >= 9


# The forward's best tiles on an H200 (bf16, seqlens 4096 and 16384), by (head dim, causal).
# Through tensor descriptors (TMA, sm_90+; devtools/triton_fwd_sweep.py, 2026-11-30 at 7b1fc13): the loads
# cost no registers, so d128 fits M128 N64 over one warpgroup with two blocks per SM (492-522 TF/s; M128
# N128 w8, the pointer path's best, gave 422-498).
# Through pointers (sm_80, or strides TMA cannot take): `faverify bench --tune` on the H200 (2026-11-30);
# at d128 M128 N64 w4 spills there (296 bytes of stack, 308-320 TF/s in the same sweep).
# docs/measurements.md, "Forward", has the tables.
_FWD = {True: {(64, False): Tile(128, 128, 4, 3), (64, True): Tile(128, 128, 4, 3),
               (128, False): Tile(128, 64, 4, 2), (128, True): Tile(128, 64, 4, 2)},
        False: {(64, False): Tile(128, 64, 4, 4), (64, True): Tile(128, 128, 4, 3),
                (128, False): Tile(128, 128, 8, 3), (128, True): Tile(128, 128, 8, 3)}}


def hopper_forward(elem: int, capability_major: int, block_d: int) -> bool:
    """Whether the warp-specialized Hopper forward (hopper/forward.py) can run, given tensors that load
    through TMA: 16-bit, sm_90 exactly (wgmma is Hopper's; later GPUs have other matrix instructions),
    padded head dim 64 or 128 (its consumer warpgroups hold 64 x BLOCK_D accumulators; HOPPER's tiles)."""
    return elem == 2 and capability_major == 9 and block_d in (64, 128)


# The Hopper forward's tiles: block_m = 64 query rows per consumer warpgroup, block_n keys per stage of the
# k/v ring, num_warps of one consumer (the launch's), num_stages of the ring. From devtools/triton_fwd_sweep.py
# on the H200 (bf16, 2026-11-30 at 7ed83cf; docs/measurements.md, "Forward"): d64 takes three
# consumers (M192: 0.91-1.06x cuDNN at seqlen 4096 and 16384 non-causal, against 0.79-0.92x with two), d128
# two (M128 N128: 0.92-1.01x; M128 N64 0.80-0.86x).
HOPPER = {64: Tile(192, 128, 4, 2, hopper=True), 128: Tile(128, 128, 4, 2, hopper=True)}
# A softcap build's tanh (hopper.layouts.tanh_approx, one instruction a logit) fits HOPPER's tiles without
# spilling but at d64 beside a window or ALiBi (56 and 344 bytes of stack at M192 N128 with the window and
# with every switch; AOT report, sm_90, 2026-12-04): there two consumers and 64 keys a stage, which keep none
HOPPER_SOFTCAP = {64: Tile(128, 64, 4, 2, hopper=True)}


def hopper_tile(block_d: int, softcap: bool = False, crowded: bool = False) -> Tile:
    """The Hopper forward's tile at a padded head dim; softcap with another per-logit switch (a window or
    ALiBi: crowded) takes HOPPER_SOFTCAP's."""
    return HOPPER_SOFTCAP.get(block_d, HOPPER[block_d]) if softcap and crowded else HOPPER[block_d]


def default(kind: str, block_d: int, elem: int, causal: bool, tma: bool = False, hopper: bool = False) -> Tile:
    """Starting points measured on an H200, pruned to what fits. tma: the forward loads through tensor
    descriptors (interface._use_tma); hopper: the Hopper forward can run (hopper_forward)."""
    if kind == "fwd" and hopper and not INTERPRET:
        return HOPPER[block_d]
    if INTERPRET:
        return _INTERPRETED[kind]  # small tiles: many tiles and tails even at CPU-sized seqlens
    if elem == 4:
        return _fp32(kind, block_d)
    wide = block_d > 128  # 16-bit here: fp32 took its tiles above
    if kind == "fwd":
        preferred = _FWD[tma].get((block_d, causal), Tile(128, 64, 4, 3) if not wide else Tile(64, 64, 4, 2))
    # the backward (docs/measurements.md, "Backward"): dq takes what `faverify bench --tune` chose in
    # every row on the H200 (2026-11-30; no spill on sm_90); dkdv at d128 too: causal M64 N128 w8 s2 (bench
    # --tune at 259e8f3: 1.05-1.06x sdpa-flash, against 0.95-0.96 with s3), non-causal s3; elsewhere M32 N128
    elif kind == "dkdv":
        preferred = (Tile(64, 128, 8, 2 if causal else 3) if block_d == 128 else Tile(32, 128, 4, 3) if not wide
                     else Tile(32, 64, 8, 2))
    else:
        preferred = (Tile(128, 64, 8, 3) if block_d == 128 else Tile(64, 64, 4, 3) if not wide
                     else Tile(64, 32, 8, 2))
    if keep(kind, preferred, block_d, elem, 8):
        return preferred
    # the largest tile that fits an sm_80 block (fp32 at head dim 256 needs small ones), deepest pipeline
    return max(candidates(kind, block_d, elem, 8),
               key=lambda t: (t.block_m * t.block_n, t.num_stages, -t.num_warps))


_CHOSEN: dict = {}  # (kind, block_d, elem, causal, seqlen bucket, tma) -> Tile


def seqlen_bucket(seqlen: int) -> int:
    return min(16384, max(1024, 1 << (max(seqlen, 1) - 1).bit_length()))


def select(kind: str, block_d: int, elem: int, causal: bool, seqlen: int, tma: bool = False,
           hopper: bool = False) -> Tile:
    key = (kind, block_d, elem, causal, seqlen_bucket(seqlen), tma)
    return _CHOSEN.get(key) or default(kind, block_d, elem, causal, tma, hopper)


def record(kind: str, block_d: int, elem: int, causal: bool, seqlen: int, tile: Tile, tma: bool = False) -> None:
    _CHOSEN[(kind, block_d, elem, causal, seqlen_bucket(seqlen), tma)] = tile


# The variant kernels' tiles (variant/forward.py, variant/backward.py): one per kind, head-dim class and
# varlen or not, whatever the shape, chosen by the AOT report's stack column (python -m
# faverify.kernels.triton.build.aot; bf16, sm_80 and sm_90, 2026-12-02) as the largest that spill nothing with
# every switch on: the forward's M128 N32 w8 at head dim 64 (M64 N64 w4 spilled 360 bytes); at 128
# M64 N32 w8 s1 (M128 N32 8 bytes), and the varlen build M32 N32 w8 (M64 N32 w8 s1 80-208 bytes, M128 N32
# 320-464); dq M32 N32 w8 at 64 and M16 N32 w8 at 128 (M32 N32 8-24 bytes varlen); dk/dv M32 N32 w8 at 64,
# M16 N32 w8 s1 at 128 (s2 32 bytes varlen); at 256 M16 N32 w8 s1 forward, M16 N16 w8 s1 dk/dv and dq
# (M16 N32: 8-24 and 56-176 bytes). A starting point for correctness, not tuned: the variants' speed is
# what `faverify bench --variants` measures.
_VARIANT = {"fwd": Tile(128, 32, 8, 2), "dkdv": Tile(32, 32, 8, 2), "dq": Tile(32, 32, 8, 2)}
_VARIANT_128 = {"fwd": Tile(64, 32, 8, 1), "dkdv": Tile(16, 32, 8, 1), "dq": Tile(16, 32, 8, 2)}
_VARIANT_WIDE = {"fwd": Tile(16, 32, 8, 1), "dkdv": Tile(16, 16, 8, 1), "dq": Tile(16, 16, 8, 1)}


# Builds with a bias or a block mask hold their pointer tiles too: these spilled 160-656 bytes at the tiles
# above on sm_80 (the AOT report); smaller ones, picked for no spill (dk/dv at d128 keeps 8 bytes on sm_80 at
# every tile tried, M16 N16 w4 and w8 among them; none on sm_90)
_MASKED = {(4, "fwd"): Tile(16, 32, 8, 1), (2, 64, "dkdv"): Tile(16, 32, 8, 2), (2, 128, "fwd"): Tile(32, 32, 8, 2),
           (2, 128, "dkdv"): Tile(16, 16, 8, 1)}


# The fast build's tiles (16-bit, variant.interface.fast_build: aligned tensors, head dims that fill their
# padding, so the streamed loads are vectorized and unmasked; no bias or block mask), by padded head dim:
# the fastest of devtools/variant_sweep.py's candidates on the H200 with ALiBi and with softcap (bf16, seqlen
# 16384, causal, 2026-12-03; docs/measurements.md, "Variants"), one tile for both where they
# differ: at 128 dk/dv M32 N128 w8 s1 (276 and 201 TF/s for the whole backward; M64 N128 w8 291 and 165),
# dq M128 N64 w8 s3, the forward M128 N64 w8 s3 (406 and 183; M64 N64 w4 366 and 190); at 64 dk/dv M32 N128
# w4 (228 and 120), dq M128 N64 w8 s3, the forward M64 N64 w4 (258 and 143). Some spill (the AOT report:
# up to 816 bytes of stack, dq with varlen and softcap on sm_80; _FAST_SM80 below) and still ran faster
# than the tiles that do not: the generic build's tiles gave 22-30 TF/s backward. At 256 (not swept) M32
# N64 w8 for the forward and dq, which spill nothing, and the generic build's dk/dv tile.
_FAST = {64: {"fwd": Tile(64, 64, 4, 2), "dkdv": Tile(32, 128, 4, 2), "dq": Tile(128, 64, 8, 3)},
         128: {"fwd": Tile(128, 64, 8, 3), "dkdv": Tile(32, 128, 8, 1), "dq": Tile(128, 64, 8, 3)},
         256: {"fwd": Tile(32, 64, 8, 2), "dkdv": _VARIANT_WIDE["dkdv"], "dq": Tile(32, 64, 8, 2)}}
# On sm_80 (no such GPU to time here) dk/dv's M32 N128 at 128 kept 3432 bytes of stack with varlen and
# softcap (720 without): M16 N128 w8 s1 keeps 72-152 there (the AOT report, 2026-12-03)
_FAST_SM80 = {(128, "dkdv"): Tile(16, 128, 8, 1)}


def variant(kind: str, block_d: int, elem: int, varlen: bool = False, masked: bool = False, fast: bool = False,
            capability_major: int = 9) -> Tile:
    """The tile of a variant kernel; block_d the larger padded head dim of q/k and v; varlen: the build
    for packed sequences (cu_seqlens); masked: a build with a bias or a block mask; fast: the fast build,
    for a GPU of this compute capability."""
    if INTERPRET:
        return _INTERPRETED[kind]
    if masked and ((elem, kind) in _MASKED or (elem, block_d, kind) in _MASKED):
        return _MASKED.get((elem, kind)) or _MASKED[(elem, block_d, kind)]
    if fast and elem == 2:
        padded = max(64, block_d)
        if capability_major < 9 and (padded, kind) in _FAST_SM80:
            return _FAST_SM80[(padded, kind)]
        return _FAST[padded][kind]
    if elem == 4:  # fp32's CUDA-core products (_fp32); dk/dv's M16 N32 spilled 176 bytes at 64 on sm_90
        return Tile(16, 16, 8, 1) if kind == "dkdv" else _fp32(kind, block_d)
    if block_d > 128:
        return _VARIANT_WIDE[kind]
    if block_d == 128:
        return Tile(32, 32, 8, 2) if kind == "fwd" and varlen else _VARIANT_128[kind]
    return _VARIANT[kind]
