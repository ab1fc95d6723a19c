"""The import direction of src/leantrain: arrows point down the layers, never up, never sideways between packages.

    {errors, version, units, files, processes, heartbeat} < config < {data, modeling, optim} < methods
        < {perf, report} < engine < launch < commands < {cli, leantrain} < __main__

The map with what each layer holds is docs/architecture.md; its marked layer list must be LAYERS below.
A package may import itself freely; packages of the same layer do not import each other. A leantrain import inside a
function is allowed only to keep a heavy optional dependency lazy, marked on its line with ``# lazy:`` and a reason.
No module uses another module's private (``_x``) name, and no modules import each other in a circle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "leantrain"
ARCHITECTURE = SRC.parents[1] / "docs" / "architecture.md"

LAYERS = {
    "leantrain.errors": 0, "leantrain.version": 0, "leantrain.units": 0, "leantrain.files": 0, "leantrain.processes": 0,
    "leantrain.heartbeat": 0,
    "leantrain.config": 1, "leantrain.environments": 1,
    "leantrain.data": 2, "leantrain.modeling": 2, "leantrain.optim": 2,
    "leantrain.methods": 3,
    "leantrain.perf": 4, "leantrain.report": 4,
    "leantrain.engine": 5,
    "leantrain.launch": 6,
    "leantrain.commands": 7,
    "leantrain.cli": 8, "leantrain": 8,
    "leantrain.__main__": 9,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The layered unit a module belongs to: ``leantrain.<package or top-level module>``, or ``leantrain`` itself."""
    parts = module.split(".")
    return ".".join(parts[:2])


def leantrain_imports(tree: ast.Module, module: str, is_package: bool):
    """(line, imported module, imported names, inside a function) for each leantrain import."""
    funcs = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f) if n is not f}
    for node in ast.walk(tree):
        local = id(node) in funcs
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "leantrain":
                    yield node.lineno, alias.name, [], local
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "leantrain":
                yield node.lineno, target, [a.name for a in node.names], local


def violations() -> list[str]:
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    found = []
    for module, path in sorted(modules.items()):
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        here = unit(module)
        aliases: dict[str, str] = {}  # local name -> leantrain module it names
        for line, target, names, local in leantrain_imports(tree, module, path.name == "__init__.py"):
            where = f"{path.relative_to(SRC.parent)}:{line}"
            there = unit(target)
            if there != here and there in LAYERS and here in LAYERS:
                if LAYERS[there] > LAYERS[here]:
                    found.append(f"{where}: {module} (layer {LAYERS[here]}) imports {target} (layer {LAYERS[there]}) above it")
                elif LAYERS[there] == LAYERS[here] and here != "leantrain":
                    found.append(f"{where}: {module} imports {target}, a sibling package of the same layer")
            if local and "# lazy:" not in lines[line - 1]:
                found.append(f"{where}: function-local import of {target} (only for a lazy heavy dependency, "
                             "marked '# lazy: why')")
            for name in names:
                submodule = f"{target}.{name}"
                if submodule in modules:
                    aliases[name] = submodule
                elif name.startswith("_") and not name.startswith("__") and target != module:
                    found.append(f"{where}: {module} imports the private name {target}.{name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: {module} uses the private name "
                             f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_every_module_has_a_layer():
    modules = {module_name(p) for p in SRC.rglob("*.py")}
    assert sorted(m for m in modules if unit(m) not in LAYERS) == []


def test_imports_point_down_and_names_stay_private():
    assert len(list(SRC.rglob("*.py"))) > 50, f"no sources found under {SRC}"
    assert violations() == []


def test_every_package_says_what_it_owns():
    missing = [str(p.relative_to(SRC.parent)) for p in SRC.rglob("__init__.py")
               if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def documented_layers() -> dict[str, int]:
    """The layer list of docs/architecture.md, between its ``<!-- layers`` and ``<!-- /layers -->`` marks: one line
    ``N. `name`, `name`: what they hold`` per layer (``leantrain`` is the package itself)."""
    text = ARCHITECTURE.read_text()
    block = re.search(r"<!-- layers\b.*?-->\n(.*?)<!-- /layers -->", text, re.S)
    assert block, f"{ARCHITECTURE}: no <!-- layers ... --> ... <!-- /layers --> block"
    layers = {}
    for level, names in re.findall(r"^(\d+)\. ((?:`[\w.]+`(?:, )?)+)", block.group(1), re.M):
        for name in re.findall(r"`([\w.]+)`", names):
            layers["leantrain" if name == "leantrain" else f"leantrain.{name}"] = int(level)
    return layers


def test_the_documented_layers_are_the_enforced_ones():
    assert documented_layers() == LAYERS


def import_graph() -> dict[str, set[str]]:
    """Module -> the leantrain modules it imports (a package's name stands for its ``__init__``), at any depth."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for module, path in modules.items():
        targets = set()
        for _, target, names, _ in leantrain_imports(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            targets.update(subs if len(subs) == len(names) and subs else [target])
        graph[module] = {t for t in targets if t in modules and t != module}
    return graph


def test_no_import_cycles():
    """No modules import each other in a circle (e.g. lora <-> qlora), not even through a lazy import."""
    graph, cycles, done = import_graph(), [], set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(graph[module]):
            if target in path:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in done:
                visit(target, path + [target])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert cycles == []
