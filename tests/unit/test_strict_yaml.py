"""The YAML every program reads (operator documents, --config, providers files)."""

from __future__ import annotations

import pytest
import yaml

from proxy import strict_yaml


def laughs(levels: int) -> str:
    """Nine aliases of nine aliases ...: 9**levels strings from a few hundred bytes."""
    names = "abcdefghijk"[:levels]
    return "".join(f"{n}: &{n} [{', '.join([f'*{p}' if p else 'lol'] * 9)}]\n"
                   for p, n in zip(["", *names], names, strict=False))


def test_excessive_aliasing_is_refused_as_kubernetes_refuses_it() -> None:
    with pytest.raises(yaml.YAMLError, match="excessive aliasing"):
        strict_yaml.load(laughs(7))
    with pytest.raises(yaml.YAMLError, match="excessive aliasing"):
        strict_yaml.load_all("a: 1\n---\n" + laughs(7))


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    with pytest.raises(yaml.YAMLError, match="contains it"):
        strict_yaml.load("a: &a [1, *a]\n")


def test_ordinary_aliases_and_merge_keys_still_read() -> None:
    assert strict_yaml.load(laughs(4))["d"][0][0][0] == ["lol"] * 9  # 6561 strings
    text = "base: &b {x: 1, y: 2}\nthis: {<<: *b, y: 3}\nthat: *b\n"
    assert strict_yaml.load(text) == {"base": {"x": 1, "y": 2}, "this": {"x": 1, "y": 3},
                                      "that": {"x": 1, "y": 2}}
