"""Which provider sends a call on to Ollama's cloud (proxy/core/cloud.py): by the source its
name asks for (0.18+), or by a stub the provider lists, never by placement."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.cloud import cloud_provider, sends_to_cloud
from proxy.core.types import ProviderView
from proxy.service.codec import ProviderState
from tests.unit.builders import gpu

HOST = "https://ollama.com:443"
NEW, OLD = gpu("new", version="0.33.0"), gpu("old", version="0.12.6")
STUBBED_OLD = gpu("stubbed", version="0.12.6", remote={"gpt-oss:120b-cloud": HOST})


@pytest.mark.parametrize(("view", "model", "source", "sends"), [
    (NEW, "gpt-oss:120b-cloud", "cloud", True),
    (NEW, "gpt-oss:120b:cloud", "cloud", True),
    (gpu("unknown"), "gpt-oss:120b:cloud", "cloud", True),  # unknown version: the newest rules
    (OLD, "gpt-oss:120b-cloud", "cloud", False),  # before 0.18: only a stub is sent on
    (STUBBED_OLD, "gpt-oss:120b-cloud", "cloud", True),
    (STUBBED_OLD, "GPT-OSS:120B-cloud", "cloud", True),  # matched as Ollama matches names
    (NEW, "qwen3:8b", "", False),
    (gpu("mine", version="0.33.0", remote={"mycloud:latest": HOST}), "mycloud", "", True),
    (gpu("mine", version="0.33.0", remote={"mycloud:latest": HOST}), "mycloud", "local", False),
])
def test_which_provider_sends_a_call_to_the_cloud(view: ProviderView, model: str, source: str,
                                                   sends: bool) -> None:
    assert sends_to_cloud(view, model, source) is sends


def test_the_first_provider_up_that_would_takes_it() -> None:
    views = [OLD, gpu("a", version="0.33.0"), gpu("b", version="0.33.0")]
    assert cloud_provider("x:cloud", "cloud", views, lambda name: True) == "a"
    assert cloud_provider("x:cloud", "cloud", views, lambda name: name == "b") == "b"
    # none up: the first that would, whose failure is the answer
    assert cloud_provider("x:cloud", "cloud", views, lambda name: False) == "a"
    assert cloud_provider("qwen3:8b", "", views, lambda name: True) is None
    assert cloud_provider("x:8b-cloud", "cloud", [OLD], lambda name: True) is None


def test_the_stubs_a_provider_lists_are_published() -> None:
    state = ProviderState("new", "http://new", True, 0.0, available_mib={"qwen3:8b": 5000},
                          remote={"mycloud:latest": HOST})
    assert ProviderState.decode(state.encode()).remote == {"mycloud:latest": HOST}
    older = orjson.loads(state.encode())
    del older["remoteModels"]  # a publisher before stubs were told apart
    assert ProviderState.decode(orjson.dumps(older)).remote == {}
