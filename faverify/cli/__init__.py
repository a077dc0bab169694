"""The command line: thin typed commands over the library, one module a command (or a family of them),
each registering on the app of cli/app.py. Domain errors become exit codes there only."""
from faverify.cli import bench, doctor, fuzz, golden, kernels, mutants, repro, report  # noqa: F401  (registration)
from faverify.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    app()
