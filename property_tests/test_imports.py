"""faverify's import graph follows its layers and has no cycle (docs/design.md, "Layers").

Every import counts, those inside functions too (a lazy import is still a dependency), between the
modules of faverify/ and of kernels/ (imported as faverify.kernels)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"faverify": ROOT / "faverify", "faverify.kernels": ROOT / "kernels"}


def modules() -> dict:
    found = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: dict) -> set:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:  # `from pkg import submodule` depends on the submodule
                full = f"{base}.{a.name}"
                out.add(full if full in known else base)
    return {m for m in out if m in known and m != name}


def cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


# The layers, highest first: a module imports its own layer's modules and those of lower rank. The
# reports read the judge's records (metrics) and never the run; the judge reads no subject (what calls one
# runs in run/, the controls are subjects); the kernels' adapters (their subject modules) and the seeded bugs
# are subjects; the ahead-of-time compile reports are tools over the kernels
# and their mutants, beside the commands.
LAYERS = {
    "cli": (9, ("faverify.cli", "faverify.__main__")),
    "commands": (8, ("faverify.commands", "faverify.testing", "faverify.kernels.triton.build.aot",
                     "faverify.kernels.triton.build.sources", "faverify.kernels.cuda.compile_report")),
    "run": (7, ("faverify.run",)),
    "reports": (6, ("faverify.reports",)),
    "subjects": (5, ("faverify.subjects", "faverify.kernels.triton.subject", "faverify.kernels.cuda.subject",
                     "faverify.kernels.mutants")),
    "judge": (4, ("faverify.judge",)),
    "kernels": (3, ("faverify.kernels",)),
    "cases": (2, ("faverify.cases",)),
    "base": (1, ("faverify",)),
}


def layer(module: str) -> str:
    """The layer of the longest prefix that names the module or a package above it."""
    best = max(((p, name) for name, (_, prefixes) in LAYERS.items() for p in prefixes
                if module == p or module.startswith(p + ".")), key=lambda pn: len(pn[0]))
    return best[1]


def against_the_layers(graph: dict) -> list:
    wrong = []
    for importer, imported in graph.items():
        for target in imported:
            if (target.startswith("faverify.kernels.mutants.") and importer.startswith("faverify.kernels.")
                    and layer(importer) != "commands" and not importer.startswith("faverify.kernels.mutants")):
                wrong.append(f"{importer} imports {target}: kernels never import their mutants")
                continue
            a, b = layer(importer), layer(target)
            if a != b and LAYERS[a][0] <= LAYERS[b][0]:
                wrong.append(f"{importer} ({a}) imports {target} ({b})")
    return sorted(wrong)


def the_graph() -> dict:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_import_cycle_inside_faverify():
    graph = the_graph()
    assert graph["faverify.run.fuzz"] >= {"faverify.run.request"}  # the graph is really read
    assert cycles(graph) == []


def test_every_import_follows_the_layers():
    assert against_the_layers(the_graph()) == []


def test_an_import_against_the_layers_is_caught():
    graph = the_graph()
    graph["faverify.reports.collector"] = graph["faverify.reports.collector"] | {"faverify.run.evaluate"}
    graph["faverify.cases.inputs"] = graph["faverify.cases.inputs"] | {"faverify.judge.reference"}
    graph["faverify.judge.verdict"] = graph["faverify.judge.verdict"] | {"faverify.reports.results"}
    graph["faverify.kernels.triton.dense.forward"] = {"faverify.kernels.mutants.catalog"}
    graph["faverify.kernels.triton.subject"] = {"faverify.kernels.mutants.build"}
    assert against_the_layers(graph) == [
        "faverify.cases.inputs (cases) imports faverify.judge.reference (judge)",
        "faverify.judge.verdict (judge) imports faverify.reports.results (reports)",
        "faverify.kernels.triton.dense.forward imports faverify.kernels.mutants.catalog: kernels never import their "
        "mutants",
        "faverify.kernels.triton.subject imports faverify.kernels.mutants.build: kernels never import their mutants",
        "faverify.reports.collector (reports) imports faverify.run.evaluate (run)"]


def test_every_module_has_a_layer_and_every_subpackage_says_what_it_holds():
    for name, path in modules().items():
        assert layer(name) in LAYERS
        if path.name == "__init__.py" and path.parent.parent.name == "faverify":
            assert ast.get_docstring(ast.parse(path.read_text())), f"{path}: no docstring"
    top = [p for p in PACKAGES["faverify"].glob("*.py")]
    assert len(top) <= 12, sorted(p.name for p in top)


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_rendering_a_run_file_imports_neither_the_evaluation_nor_the_reference_nor_the_draw(tmp_path):
    """`faverify report run.json` reads JSON and prints: the reports layer, not the pipeline that made it."""
    import subprocess
    import sys

    from property_tests.cli_helpers import cli
    cli("fuzz", "--kernel", "sdpa-math", "--iters", "3", "--device", "cpu", "--no-db", "--no-isolate",
        "--json", tmp_path / "run.json")
    script = ("import sys, faverify.cli\n"
              "from typer.testing import CliRunner\n"
              "from faverify.cli.app import app\n"
              f"r = CliRunner().invoke(app, ['report', {str(tmp_path / 'run.json')!r}])\n"
              "assert r.exit_code == 0 and 'PASS' in r.output, r.output\n"
              "print(' '.join(m for m in sys.modules if m.startswith('faverify')))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    loaded = set(r.stdout.split())
    assert "faverify.reports.report" in loaded  # the run file was really rendered
    assert not loaded & {"faverify.run.evaluate", "faverify.judge.reference", "faverify.cases.strategies"}, loaded
