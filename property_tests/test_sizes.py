"""Sizes a reader can hold: no module of faverify/ or kernels/ over 400 lines, no function over 80; a Triton
or Gluon kernel body may reach 120 where a comment above it, starting "# kernel body:", says why."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_LINES, FUNCTION_LINES, KERNEL_BODY_LINES = 400, 80, 120


def sources() -> list:
    return sorted(p for base in ("faverify", "kernels") for p in (ROOT / base).rglob("*.py")
                  if not p.is_symlink() and (ROOT / base / "kernels") not in p.parents)


def too_long(path: Path) -> list:
    text = path.read_text()
    lines = text.splitlines()
    found = [f"{path.relative_to(ROOT)}: {len(lines)} lines"] if len(lines) > MODULE_LINES else []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        length = node.end_lineno - first + 1
        above = []
        i = first - 2
        while i >= 0 and lines[i].lstrip().startswith("#"):
            above.insert(0, lines[i].strip())
            i -= 1
        limit = KERNEL_BODY_LINES if above and above[0].startswith("# kernel body:") else FUNCTION_LINES
        if length > limit:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines (limit {limit})")
    return found


def test_no_module_or_function_past_its_size():
    assert len(sources()) > 50  # the tree is really read
    assert [f for p in sources() for f in too_long(p)] == []


def test_the_size_check_finds_a_long_function_and_allows_a_marked_kernel_body(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    plain = tmp_path / "plain.py"
    plain.write_text(f"def f():\n{body}\n")
    marked = tmp_path / "marked.py"
    marked.write_text(f"# kernel body: registers\n@decorate\ndef f():\n{body}\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert too_long(plain) == ["plain.py:1 f: 91 lines (limit 80)"]
        assert too_long(marked) == []
    finally:
        ROOT = saved
