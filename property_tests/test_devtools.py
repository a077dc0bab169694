"""devtools/gpu_check.sh documents every step it runs: its header (also its --help) lists each step with
its time box, and its case statement runs exactly those; an unknown step is answered with the names the case
statement holds."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "devtools" / "gpu_check.sh"


def test_the_header_lists_exactly_the_steps_the_script_runs():
    text = SCRIPT.read_text()
    documented = set(re.findall(r"^#   ([a-z0-9-]+) +\[ *\d+\]", text, re.M))
    run = set(re.findall(r"^    ([a-z0-9-]+)\)", text, re.M))
    assert documented and documented == run, (documented ^ run)


def test_help_prints_the_header_with_its_steps():
    help_text = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, check=True).stdout
    assert "Steps (seconds allowed" in help_text and "mutants-full [540]" in help_text
