"""Calls for models Ollama's cloud runs: no GPU of the fleet serves them, so they are not
placed; a provider whose Ollama sends them on takes them as they came.

Ollama sends a call to its cloud when the model names that source (`x:cloud`, or a tag
ending in `-cloud`, from 0.18: core/models.py `model_ref`), or when the name is a stub
in its store, which /api/tags lists with a `remote_host` (server/routes.go:308-330
generate, 2518-2540 chat)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from proxy.core.context import parse_version
from proxy.core.models import CLOUD_SOURCE, LOCAL_SOURCE, SOURCE_SUFFIXES_SINCE, model_key
from proxy.core.types import ProviderView


def sends_to_cloud(view: ProviderView, model: str, source: str) -> bool:
    """Whether this provider's Ollama sends a call for `model` (named with `source`: "",
    "local" or "cloud", as core/models.py reads the call's name) on to its cloud."""
    reads_source = parse_version(view.version) >= SOURCE_SUFFIXES_SINCE
    if source == CLOUD_SOURCE and reads_source:
        return True
    if source == LOCAL_SOURCE and reads_source:
        return False  # a stub asked for as local is Ollama's 404: placed, found nowhere
    key = model_key(model)
    return any(model_key(stub) == key for stub in view.remote)


def cloud_provider(model: str, source: str, views: Sequence[ProviderView],
                   up: Callable[[str], bool]) -> str | None:
    """The provider to send a call for `model` through to Ollama's cloud: of those whose
    Ollama would, in configured order, the first one up with the cloud on; else one up
    with it off (OLLAMA_NO_CLOUD: its refusal is the answer, as Ollama's own); else the
    first, whose failure is. None when none would, and the call is placed."""
    return gateway([v for v in views if sends_to_cloud(v, model, source)], up)


def gateway(views: Sequence[ProviderView], up: Callable[[str], bool]) -> str | None:
    """Of these providers, the one to reach Ollama's cloud through (a call, the account
    signed in, a web search): in configured order, the first one up with the cloud on; else
    one up with it off; else the first. None when there is none."""
    ranked = sorted(views, key=lambda v: (not up(v.name), v.cloud_off))
    return ranked[0].name if ranked else None
