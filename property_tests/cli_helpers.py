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


def marked(mark: str) -> list:
    """The processes whose environment holds `mark` (NAME=VALUE): a command run with it, and every process it
    started that kept its environment (the forkserver, the resource tracker, the workers, what they start)."""
    import os
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark.encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def end_marked(mark: str) -> None:
    """SIGKILL what is left of the processes holding `mark`: a test that failed leaks none of them."""
    import os
    import signal
    for pid in marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def read_json(path):
    with open(path) as f:
        return json.load(f)


def assert_commands_exist(calls: list) -> None:
    """Each `faverify COMMAND --flag ...` call (the text after "faverify ") names a command and flags
    the CLI has: the README's examples stay runnable."""
    import shlex

    import typer
    group = typer.main.get_command(app)
    for call in calls:
        words = shlex.split(call.strip())
        command = group.commands.get(words[0])
        assert command is not None, f"no command {words[0]!r}"
        known = {opt for p in command.params for opt in p.opts + p.secondary_opts}
        for word in words[1:]:
            if word.startswith("--"):
                assert word.split("=")[0] in known, f"faverify {words[0]} has no flag {word}"


def planted_bug_caught(kernel: str, features: str, iters: int, tmp_path, found) -> tuple:
    """Fuzz a planted bug (fp32, in this process) with `features`: the run fails, and some failure's
    signature or companion is one `found` accepts. Returns (the kernel's run record, those failures, the
    fuzz arguments but the kernel)."""
    args = ("--iters", str(iters), "--device", "cpu", "--no-db", "--no-isolate", "--dtype", "fp32", "--features",
            features)
    r = cli("fuzz", "--kernel", kernel, *args, "--json", tmp_path / "run.json")
    assert r.exit_code == 1, r.stdout[-2000:]
    record = read_json(tmp_path / "run.json")["kernels"][0]
    mine = [f for f in record["failures"] if any(found(s) for s in [f["signature"], *f["companions"]])]
    assert mine, [(f["signature"], f["companions"]) for f in record["failures"]]  # as the root, or found with it
    return record, mine, args
