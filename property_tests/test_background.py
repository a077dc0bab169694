"""The suite's background runs (property_tests/background.py): started once whichever pytest process claims
them first, collected from files by any, ended with the session that made their folder."""
import os
import time

from property_tests import background


def test_a_run_starts_once_is_collected_from_files_and_a_live_one_ends_with_the_session(monkeypatch):
    monkeypatch.delenv(background.FOLDER_VARIABLE, raising=False)  # a session of this test's own
    assert background.open_session()
    folder = background.folder()
    assert not background.open_session()  # an xdist worker sees its controller's folder: it makes none
    background.start("quick", ["platform"], dict(os.environ))
    with open(os.path.join(folder, "quick.pid")) as f:
        first = f.read()
    background.start("quick", ["platform"], dict(os.environ))  # claimed already: nothing starts
    with open(os.path.join(folder, "quick.pid")) as f:
        assert f.read() == first
    code, out, err = background.collect("quick", "quick run", timeout=60)
    assert code == 0 and out.strip() and not err, (code, out, err)
    background.start("slow", ["timeit", "-n", "1", "-r", "1", "import time; time.sleep(120)"], dict(os.environ))
    with open(os.path.join(folder, "slow.pid")) as f:
        pid = int(f.read())
    background.close_session()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid) and not os.path.exists(folder)
    assert background.FOLDER_VARIABLE not in os.environ


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, killed but not yet reaped by this process, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
