"""The registry of index methods: the one place a method is added. Built-in methods are named here by module
and class (loaded on first use); another is added with one line, ``register(MyMethod())``.

What depends on the set of methods is derived from it: the method names ``index.method`` accepts
(``get_method``), the retrieval modes and their ``--help`` text, the relation kinds validation accepts, the
method that owns a mode (the answer step asks it to ``refine`` a context).
"""

from __future__ import annotations

import importlib

from schemas.tables import SHARED_RELATION_KINDS
from tasks.errors import UsageError
from tasks.methods.base import IndexMethod

#: the built-in methods, in the order their modes are listed: "module:Class"
BUILTIN = ("tasks.methods.hirag.method:HiRAG", "tasks.methods.hygrag:HyGRAG", "tasks.methods.archrag:ArchRAG")
#: sources-only modes every index offers, and how each ranks its sources; a method's own modes rank by ppr
SHARED_MODES = {"ppr": "ppr", "hybrid": "hybrid", "naive": "dense"}

_METHODS: dict[str, IndexMethod] = {}


def register(method: IndexMethod) -> IndexMethod:
    """Add ``method`` (replacing one of the same name); its modes must not clash with another method's."""
    _builtins()
    taken = {mode: m.name for m in _METHODS.values() if m.name != method.name for mode in (*m.modes, *SHARED_MODES)}
    clash = [mode for mode in method.modes if mode in taken or mode in SHARED_MODES]
    if clash:
        raise ValueError(
            f"method {method.name!r}: mode(s) {clash} already offered by {sorted({taken.get(c, 'every index') for c in clash})}"
        )
    _METHODS[method.name] = method
    return method


def _builtins() -> None:
    if _METHODS:
        return
    for spec in BUILTIN:
        module, _, cls = spec.partition(":")
        method = getattr(importlib.import_module(module), cls)()
        _METHODS[method.name] = method


def all_methods() -> list[IndexMethod]:
    _builtins()
    return list(_METHODS.values())


def get_method(name: str) -> IndexMethod:
    _builtins()
    if name not in _METHODS:
        raise UsageError(f"unknown index.method {name!r}; choose one of {', '.join(_METHODS)}")
    return _METHODS[name]


def index_modes(method: str) -> tuple[str, ...]:
    """The retrieval modes an index built by ``method`` offers: its own, then the shared ones."""
    return (*get_method(method).modes, *SHARED_MODES)


def all_modes() -> tuple[str, ...]:
    """Every retrieval mode of every registered method, then the shared ones."""
    return tuple(dict.fromkeys([*(mode for m in all_methods() for mode in m.modes), *SHARED_MODES]))


def method_of_mode(mode: str) -> IndexMethod | None:
    """The method whose own mode ``mode`` is (None: a shared mode)."""
    return next((m for m in all_methods() if mode in m.modes), None)


def relation_kinds() -> tuple[str, ...]:
    """Every relation kind an index may hold: the shared ones, then each method's own."""
    return tuple(dict.fromkeys([*SHARED_RELATION_KINDS, *(k for m in all_methods() for k in m.relation_kinds)]))


def modes_help() -> str:
    """Which index offers which mode, for ``--help`` texts."""
    own = "; ".join(f"{m.name} indexes: {' | '.join(m.modes)}" for m in all_methods())
    return f"{own}; any index: {' | '.join(SHARED_MODES)} (graph-ranked, BM25 + dense, dense sources only)"
