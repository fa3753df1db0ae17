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


def test_no_module_is_past_500_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 500}
    assert not long, long


def test_the_readme_is_a_guide_of_at_most_400_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 400


def test_no_docstring_cites_a_document_the_repository_lacks():
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        assert "DESIGN §" not in text and "seed 00" not in text, name
