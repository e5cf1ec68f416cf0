"""How long a call is expected to hold a slot: each source of the estimate, their order, the
default, and what the estimate does to the queue."""

from __future__ import annotations

import pytest

from proxy.core.lengths import NO_LENGTHS, CallLength, CallLengths, CallSample
from proxy.core.placement import explain, place
from proxy.core.policy import DEFAULT_POLICY
from tests.unit.builders import call, gpu, snapshot, ticket

DEFAULT = DEFAULT_POLICY.default_call_s


def answered(lengths: CallLengths, provider: str, model: str, seconds: float,
             tokens: int = 0, rate: float = 0.0, prompt_rate: float = 0.0) -> CallLengths:
    """One answer: `tokens` at `rate` tokens/s, a 1000-token prompt at `prompt_rate`."""
    return lengths.observe(provider, model, CallSample(
        seconds, tokens or None, tokens / rate if rate else None,
        1000 if prompt_rate else None, 1000 / prompt_rate if prompt_rate else None))


def test_nothing_known_is_the_default() -> None:
    assert NO_LENGTHS.estimate("a", "qwen3:8b", default_s=DEFAULT) == \
        CallLength(DEFAULT, "default")


def test_models_asked_between_answers_are_not_each_remembered() -> None:
    """Calls for names no provider has are weighed, and answered by no one: the lengths
    then stay the same object for as long as they come."""
    lengths = answered(NO_LENGTHS, "a", "qwen3:8b", 2.0)
    for i in range(3000):
        assert lengths.estimate("b", f"bogus-{i}", default_s=DEFAULT).source == "default"
    assert len(lengths._most) <= 1024
    assert lengths.estimate("b", "qwen3:8b", default_s=DEFAULT).source == "qwen3:8b on a"


def test_the_model_on_the_card_averages_its_recent_calls() -> None:
    lengths = answered(answered(NO_LENGTHS, "a", "qwen3:8b", 2.0), "a", "qwen3:8b", 4.0)
    estimate = lengths.estimate("a", "qwen3:8b", num_predict=4000, default_s=DEFAULT)
    assert estimate.seconds == pytest.approx(0.4 * 4.0 + 0.6 * 2.0)
    assert estimate.source == "qwen3:8b on a"


def test_the_model_on_another_card_is_scaled_by_their_token_rates_on_shared_models() -> None:
    lengths = NO_LENGTHS
    # "b" answers the 14b twice as fast as "a": the 8b, seen on "a" only, is halved on "b".
    lengths = answered(lengths, "a", "qwen3:14b", 10.0, tokens=400, rate=40.0)
    lengths = answered(lengths, "b", "qwen3:14b", 5.0, tokens=400, rate=80.0)
    lengths = answered(lengths, "a", "qwen3:8b", 6.0, tokens=300, rate=50.0)
    estimate = lengths.estimate("b", "qwen3:8b", default_s=DEFAULT)
    assert estimate.seconds == pytest.approx(3.0)
    assert estimate.source == "qwen3:8b on a, scaled by token rate"


def test_without_a_shared_model_the_other_card_s_figure_stands_unscaled() -> None:
    lengths = answered(NO_LENGTHS, "a", "qwen3:8b", 6.0, tokens=300, rate=50.0)
    lengths = answered(lengths, "b", "qwen3:32b", 20.0, tokens=300, rate=15.0)
    assert lengths.estimate("b", "qwen3:8b", default_s=DEFAULT) == \
        CallLength(6.0, "qwen3:8b on a")


def test_the_card_that_answered_the_model_most_is_the_one_scaled() -> None:
    lengths = answered(NO_LENGTHS, "a", "qwen3:8b", 6.0)
    lengths = answered(answered(lengths, "b", "qwen3:8b", 2.0), "b", "qwen3:8b", 2.0)
    assert lengths.estimate("c", "qwen3:8b", default_s=DEFAULT).source == "qwen3:8b on b"


def test_each_card_is_scaled_from_the_card_that_answered_the_model_most_but_itself() -> None:
    """The cards that answered a model most are kept per model: a card asking is sent to
    the most but itself, by name among equals, whichever card asked before it."""
    lengths = answered(NO_LENGTHS, "c", "qwen3:8b", 6.0)
    lengths = answered(answered(lengths, "b", "qwen3:8b", 2.0), "b", "qwen3:8b", 2.0)
    lengths = answered(answered(lengths, "a", "qwen3:8b", 3.0), "a", "qwen3:8b", 3.0)
    sources = {card: lengths.estimate(card, "qwen3:8b", default_s=DEFAULT).source
               for card in ("d", "a", "b", "c")}
    assert sources == {"d": "qwen3:8b on a", "a": "qwen3:8b on a", "b": "qwen3:8b on b",
                       "c": "qwen3:8b on c"}
    assert lengths.estimate("a", "qwen3:14b", default_s=DEFAULT).source == "default"
    # A card answering more later is seen by the lengths that learned it
    later = answered(answered(answered(lengths, "c", "qwen3:8b", 6.0), "c", "qwen3:8b", 6.0),
                     "c", "qwen3:8b", 6.0)
    assert later.estimate("d", "qwen3:8b", default_s=DEFAULT).source == "qwen3:8b on c"
    assert lengths.estimate("d", "qwen3:8b", default_s=DEFAULT).source == "qwen3:8b on a"


def test_num_predict_at_the_card_s_token_rate_plus_the_prompt() -> None:
    lengths = answered(NO_LENGTHS, "a", "qwen3:14b", 10.0, tokens=400, rate=40.0,
                       prompt_rate=2000.0)
    estimate = lengths.estimate("a", "qwen3:8b", num_predict=200, prompt_tokens=4000,
                                default_s=DEFAULT)
    assert estimate.seconds == pytest.approx(200 / 40 + 4000 / 2000)
    assert estimate.source == "num_predict at a's token rate"


def test_the_agent_s_answers_for_the_model_at_the_card_s_token_rate() -> None:
    lengths = answered(NO_LENGTHS, "a", "qwen3:14b", 10.0, tokens=400, rate=40.0)
    # Answers for the 8b counted (say on the OpenAI API) but never timed on any card.
    lengths = CallLengths(lengths.seconds, lengths.rates, lengths.card_rates,
                          lengths.prompt_rates, {"qwen3:8b": answered(
                              NO_LENGTHS, "x", "qwen3:8b", 1.0, tokens=120).answers["qwen3:8b"]})
    estimate = lengths.estimate("a", "qwen3:8b", default_s=DEFAULT)
    assert estimate.seconds == pytest.approx(120 / 40)
    assert estimate.source == "this agent's qwen3:8b answers at a's token rate"


def test_the_provider_s_calls_of_any_model_before_the_default() -> None:
    assert NO_LENGTHS.estimate("a", "qwen3:8b", num_predict=100, provider_latency_s=7.0,
                               default_s=DEFAULT) == CallLength(7.0, "a's calls, any model")


def test_the_order_of_precedence() -> None:
    lengths = answered(NO_LENGTHS, "a", "qwen3:8b", 1.0, tokens=50, rate=50.0)
    lengths = answered(lengths, "b", "qwen3:8b", 9.0, tokens=50, rate=50.0)
    order = [
        # on "a": its own calls, whatever else is known
        ("a", "qwen3:8b", 500, 3.0, "qwen3:8b on a"),
        # on "c": the model elsewhere beats num_predict and the provider's latency
        ("c", "qwen3:8b", 500, 3.0, "qwen3:8b on a"),
        # a model never timed: num_predict beats the agent's answers and the latency
        ("a", "qwen3:14b", 500, 3.0, "num_predict at a's token rate"),
        # without num_predict: the agent's answers (none for the 14b) give way to latency
        ("a", "qwen3:14b", 0, 3.0, "a's calls, any model"),
        # a card never seen: nothing but the default
        ("c", "qwen3:14b", 500, None, "default"),
    ]
    for provider, model, predict, latency, expected in order:
        assert lengths.estimate(provider, model, num_predict=predict,
                                provider_latency_s=latency, default_s=DEFAULT
                                ).source == expected, (provider, model)


def test_observing_leaves_the_old_value_alone() -> None:
    before = answered(NO_LENGTHS, "a", "qwen3:8b", 1.0)
    answered(before, "a", "qwen3:8b", 9.0)
    assert before.estimate("a", "qwen3:8b", default_s=DEFAULT).seconds == 1.0


def test_a_short_learned_call_queues_behind_one_running_instead_of_loading_a_copy() -> None:
    """One call of the 8b runs on "a" (one slot); "b" has room for a second copy. At the
    default length the queue looks longer than the load; a 1 s call seen there is not."""
    cards = (gpu("a", residents=("qwen3:8b",)), gpu("b"))
    running = (ticket("a", "qwen3:8b", elapsed=0.2),)
    unknown = place(call("qwen3:8b"), snapshot(*cards, tickets=running))
    assert unknown.placement is not None and unknown.placement.kind == "cold"
    learned = answered(NO_LENGTHS, "a", "qwen3:8b", 1.0)
    known = place(call("qwen3:8b"), snapshot(*cards, tickets=running, lengths=learned))
    assert (known.outcome, known.placement) == ("wait", None)
    assert "slot of qwen3:8b on a" in known.reason


def test_explain_gives_each_verdict_its_call_length_and_source() -> None:
    learned = answered(NO_LENGTHS, "a", "qwen3:8b", 1.5)
    _, verdicts = explain(call("qwen3:8b"), snapshot(gpu("a", residents=("qwen3:8b",)),
                                                     gpu("b"), lengths=learned))
    lengths = {v.provider: v.call_length for v in verdicts}
    assert lengths == {"a": CallLength(1.5, "qwen3:8b on a"),
                       "b": CallLength(1.5, "qwen3:8b on a")}
