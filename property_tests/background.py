"""Long runs the suite starts beside its tests (the Triton AOT compile, the CUDA compile report, the full
mutants run), shared by every pytest process of one session.

Under pytest-xdist each worker collects the whole suite, so each would start them: the first process to
claim a run's file in the session's folder starts it, and any process collects it from its files. A run
leads a process session of its own; the process that made the folder (the xdist controller, or pytest
alone) ends the runs nobody collected when the test session ends.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FOLDER_VARIABLE = "FAVERIFY_TEST_BACKGROUND"

# Runs the command with its output in NAME.out and NAME.err, then writes its exit code to NAME.rc in one
# rename: a reader sees the code only once the output is complete.
_STARTED = []  # the runs this process started: kept, so that none is reported as still running when collected

_WRAPPER = """
import os, subprocess, sys
folder, name, command = sys.argv[1], sys.argv[2], sys.argv[3:]
path = lambda suffix: os.path.join(folder, name + suffix)
with open(path(".out"), "w") as out, open(path(".err"), "w") as err:
    code = subprocess.call(command, stdout=out, stderr=err)
with open(path(".rc.part"), "w") as f:
    f.write(str(code))
os.replace(path(".rc.part"), path(".rc"))
"""


def open_session() -> bool:
    """Make the session's folder unless a parent pytest process already did; True in the one that made it.
    The workers xdist spawns later inherit the variable."""
    if os.environ.get(FOLDER_VARIABLE):
        return False
    os.environ[FOLDER_VARIABLE] = tempfile.mkdtemp(prefix="faverify-background-")
    return True


def folder() -> str:
    return os.environ[FOLDER_VARIABLE]


def start(name: str, module_args: list, env: dict, cwd: str | None = None) -> None:
    """Start `python -m MODULE_ARGS` as NAME unless another process of the session claimed it first."""
    try:
        os.close(os.open(os.path.join(folder(), name + ".claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    proc = subprocess.Popen([sys.executable, "-c", _WRAPPER, folder(), name, sys.executable, "-m", *module_args],
                            env=env, cwd=cwd, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _STARTED.append(proc)
    with open(os.path.join(folder(), name + ".pid"), "w") as f:
        f.write(str(proc.pid))


def collect(name: str, what: str, timeout: float = 1800) -> tuple:
    """(returncode, stdout, stderr) of the run NAME, once it has ended."""
    path = lambda suffix: os.path.join(folder(), name + suffix)  # noqa: E731
    assert os.path.exists(path(".claim")), f"the {what} was not started at collection"
    deadline = time.monotonic() + timeout
    while not os.path.exists(path(".rc")):
        assert time.monotonic() < deadline, f"the {what} did not end within {timeout:.0f} s"
        time.sleep(1)
    texts = []
    for suffix in (".rc", ".out", ".err"):
        with open(path(suffix)) as f:
            texts.append(f.read())
    return int(texts[0]), texts[1], texts[2]


def close_session() -> None:
    """End every run that has not written its exit code (its worker processes too), and remove the folder."""
    for entry in os.listdir(folder()):
        name, suffix = os.path.splitext(entry)
        if suffix == ".pid" and not os.path.exists(os.path.join(folder(), name + ".rc")):
            with open(os.path.join(folder(), entry)) as f:
                pid = int(f.read())
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended between the check and the kill
                pass
    shutil.rmtree(folder(), ignore_errors=True)
    del os.environ[FOLDER_VARIABLE]
