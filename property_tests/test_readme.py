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


def _prose(text: str) -> str:
    """The text outside code fences, tables and indented code, with inline code and links' targets out."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.lstrip().startswith("|") or line.startswith("    ") and not line.lstrip().startswith("-"):
            continue
        kept.append(line)
    prose = "\n".join(kept)
    prose = re.sub(r"`[^`]*`", "CODE", prose)
    return re.sub(r"\]\([^)]*\)", "]", prose)


def sentences(text: str) -> list:
    """Paragraphs and list items apart, each cut after every ., ! or ? that a space follows."""
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*] |\d+\. |#))", _prose(text)):
        out += [s for s in re.split(r"(?<=[.!?])\s+", " ".join(block.split())) if s]
    return out


def test_no_prose_sentence_of_the_readme_or_the_docs_runs_over_50_words():
    long = [(path.name, len(s.split()), s[:80]) for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
            for s in sentences(path.read_text()) if len(s.split()) > 50]
    assert long == []


def test_the_sentence_check_finds_a_long_sentence():
    long = " ".join(["word"] * 51) + "."
    assert [len(s.split()) for s in sentences(f"Short one. {long}\n\n| {long} |\n\n```\n{long}\n```\n")] == [2, 51]


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 160
    assert "\n## Test your kernel\n" in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):  # every link goes to a file of the repository
        assert (ROOT / target).exists(), target


def test_every_devtool_is_described_in_the_devtools_readme():
    text = (ROOT / "devtools" / "README.md").read_text()
    missing = [p.name for p in (ROOT / "devtools").iterdir() if p.name != "README.md" and p.name not in text]
    assert missing == []


def test_measurements_name_at_most_25_commits():
    text = (ROOT / "docs" / "measurements.md").read_text()
    assert len(set(re.findall(r"\b[0-9a-f]{7,12}\b", text))) <= 25
