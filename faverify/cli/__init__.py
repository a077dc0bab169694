"""The command line: thin typed commands over the library, one module a command (or a family of them),
each registering on the app of cli/app.py. Domain errors become exit codes there only. A command imports
what it runs inside its own function: `faverify --help` and `faverify report` load neither torch's kernels
nor the evaluation (property_tests/test_imports.py checks the report)."""
import os
import sys

# Before numpy loads (torch imports it): one OpenBLAS thread. The Triton interpreter computes each tl.dot
# as a numpy matmul of one tile; one thread does it in 0.3 ms, while two threads on a machine whose other
# core is busy (a second worker, a compile) spin against each other, 31 ms each (128x256 @ 256x128 fp32,
# the 2-core CPU machine). Worker processes inherit the variable.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if sys.argv[1:2] == ["fuzz"]:
    # a stop during the imports below is kept for the fuzz, which then writes its run (run/signals.py); torch
    # loads meanwhile: a stop raised inside its import would leave it half loaded, and no run could be written
    from faverify.run.signals import record_early
    record_early()
    import faverify.env  # noqa: F401
from faverify.cli import bench, doctor, fuzz, golden, kernels, merge, mutants, report, repro, warmup  # noqa: F401  (registration)
from faverify.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    import os
    import sys

    from faverify import streams
    from faverify.cli.app import Stopped
    code = app(standalone_mode=False)
    streams.flush()  # here, where a stream nobody reads costs nothing: the interpreter's own flush would exit 120
    if isinstance(code, Stopped):
        # Everything asked for is written. An interrupt can leave a lock held inside a library, and the
        # interpreter's teardown then waits on it for ever (on the H200 a fuzz stopped by SIGTERM sat
        # garbage-collecting after writing its report): leave without the teardown.
        os._exit(code)
    sys.exit(code)
