"""The house rules of the code base: imports between Strata's modules go one way (no circle, lazy imports inside
functions included), no module past 500 lines, and the README stays a guide (at most 400 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("flows", "tasks", "schemas")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def import_graph() -> nx.DiGraph:
    """Module -> module it imports, for every import statement anywhere in a module (functions included)."""
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:  # `import tasks.x.y` names tasks.x.y; a symbol names its module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph.add_edge(name, target)
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


def test_no_module_is_past_500_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 500}
    assert not long, long


def test_the_readme_is_a_guide_of_at_most_400_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 400


def test_no_docstring_cites_a_document_the_repository_lacks():
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        assert "DESIGN §" not in text and "seed 00" not in text, name
