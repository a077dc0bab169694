"""Run the command line in-process through typer's CliRunner, stdout and stderr apart."""
import inspect
import json

from typer.testing import CliRunner

from faverify.cli import app

_kwargs = {"mix_stderr": False} if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters else {}
runner = CliRunner(**_kwargs)


def cli(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def read_json(path):
    with open(path) as f:
        return json.load(f)
