"""The house rules of the code base: imports between Strata's modules go one way (no circle, lazy imports inside
functions included), no module past 500 lines, and the README stays a guide (at most 400 lines)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple, cast

import networkx as nx

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("flows", "tasks", "schemas")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


class Import(NamedTuple):
    module: str  # the importing module
    target: str  # the project module imported
    line: int
    local: bool  # inside a function
    top: bool  # run when the module is imported: at its top level, outside ``if TYPE_CHECKING``
    lazy_reason: bool  # a "# lazy: …" comment on its line or above the run of imports it is in (``_said_lazy``)


def _said_lazy(lines: list[str], line: int) -> bool:
    """Whether the import on ``line`` (1-based) says why it is lazy: a ``# lazy:`` comment at its end, or on the line
    above the run of import lines it is in."""
    at = line - 1
    if "# lazy:" in lines[at]:
        return True
    while at > 0 and lines[at - 1].lstrip().startswith(("from ", "import ")):
        at -= 1
    return at > 0 and lines[at - 1].lstrip().startswith("# lazy:")


def imports() -> list[Import]:
    """Every import of a project module by a project module, functions included; the method registry's built-in
    methods ("module:Class") count as imported at its top level, where it loads them."""
    modules = _modules()
    out: list[Import] = []
    for name, path in modules.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(text)
        local = {
            id(n)
            for fn in ast.walk(tree)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(fn)
        }
        typing_only = {
            id(n)
            for st in ast.walk(tree)
            if isinstance(st, ast.If) and "TYPE_CHECKING" in ast.unparse(st.test)
            for n in ast.walk(st)
        }
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif name == "tasks.methods.registry" and isinstance(node, ast.Constant) and ":" in str(node.value):
                targets = [str(node.value).partition(":")[0]]
            if not targets:
                continue
            at = cast("ast.stmt", node).lineno
            said = _said_lazy(lines, at)
            for target in targets:
                while target and target not in modules:  # `import tasks.x.y` names tasks.x.y; a symbol names its module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    inside = id(node) in local
                    out.append(Import(name, target, at, inside, not inside and id(node) not in typing_only, said))
    return out


def import_graph() -> nx.DiGraph:
    """Module -> module it imports, for every import statement anywhere in a module (functions included)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(_modules())
    graph.add_edges_from((i.module, i.target) for i in imports())
    return graph


def test_imports_go_one_way():
    graph = import_graph()
    assert graph.number_of_edges() > 50  # the walk found the imports
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


#: the layers, lowest first: a module may import its own layer's and lower ones, never a higher one
LAYERS = (
    "schemas",  # the config and table models
    "tasks.errors",
    "tasks.runtime",  # processes, parallel maps, the LLM client, tokens and text
    "tasks.store",  # ids, the catalog of tables, spills, leases
    "tasks.index",  # the shared build stages: ingest, chunk, extract, merge, embed, validate
    "tasks.retrieval",  # the query primitives: the view, a context, graph ranking, BM25
    "tasks.methods",  # the index methods (HiRAG, HyGRAG, ArchRAG) and their registry
    "tasks.query",  # the entry points above the methods: retrieve, answer, evaluate, reader, inspect
    "flows",  # orchestration, the CLI, the service
)


def _layer(module: str) -> int:
    return max(i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(layer + "."))


def test_folders_import_downwards_only():
    """No arrow back up between folders (lazy imports inside functions included): ``tasks.methods`` builds on the
    retrieval primitives, and the query entry points on the methods, never the other way."""
    graph = import_graph()
    up = sorted(f"{a} -> {b}" for a, b in graph.edges if _layer(b) > _layer(a))
    assert not up, "imports that go up a layer: " + "; ".join(up)


#: third-party packages that take 100 ms or more to import (``python -X importtime -c "import X"``, cumulative, this
#: machine, 2026-12-05): great_expectations 3.2 s, spacy 2.3 s, lancedb 1.4 s, sklearn 1.2 s, prefect 1.2 s, torch
#: 1.0 s, distributed 0.42 s, lance 0.39 s, fastapi 0.34 s, scipy.sparse 0.25 s, polars 0.18 s, networkx 0.14 s,
#: dask 0.13 s, boto3 0.13 s, pyarrow 0.13 s, onnxruntime 0.12 s, numpy 0.10 s (pydantic 38 ms, typer 50 ms)
HEAVY = frozenset(
    "great_expectations spacy lancedb sklearn prefect torch distributed lance fastapi scipy polars networkx dask boto3 "
    "pyarrow onnxruntime numpy".split()
)


def _third_party(module: str) -> set[str]:
    """The packages outside the project that ``module`` imports at its top level."""
    path = _modules()[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for st in body:
            if isinstance(st, ast.Import):
                found.update(a.name.split(".")[0] for a in st.names)
            elif isinstance(st, ast.ImportFrom) and not st.level and st.module:
                found.add(st.module.split(".")[0])
            elif isinstance(st, ast.If) and "TYPE_CHECKING" not in ast.unparse(st.test):
                walk(st.body)
                walk(st.orelse)
            elif isinstance(st, ast.Try):
                walk(st.body)
                for handler in st.handlers:
                    walk(handler.body)

    walk(tree.body)
    return found - set(PACKAGES)


def test_a_function_local_import_has_a_reason():
    """A project module imported inside a function, not at the top, is so for one of three reasons: what it imports
    brings a heavy library (``HEAVY``) that the importing module does not; the importing module is loaded by every
    ``strata`` command (``flows.cli``'s top-level imports, the built-in methods included) and the imported one is
    not, so the command starts without it; or a ``# lazy:`` comment says why. Any other belongs at the top."""
    found = imports()
    top = nx.DiGraph()
    top.add_nodes_from(_modules())
    top.add_edges_from((i.module, i.target) for i in found if i.top)
    libraries = {m: _third_party(m) for m in top}
    heavy = {m: set().union(*(libraries[d] for d in {m} | nx.descendants(top, m))) & HEAVY for m in top}
    startup = {"flows.cli"} | nx.descendants(top, "flows.cli")
    local = [i for i in found if i.local]
    assert len(local) > 50  # the walk found them
    reasons = {
        "heavy": [i for i in local if heavy[i.target] - heavy[i.module]],
        "startup": [i for i in local if i.module in startup and i.target not in startup],
        "said": [i for i in local if i.lazy_reason],
    }
    explained = {id(i) for group in reasons.values() for i in group}
    bare = sorted({f"{i.module}:{i.line} imports {i.target}" for i in local if id(i) not in explained})
    assert not bare, "function-local imports without a reason (move them to the top): " + "; ".join(bare)


def test_no_module_is_past_500_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 500}
    assert not long, long


def test_the_readme_is_a_guide_of_at_most_400_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 400


def test_no_docstring_cites_a_document_the_repository_lacks():
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        assert "DESIGN §" not in text and "seed 00" not in text, name


def test_the_figures_that_hold_today_fit_one_page():
    """docs/benchmarks.md leads with what holds today, at most 150 lines; the archive follows."""
    lines = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("## What holds today")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    assert end - start <= 150
