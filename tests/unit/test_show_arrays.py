"""The arrays a non-verbose /api/show withholds (null: server/routes.go getModelData reads the
file with maxArraySize 0, HEAD:1600-1605; fs/ggml/gguf.go newArray, HEAD:465-483): which of
them sizing needs a verbose answer for, and what it takes when that answer fails."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from loadtest.sim_model import CATALOG, GEMMA3N_E4B, LFM2_1_2B, SimConfig
from loadtest.sim_sched import OllamaSim
from proxy.core.sizing import arrays_withheld, with_arrays
from proxy.ports import ShowAnswer, Timeouts, UpstreamError
from proxy.service import prober
from proxy.service.prober import _details, model_info

SIM = OllamaSim(SimConfig(models=(LFM2_1_2B, GEMMA3N_E4B, *CATALOG)))


def test_a_null_that_sizing_reads_needs_the_verbose_answer() -> None:
    lfm2 = SIM.show(LFM2_1_2B)["model_info"]
    assert arrays_withheld(lfm2, "lfm2") == ("lfm2.attention.head_count_kv",)
    gemma3n = SIM.show(GEMMA3N_E4B)["model_info"]
    assert arrays_withheld(gemma3n, "gemma3n") == ("gemma3n.attention.sliding_window_pattern",)
    qwen3 = SIM.show(CATALOG[2])["model_info"]
    assert qwen3["tokenizer.ggml.tokens"] is None  # withheld, but not read for sizing
    assert arrays_withheld(qwen3, "qwen3") == ()
    # a window pattern where no rule reads it (llama: every layer full), an absent key
    llama = {"llama.attention.head_count": 4, "llama.attention.head_count_kv": 4,
             "llama.attention.sliding_window_pattern": None}
    assert arrays_withheld(llama, "llama") == ()
    assert arrays_withheld({**llama, "llama.attention.key_length_swa": 256}, "llama") == \
        ("llama.attention.sliding_window_pattern",)
    assert arrays_withheld({"laguna.attention.head_count": None,
                            "laguna.attention.layer_types": None}, "laguna") == \
        ("laguna.attention.head_count", "laguna.attention.layer_types")


@pytest.mark.parametrize("model", [LFM2_1_2B, GEMMA3N_E4B])
def test_the_verbose_arrays_size_it_as_its_file(model: Any) -> None:
    plain, verbose = SIM.show(model), SIM.show(model, verbose=True)
    filled, unknown = with_arrays(plain["model_info"], model.arch, verbose["model_info"])
    assert unknown == ()
    assert model_info({**plain, "model_info": filled}) == model_info(verbose)


def test_arrays_left_unknown_are_taken_at_their_larger_figures() -> None:
    plain, verbose = SIM.show(LFM2_1_2B), SIM.show(LFM2_1_2B, verbose=True)
    filled, unknown = with_arrays(plain["model_info"], "lfm2", {})
    assert unknown == ("lfm2.attention.head_count_kv",)
    # every layer its 32 heads of 64: 16 x 32 x 128 x 2 B, not the file's 12 KiB
    assert model_info({**plain, "model_info": filled}).kv_bytes_per_token == 131072
    assert model_info(verbose).kv_bytes_per_token == 12288
    # gemma3n: no layer windowed
    plain = SIM.show(GEMMA3N_E4B)
    filled, _ = with_arrays(plain["model_info"], "gemma3n", {})
    info = model_info({**plain, "model_info": filled})
    assert info.swa_kv_bytes_per_token == 0 and info.kv_bytes_per_token == 20 * 2 * 512 * 2
    # unknown query heads (laguna's per layer): the KV heads when one figure, else no grouping
    laguna = {"laguna.block_count": 4, "laguna.embedding_length": 2048,
              "laguna.attention.head_count": None, "laguna.attention.key_length": 128,
              "laguna.attention.value_length": 128}
    for kv, heads in ((8, 8), (None, 16)):
        filled, _ = with_arrays({**laguna, "laguna.attention.head_count_kv": kv}, "laguna", {})
        assert filled["laguna.attention.head_count"] == heads
        assert model_info({"model_info": {**filled, "general.architecture": "laguna"}}) \
            .kv_bytes_per_token == 4 * heads * 256 * 2


class _Body:
    status_code = 200
    content_type = "application/json"

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.closed = False

    async def read(self) -> bytes:
        return self.body

    async def chunks(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self.body), 1024):
            yield self.body[i:i + 1024]

    async def aclose(self) -> None:
        self.closed = True


class _Server:
    """The simulator's /api/show, the verbose one through `open` as the prober asks it."""

    timeouts = Timeouts()

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.opened: list[_Body] = []

    async def show(self, body: dict[str, Any], timeout_s: float | None = None) -> ShowAnswer:
        return ShowAnswer(200, orjson.dumps(SIM.show(SIM.config.model(body["model"]))))

    async def open(self, path: str, payload: bytes) -> _Body:
        asked = orjson.loads(payload)
        assert (path, asked["verbose"]) == ("/api/show", True)
        if self.fails:
            raise UpstreamError("connection refused")
        self.opened.append(_Body(orjson.dumps(SIM.show(SIM.config.model(asked["model"]),
                                                       verbose=True))))
        return self.opened[-1]


async def test_the_prober_reads_the_arrays_from_a_bounded_verbose_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = _Server()
    shown = await _details(server, "lfm2:1.2b")  # type: ignore[arg-type]
    assert model_info(shown).kv_bytes_per_token == 12288
    assert shown["model_info"]["tokenizer.ggml.tokens"] is None  # only the keys needed
    assert await _details(server, "qwen3:8b") and len(server.opened) == 1  # type: ignore
    # a body over the bound is not read on: the larger figures, said so
    monkeypatch.setattr(prober, "VERBOSE_SHOW_MAX_BYTES", 4096)
    for slow in (server, _Server(fails=True)):
        with capture_logs() as logs:
            shown = await _details(slow, "lfm2:1.2b")  # type: ignore[arg-type]
        assert model_info(shown).kv_bytes_per_token == 131072
        assert [e["keys"] for e in logs if e["log_level"] == "warning"] == \
            [["lfm2.attention.head_count_kv"]]
    assert server.opened[-1].closed
