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


def load(text: str) -> Any:
    """One YAML document; yaml.YAMLError when it is not valid (or gives a key twice)."""
    return yaml.load(text, Loader=StrictLoader)  # (a SafeLoader)


def load_all(text: str) -> list[Any]:
    """Every document of a YAML stream, as `load` reads one."""
    return list(yaml.load_all(text, Loader=StrictLoader))
