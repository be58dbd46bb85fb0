"""The house's rooms, bottom to top, read from the code: pure math and text (core) < llama.cpp and model files
(llama, models) < drafters and costs (drafting) < the loop (decoding) < the facade (api) < frontends. No import runs
back up, no two modules import each other, and only llama/ imports llama_cpp."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "localspec"
ROOMS = {
    "core": 1,
    "llama": 2,
    "models": 2,
    "drafting": 3,
    "decoding": 4,
    "api": 5,
    "machine": 5,
    "config": 5,
    "frontends": 6,
    "__main__": 7,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path] | None = None, *, typing: bool = False) -> set[str]:
    """The modules `path` imports when it runs (anywhere in it; those only a type checker reads too where `typing`):
    `from package import submodule` imports the submodule."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only and not typing:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(modules or ())
            found |= subs or {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def _room(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    return ROOMS.get(part, 0)  # errors, paths, settings, files, process: the ground floor


def test_no_import_runs_back_up_and_none_goes_round() -> None:
    """Type-only imports counted: a circle a type checker needs is a circle."""
    modules = _modules()
    graph = {
        m: {i for i in _imports(p, modules, typing=True) if i in modules and i != "localspec"}
        for m, p in modules.items()
    }
    up = [(m, i) for m, deps in graph.items() if m != "localspec" for i in deps if _room(i) > _room(m)]
    assert not up, up

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for n in graph[start]:
            if n == goal:
                return True
            if n not in seen:
                seen.add(n)
                if reaches(n, goal, seen):
                    return True
        return False

    circles = sorted({tuple(sorted((m, i))) for m, deps in graph.items() for i in deps if reaches(i, m, set())})
    assert not circles, circles


def test_only_llama_imports_llama_cpp() -> None:
    users = [m for m, p in _modules().items() if any(i.split(".")[0] == "llama_cpp" for i in _imports(p))]
    assert users and all(m.startswith("localspec.llama.") for m in users), users


# What a frontend may import of the package: the facade (the API, the machine's report, the configuration file),
# the ground floor, and the model-file library that `localspec models` fronts.
FACADE = ("api", "machine", "config", "settings", "errors", "paths", "files", "process", "models", "frontends")


def test_frontends_go_through_the_facade() -> None:
    """Frontends read the pair through LocalSpec (never behind it: its engine) and import nothing of the loop,
    the drafters, the costs or llama.cpp."""
    modules = _modules()
    for module, path in modules.items():
        if module.startswith("localspec.frontends"):
            assert "spec.engine" not in path.read_text(), path
            below = [i for i in _imports(path, modules) if i.startswith("localspec.") and i.split(".")[1] not in FACADE]
            assert not below, (module, below)
