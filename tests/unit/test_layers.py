"""app/'s imports run one way: ingress → data plane → service → batching → engines → model.

Every import of app/ (module level and inside functions alike) is read with `ast`; a module may
import its own layer or one below it, never one above, and no chain of imports comes back to
where it started.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (package or module, layer): 0 is the top. The longest prefix decides.
LAYERS = {
    "app.cli": 0, "app.tuning": 0, "app.config_doc": 0, "app.runtime": 0, "app.engine_process.host": 0,
    "app.main": 1, "app.runtime.drain": 1,  # the app's lifespan drains on signals
    "app.http": 2, "app.protocols": 2, "app.access": 2, "app.front_door": 2,
    "app.dataplane": 3,
    "app.service": 4, "app.model_control": 4,
    "app.batching": 5, "app.engine_process": 5,
    "app.codecs": 6, "app.engines": 6,
    "app.repository": 7,
    "app.ops": 8, "app.errors": 8, "app.config": 8, "app.access.tokens": 8,  # tokens: values Settings reads
    "app": 9,
}  # fmt: skip


def layer(module: str) -> int:
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix]


def imports() -> dict[str, set[str]]:
    """module → the app modules it imports."""
    found: dict[str, set[str]] = {}
    for path in ROOT.glob("app/**/*.py"):
        if "proto" in path.parts:
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("app"):
                names = [node.module] if node.module != "app" else [f"app.{a.name}" for a in node.names]
                found.setdefault(module, set()).update(n for n in names if n != "app.__version__")
            elif isinstance(node, ast.Import):
                found.setdefault(module, set()).update(a.name for a in node.names if a.name.startswith("app."))
    return found


def upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} ({layer(module)}) imports {target} ({layer(target)})"
        for module, targets in graph.items()
        for target in targets
        if layer(target) < layer(module)
    )


def test_nothing_imports_a_layer_above_it() -> None:
    found = upward(imports())
    assert not found, "\n".join(found)


def test_no_import_cycles() -> None:
    graph = imports()
    cycles: list[str] = []

    def visit(module: str, path: list[str], done: set[str]) -> None:
        for target in sorted(graph.get(module, ())):
            if target in path:
                cycles.append(" → ".join([*path[path.index(target) :], target]))
            elif target not in done:
                done.add(target)
                visit(target, [*path, target], done)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            done.add(module)
            visit(module, [module], done)
    assert not cycles, "\n".join(cycles)


def test_the_check_sees_an_upward_import() -> None:
    """The control: an engine importing the HTTP layer is caught; the data plane importing batching is not."""
    graph = {"app.engines.cuda": {"app.http.protocol"}, "app.dataplane": {"app.batching.batcher"}}
    assert upward(graph) == ["app.engines.cuda (6) imports app.http.protocol (2)"]
