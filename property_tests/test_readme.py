import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", section)


def test_readme_gives_the_install_and_test_commands():
    main_job, tests = readme_commands()
    assert main_job.endswith("faverify fuzz") and "pip install" in main_job
    assert tests.endswith("python -m pytest") and "'.[test]'" in tests


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_commands()[1] in ci
