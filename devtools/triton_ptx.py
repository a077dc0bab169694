"""PTX digests of the Triton kernels' sm_90 variants (no GPU needed): run before and after a refactor of
kernels/triton; equal digests mean the generated code did not change.

    python devtools/triton_ptx.py [KERNEL ...] > before.txt   (kernels: fwd dkdv dq preprocess fwd-hopper)
"""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
from faverify.kernels.triton.aot import compile_variant, variants  # noqa: E402

kinds = sys.argv[1:] or ["fwd", "dkdv", "dq", "preprocess", "fwd-hopper"]
for v in variants(90):
    if v.kernel in kinds and v.block_d in (32, 64, 128):
        r = compile_variant(v, 90)
        print(f"{v}: {r.get('ptx', r.get('error'))}", flush=True)
