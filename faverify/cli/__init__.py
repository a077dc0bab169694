"""The command line: thin typed commands over the library, one module a command (or a family of them),
each registering on the app of cli/app.py. Domain errors become exit codes there only."""
from faverify.cli import bench, doctor, fuzz, golden, kernels, merge, mutants, repro, report  # noqa: F401  (registration)
from faverify.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    import os
    import sys
    from faverify.cli.app import INTERRUPTED_RUN
    code = app(standalone_mode=False)
    if INTERRUPTED_RUN["set"]:
        # Everything asked for is written. An interrupt can leave a lock held inside a library, and the
        # interpreter's teardown then waits on it for ever (on the H200 a fuzz stopped by SIGTERM sat
        # garbage-collecting after writing its report): leave without the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
