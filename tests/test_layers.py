"""The folders' dependency direction holds: no runtime import runs up a layer.

Each package may import only the layers listed for it (its own included). Imports
under ``if TYPE_CHECKING:`` are for types only and are allowed either way; every
other import counts, at module level or inside a function. The layers, bottom up:

- the ``robustmq`` core (records, frames, wire protocol, client, errors);
- ``robustmq.tier`` (the tiered object format and store);
- the storage node's ``engine`` < ``replication`` < ``tiered`` < ``node``;
- the Meta Service, and the Spark connector < the streaming jobs, and the Kafka gateway (on the core);
- ``robustmq.cli`` on top, which may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# folder of the checkout -> the import name it is installed as (pyproject's package-dir)
FOLDERS = {
    "robustmq": "robustmq",
    "storage_node": "robustmq.storage_node",
    "meta": "robustmq.meta",
    "connector": "robustmq.connector",
    "streaming_jobs": "robustmq.streaming_jobs",
    "kafka_gateway": "robustmq.kafka_gateway",
}

CORE = "core"
NODE = "robustmq.storage_node"
# layer -> the layers it may import (itself included)
ALLOWED: dict[str, set[str]] = {
    CORE: {CORE},
    "robustmq.tier": {CORE, "robustmq.tier"},
    f"{NODE}.engine": {CORE, f"{NODE}.engine"},
    f"{NODE}.replication": {CORE, f"{NODE}.engine", f"{NODE}.replication"},
    f"{NODE}.tiered": {CORE, "robustmq.tier", f"{NODE}.engine", f"{NODE}.replication", f"{NODE}.tiered"},
    f"{NODE}.node": {
        CORE,
        "robustmq.tier",
        f"{NODE}.engine",
        f"{NODE}.replication",
        f"{NODE}.tiered",
        f"{NODE}.node",
    },
    NODE: {CORE, f"{NODE}.engine", f"{NODE}.replication", f"{NODE}.tiered", f"{NODE}.node", NODE},
    "robustmq.meta": {CORE, "robustmq.tier", "robustmq.meta"},
    "robustmq.connector": {CORE, "robustmq.tier", "robustmq.connector"},
    "robustmq.streaming_jobs": {CORE, "robustmq.tier", "robustmq.connector", "robustmq.streaming_jobs"},
    "robustmq.kafka_gateway": {CORE, "robustmq.kafka_gateway"},
}
# longest prefix first: the layer of a module is the first of these it is in
PREFIXES = sorted((name for name in ALLOWED if name != CORE), key=len, reverse=True)


def layer_of(module: str) -> str | None:
    """The layer ``module`` belongs to; None for ``robustmq.cli`` (on top) and foreign modules."""
    if module == "robustmq.cli" or module.startswith("robustmq.cli."):
        return None
    for prefix in PREFIXES:
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    if module == "robustmq" or module.startswith("robustmq."):
        return CORE
    return None


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT)
    parts = [FOLDERS[relative.parts[0]], *relative.parts[1:]]
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def runtime_imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) of every import outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for_types: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for_types.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in for_types:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # `from robustmq.storage_node import engine` imports the subpackage itself
            found += [(node.lineno, target)]
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return found


def sources() -> list[Path]:
    return sorted(
        path for folder in FOLDERS for path in (ROOT / folder).rglob("*.py") if "_proto" not in path.parts
    )


def upward_imports() -> list[str]:
    found = []
    for path in sources():
        module = module_name(path)
        layer = layer_of(module)
        if layer is None:
            continue
        for line, target in runtime_imports(path, module):
            if target == "robustmq.cli" or target.startswith("robustmq.cli."):
                found.append(f"{path.relative_to(ROOT)}:{line}: {layer} imports {target} (the CLI)")
                continue
            target_layer = layer_of(target)
            if target_layer is not None and target_layer not in ALLOWED[layer]:
                found.append(f"{path.relative_to(ROOT)}:{line}: {layer} imports {target} ({target_layer})")
    return sorted(set(found))


def test_no_runtime_import_runs_up_a_layer() -> None:
    found = upward_imports()
    assert not found, "imports against the layers' direction:\n" + "\n".join(found)


def test_every_package_folder_has_a_layer() -> None:
    """A new subpackage must be placed in a layer before it can hold code."""
    for path in sources():
        module = module_name(path)
        if module.startswith("robustmq.storage_node."):
            assert layer_of(module) != NODE, f"{module} is in no storage-node layer"


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("robustmq._records", CORE),
        ("robustmq.errors", CORE),
        ("robustmq.tier._format", "robustmq.tier"),
        ("robustmq.storage_node.engine._segment", f"{NODE}.engine"),
        ("robustmq.storage_node.node._node", f"{NODE}.node"),
        ("robustmq.cli._demo", None),
        ("pyarrow", None),
    ],
)
def test_layer_of(module: str, layer: str | None) -> None:
    assert layer_of(module) == layer


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    """The reader sees function-level imports and skips TYPE_CHECKING blocks."""
    source = tmp_path / "_example.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..node._node import StorageNode\n"
        "def f():\n"
        "    from ..node._io_worker import Request\n"
    )
    found = runtime_imports(source, "robustmq.storage_node.engine._example")
    assert {target for _, target in found} == {
        "typing",
        "typing.TYPE_CHECKING",
        "robustmq.storage_node.node._io_worker",
        "robustmq.storage_node.node._io_worker.Request",
    }
