"""Launch: the choices a test or a tuning script makes where the launchers would decide per call. Every
launcher takes one; the default (every field None) is what flash_attn_func does for its users. No module
global or environment variable changes a kernel: a choice travels in the Launch of the call."""
from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Launch:
    """How the kernels launch where a test or a tuning script chooses instead of the launcher. The default
    (every field None) is what flash_attn_func does for its users: decide per launch.

    tma: the forward loads through the copy engine (TMA tensor descriptors) on sm_90 and later when the
        fast build applies: no pointer tiles in registers and no address arithmetic in the loop (d128 M128
        N64 w4: 40 bytes of stack against 296, and 1.6x the speed on the H200; docs/measurements.md,
        "Triton forward"). True or False forces a path where the strides allow it (the interpreter runs both).
    hopper: the warp-specialized Hopper forward (hopper/forward.py) where it can run (configs.hopper_forward);
        False compares the Triton forward with it on the same GPU.
    programs: programs of the Hopper forward (hopper.layouts.grid): None, one per query block; a number makes
        it persistent (3: each program runs many blocks, carrying its shared-memory ring and barrier phases
        from one to the next; devtools/triton_fwd_sweep.py times one per SM).
    emulate: emulate GPU bf16 numerics under the interpreter (common.py says why); None: exactly there.
    hopper_backward: dK and dV from the warp-specialized Hopper kernel (hopper/backward.py) where it can
        run (_use_hopper_backward); opt-in (True) until it is faster than the Triton dK/dV.
    deterministic: False lets the Hopper dK/dV (hopper_backward) compute dQ too, added into an fp32 buffer
        by atomics in an order that varies run to run (the fast mode); True or None: dQ from dense/backward.py's
        _bwd_dq, the same bits every run.
    fused_backward: dQ, dK and dV from the fused Hopper backward (hopper/backward_fused.py: one pass, dQ
        reduced into fp32 by the copy engine) where the Hopper dK/dV can run; opt-in (True) until it has
        passed on a GPU. dQ's last bits may vary run to run.
    head_group: heads per group of the Hopper forward's schedule (None: hopper.layouts.HEAD_GROUP).
    hopper_build: a function (seqlen_q, seqlen_k) -> the Hopper forward's build to launch, in place of
        hopper.forward.kernel's choice (devtools compare builds and versions of the kernel with it).
    packed_decode: a paged cache's few query rows go to the decode kernel, which packs a GQA group into its
        rows (variant.interface.packs_decode); False sends them to the per-head forward (None: True).
    decode_tile: the decode kernel's configs.Tile, in place of configs.decode's (devtools/decode_sweep.py).
    """
    tma: bool | None = None
    hopper: bool | None = None
    programs: int | None = None
    emulate: bool | None = None
    hopper_backward: bool | None = None
    deterministic: bool | None = None
    fused_backward: bool | None = None
    head_group: int | None = None
    hopper_build: Callable | None = None
    packed_decode: bool | None = None
    decode_tile: object | None = None  # a configs.Tile


DEFAULT = Launch()
