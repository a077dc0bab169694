"""A module that ends its process while it is imported (libc's _exit, os.abort) ends a worker's, not
faverify's: the command names the module and exits 2, never 0 with nothing said."""
import os
import subprocess
import sys

import pytest

from faverify.cases.case import Case

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENDINGS = {"libc_exit_0": ("import ctypes\nctypes.CDLL(None)._exit(0)", "exit code 0"),
           "abort": ("import os\nos.abort()", "killed by signal 6")}
COMMANDS = {"fuzz": ("fuzz", "--iters", "2", "--no-db"), "fuzz-no-isolate": ("fuzz", "--iters", "2", "--no-db",
                                                                             "--no-isolate"),
            "repro": ("repro", "--case", Case(1, 1, 1, 1, 1, 8).to_json()),
            "golden": ("golden", "verify", "--only", "one-key"),
            "bench": ("bench", "--headdims", "64", "--seqlens", "128")}


@pytest.mark.parametrize("command,ending", [("fuzz", "libc_exit_0"), ("fuzz", "abort"),
                                            ("fuzz-no-isolate", "libc_exit_0"), ("repro", "abort"),
                                            ("golden", "libc_exit_0"),
                                            pytest.param("bench", "abort", marks=pytest.mark.gpu)])
def test_a_module_that_ends_its_process_at_import_is_named_and_exit_2(tmp_path, ending, command):
    body, how = ENDINGS[ending]
    (tmp_path / "ends_at_import.py").write_text(body + "\ndef attn(q, k, v, *, causal, softmax_scale):\n"
                                                "    return q\n")
    device = "cuda" if command == "bench" else "cpu"  # bench times GPU kernels alone
    r = subprocess.run([sys.executable, "-m", "faverify", *COMMANDS[command], "--kernel", "ends_at_import:attn",
                        "--device", device], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert r.stderr.strip().splitlines() == [
        f"faverify: error: --kernel='ends_at_import:attn': importing module 'ends_at_import' ended the process "
        f"that imported it ({how}{', Aborted' if ending == 'abort' else ''}), so faverify does not import it"]
