"""The Typer app every command registers on, and where errors become exit codes.

Exit codes (docs/design.md): 0 all checks passed; 1 a numerical failure, crash or regression was found;
2 usage or environment error. Every error is one line on stderr, never a traceback.
"""
from __future__ import annotations

import signal
import sys
from typing import Annotated

import typer
from typer.core import TyperGroup

try:  # typer >= 0.2x vendors click; older typer (as on some GPU images) uses click itself
    from typer import _click as click
except ImportError:  # pragma: no cover - depends on the installed typer
    import click

from faverify.errors import EnvironmentProblem, OwnError, UsageError, printable
from faverify.run.signals import stops_interrupt
from faverify.streams import say, show


class _Group(TyperGroup):
    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = list(sys.argv[1:] if args is None else args)
        stops: list = []
        try:
            with stops_interrupt(stops):  # a stop ends the command's workers with it, whatever the command
                rv = super().main(args=args, prog_name="faverify", complete_var=complete_var,
                                  standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0
        except _NO_ARGS as e:
            say(e.ctx.get_help() if e.ctx else "faverify --help")
            code = 2
        except click.ClickException as e:
            ctx = getattr(e, "ctx", None)
            where = ctx.command_path if ctx is not None else "faverify"
            code = _error(f"{where}: {e.format_message()}{_given_value(e, args)}", e.exit_code)
        except _ABORT:
            code = _error("aborted", 130)
        except (UsageError, EnvironmentProblem, OwnError) as e:
            code = _error(str(e), 2)
        except RecursionError:  # a JSON nested past the interpreter's limit, wherever it was read
            code = _error("input nested too deeply to read (a JSON of more than a few hundred levels)", 2)
        except Exception as e:  # faverify's own bug: one line naming where, never a traceback
            code = _error(f"faverify's own error (a bug in faverify, not in your kernel): {_where(e)}", 2)
        if stops and code == 130:  # the stop's KeyboardInterrupt, which typer ends silently
            code = _error(f"stopped by {signal.Signals(stops[-1]).name} before the command finished; nothing it "
                          "started is left running", 128 + stops[-1])
        if standalone_mode:
            sys.exit(code)
        return code


class Stopped(int):
    """The exit code of a command that was stopped and has written its results: the console entry point
    (cli.main) then leaves without the interpreter's teardown."""


def tell(error: Exception) -> int:
    """One of faverify's errors told as the app tells it (one line), without raising it: its exit code, 2."""
    return _error(str(error), 2)


_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2 only
_ABORT = getattr(click.exceptions, "Abort", ())  # typer's vendored click turns Ctrl-C into Exit(130)


def _given_value(e: Exception, args: list) -> str:
    """typer's own parse errors name the option and the rule; add the value the user gave."""
    param = getattr(e, "param", None)
    for opt in getattr(param, "opts", ()) or ():
        for i, a in enumerate(args):
            if a == opt and i + 1 < len(args):
                return f" (got {args[i + 1]!r})"
            if a.startswith(opt + "="):
                return f" (got {a.split('=', 1)[1]!r})"
    return ""


def _where(e: BaseException) -> str:
    """The exception and the line of faverify's code it came from."""
    import traceback
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "faverify" in f.filename] or \
        traceback.extract_tb(e.__traceback__)
    place = f" (at {frames[-1].filename.rsplit('/', 2)[-2:][-1]}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {printable(e, 300)}{place}"


def _error(message: str, code: int) -> int:
    """The one line of an error: printable (a message that echoes a 50 MB input, or a terminal's escape
    sequences, is neither), its newlines folded."""
    say(f"faverify: error: {' '.join(printable(message, 1000).splitlines())}")
    return code


app = typer.Typer(cls=_Group, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Prove FlashAttention-style kernels numerically right, or find "
                                              "the smallest input on which they are wrong.")


def _print_version(asked: bool) -> None:
    if asked:
        from faverify import __version__
        show(f"faverify {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print the version and exit")] = False) -> None:
    """Prove FlashAttention-style kernels numerically right, or find the smallest input on which they are
    wrong."""
