"""PTX digests of every Triton and Gluon kernel variant the AOT report compiles for sm_90 (no GPU needed): run
before and after a refactor of kernels/triton; equal digests mean the generated code did not change (the
digest leaves out the debug lines, which move with every edit of the source).

    python devtools/triton_ptx.py [KERNEL ...] > before.txt   (default: every kernel; build/aot.py names them)
"""
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
from faverify.kernels.triton.build.aot import compile_variant, variants  # noqa: E402

kinds = set(sys.argv[1:])
for v in variants(90):
    if not kinds or v.kernel in kinds:
        r = compile_variant(v, 90)
        print(f"{v}: {r.get('ptx', r.get('error'))}", flush=True)
