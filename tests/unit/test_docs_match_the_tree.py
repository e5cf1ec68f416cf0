"""What a newcomer reads against what is there: the README's code map names every module,
and docs/configuration.md every setting and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
# Named in docs/configuration.md as what is not a setting: Kubernetes' service links.
NOT_SETTINGS = {"KUBEMOOT_SERVICE_HOST", "KUBEMOOT_PORT_80_TCP"}


def code_map() -> tuple[str, dict[str, str]]:
    """The README's code map, and each entry's text under its folder (`proxy/core/`)."""
    block = (ROOT / "README.md").read_text().split("## Code map", 1)[1].split("```")[1]
    entries: dict[str, str] = {}
    path = ""
    for line in block.splitlines():
        if line and not line[0].isspace():
            path = line.split()[0]
        if path:
            entries[path] = entries.get(path, "") + line + "\n"
    return block, entries


@pytest.mark.parametrize("package", ["proxy", "loadtest"])
def test_the_code_map_names_every_module(package: str) -> None:
    block, entries = code_map()
    missing = []
    for module in sorted((ROOT / package).rglob("*.py")):
        path = module.relative_to(ROOT).as_posix()
        folder = module.parent.relative_to(ROOT).as_posix() + "/"
        if module.stem.startswith("__") or path in block:
            continue
        if not re.search(rf"\b{module.stem}\b", entries.get(folder, "")):
            missing.append(path)
    assert not missing, f"README's code map does not name {missing}"


def test_the_configuration_page_lists_every_setting_and_only_settings() -> None:
    fields = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    page = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"`(KUBEMOOT_[A-Z0-9_]+)`", page)) - NOT_SETTINGS
    assert fields - documented == set(), "settings docs/configuration.md does not list"
    assert documented - fields == set(), "names docs/configuration.md lists that are no setting"
