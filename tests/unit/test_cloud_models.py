"""Which provider sends a call on to Ollama's cloud (proxy/core/cloud.py): by the source its
name asks for (0.18+), or by a stub the provider lists, never by placement."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from proxy.core.cloud import cloud_provider, sends_to_cloud
from proxy.core.types import ProviderView
from proxy.ports import ShowAnswer
from proxy.service.codec import ProviderState
from proxy.service.prober import cloud_off as prober_cloud_off
from proxy.settings import check_model_name
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


def test_the_simulator_s_no_cloud_refuses_a_stub_from_0_17() -> None:
    from loadtest import sim_cloud

    assert sim_cloud.status(True)["cloud"]["disabled"] is True
    assert sim_cloud.disabled(True, "0.17.0", sim_cloud.INFERENCE_UNAVAILABLE) == \
        sim_cloud.Refused(403, "ollama cloud is disabled: remote inference is unavailable")


def test_a_cloud_401_keeps_its_signin_url() -> None:
    from proxy.api.errors import provider_refusal

    upstream = orjson.dumps({"error": "unauthorized",
                             "signin_url": "https://ollama.com/connect?name=h&key=k"})
    body = orjson.loads(provider_refusal(401, "unauthorized", "gpt-oss:20b:cloud", "ollama",
                                         upstream))
    assert body["error"] == "unauthorized"
    assert body.get("signin_url") == "https://ollama.com/connect?name=h&key=k"


def test_a_provider_with_the_cloud_off_is_the_last_choice() -> None:
    """Its Ollama refuses every cloud call (OLLAMA_NO_CLOUD): taken only when no other could
    send the call on, so that refusal is the answer."""
    off = gpu("off", version="0.33.0", cloud_off=True)
    on = gpu("on", version="0.33.0")
    assert cloud_provider("x:cloud", "cloud", [off, on], lambda name: True) == "on"
    assert cloud_provider("x:cloud", "cloud", [off, on], lambda name: name == "off") == "off"
    assert cloud_provider("x:cloud", "cloud", [off], lambda name: True) == "off"
    state = ProviderState("off", "http://off", True, 0.0, cloud_off=True)
    assert ProviderState.decode(state.encode()).cloud_off is True
    assert ProviderState.decode(replace(state, cloud_off=False).encode()).cloud_off is False


@pytest.mark.parametrize(("answer", "off"), [
    (ShowAnswer(200, b'{"cloud":{"disabled":true,"source":"env"}}'), True),
    (ShowAnswer(200, b'{"cloud":{"disabled":false,"source":"none"}}'), False),
    (ShowAnswer(404, b"404 page not found"), False),  # before 0.17: nothing said
    (ShowAnswer(200, b"[]"), False),
])
def test_what_api_status_says_of_the_cloud(answer: ShowAnswer, off: bool) -> None:
    assert prober_cloud_off(answer) is off


@pytest.mark.parametrize(("name", "ok"), [("gpt-oss:20b:cloud", True), ("qwen3:8b:local", True),
                                          ("gpt-oss:20b-cloud", True), ("x:cloud:local", False)])
def test_a_configured_model_may_say_its_source(name: str, ok: bool) -> None:
    if ok:
        assert check_model_name(name) == name
    else:
        with pytest.raises(ValueError, match="use either :local or :cloud"):
            check_model_name(name)
