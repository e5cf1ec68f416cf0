"""YAML as Kubernetes and the operator read it: a key given twice in one mapping is an error
(kubectl's strict field validation), not the last value silently winning. Used for every
file the programs read: the operator documents, `--config`, providers and candidate files."""

from __future__ import annotations

from typing import Any

import yaml


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping."""


def _mapping_once(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    # Only the keys written here: what a merge key (`<<: *base`) brings may be overridden.
    seen: set[str] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
            continue
        if key_node.value in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key_node.value!r} is given twice in one mapping",
                key_node.start_mark)
        seen.add(key_node.value)
    return loader.construct_mapping(node)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_once)

# Aliases may multiply what is written (a "billion laughs": nine aliases of nine aliases ...):
# built, then walked by the schemas or printed in an error, it takes minutes and gigabytes.
# Kubernetes' YAML reader refuses such a document too ("excessive aliasing", go-yaml).
MAX_EXPANDED_NODES = 1_000_000


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes the document has once every alias is expanded (the composed graph
    shares an aliased node: each use counts); ConstructorError past the limit or on an
    alias inside its own anchor."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise yaml.constructor.ConstructorError(
                None, None, "an alias refers to a node that contains it", node.start_mark)
        active.add(key)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_EXPANDED_NODES:
                raise yaml.constructor.ConstructorError(
                    None, None, f"aliases expand it past {MAX_EXPANDED_NODES} nodes "
                    "(excessive aliasing)", child.start_mark)
        active.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _construct_document(loader: StrictLoader, node: yaml.Node) -> Any:
    _expanded_size(node)
    return yaml.SafeLoader.construct_document(loader, node)


StrictLoader.construct_document = _construct_document  # type: ignore[assignment,method-assign]


def load(text: str) -> Any:
    """One YAML document; yaml.YAMLError when it is not valid (or gives a key twice)."""
    return yaml.load(text, Loader=StrictLoader)  # (a SafeLoader)


def load_all(text: str) -> list[Any]:
    """Every document of a YAML stream, as `load` reads one."""
    return list(yaml.load_all(text, Loader=StrictLoader))
