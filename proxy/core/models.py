"""Model names as Ollama spells them, and which models an agent's calls may run."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.types import Candidate, ProviderView


def model_name(entry: Mapping[str, Any]) -> str:
    """The model of an /api/tags or /api/ps entry (`model`, or `name` on older servers),
    normalised."""
    return normalise_model(str(entry.get("model") or entry.get("name")))


# Ollama's model names (types/model/name.go:101-176 ParseName, 344-376 isValidPart; the
# same rules at v0.12.6, :135 and :319): [[scheme://]host/][namespace/]model[:tag], the
# missing parts its defaults (:39-41). Each part begins with a letter, digit or `_`, then
# those, `-`, `_`, and `.` (not in a namespace) or `:` (only in a host); a separator with
# nothing beside it makes the name invalid. Ollama matches each part case-insensitively
# (server/routes.go getExistingName, :1222-1245; v0.12.6 :916-940), so `Qwen3:8B` runs
# the store's `qwen3:8b`.
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
_NAME_DEFAULTS = {"host": DEFAULT_HOST, "namespace": DEFAULT_NAMESPACE, "tag": DEFAULT_TAG}
_NAME_LENGTHS = {"host": 350, "namespace": 80, "model": 80, "tag": 80}
_NAME_EXTRA = {"host": "-_.:", "namespace": "-_", "model": "-_.", "tag": "-_."}
_MISSING = "!MISSING!"  # Ollama's marker of a part a separator promised (never valid)
# From 0.15.5 every handler finds the model under the name getExistingName resolved; before,
# /api/chat (and the /v1 chat paths through it) read the manifest under the name as the
# call spelled it (v0.12.6 server/routes.go:1826 GetModel(req.Model), 0.15.5 :1980
# GetModel(name.String())), so `Qwen3:8B` was a 404 where the store holds `qwen3:8b`.
ANY_SPELLING_SINCE = (0, 15, 5)
# Ollama's answer to a name it cannot parse (server/routes.go:66-75 writeModelRefParseError)
INVALID_MODEL_NAME = "invalid model name"


def _cut_last(text: str, sep: str) -> tuple[str, str, bool]:
    before, found, after = text.rpartition(sep)
    if not found:
        return text, "", False
    return before or _MISSING, after or _MISSING, True


def ollama_name_parts(name: str) -> dict[str, str]:
    """A model name's host, namespace, model and tag as Ollama's ParseName reads them."""
    parts = {"host": "", "namespace": "", "model": "", "tag": ""}
    rest = name
    if rest.rfind(":") > rest.rfind("/"):
        rest, parts["tag"], _ = _cut_last(rest, ":")
    rest, parts["model"], promised = _cut_last(rest, "/")
    if not promised:
        parts["model"] = rest
    else:
        rest, parts["namespace"], promised = _cut_last(rest, "/")
        if not promised:
            parts["namespace"] = rest
        else:
            scheme, sep, host = rest.partition("://")
            parts["host"] = host if sep else scheme
    return {kind: value or _NAME_DEFAULTS.get(kind, "") for kind, value in parts.items()}


def _word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


def valid_name_part(kind: str, part: str) -> bool:
    """Whether Ollama's isValidPart takes `part` as the name's `kind` part."""
    return 1 <= len(part) <= _NAME_LENGTHS[kind] and _word(part[0]) and all(
        c in _NAME_EXTRA[kind] or _word(c) for c in part[1:])


def is_valid_model_name(name: str) -> bool:
    """Whether Ollama's ParseName(name).IsValid() holds."""
    return all(valid_name_part(k, p) for k, p in ollama_name_parts(name).items())


# From 0.18 a name may end in its source (internal/modelref/modelref.go ParseRef):
# `:local` is the model in the store and never a cloud stub; `:cloud`, or a tag ending in
# `-cloud`, is a model Ollama's cloud runs, sent there without a stub in the store
# (server/routes.go:267-272 generate, 2460-2467 chat, cloud_proxy.go for /v1). Before, those
# spellings were names like any other (`x:8b:local` invalid, `x:8b-cloud` a stub's tag).
SOURCE_SUFFIXES_SINCE = (0, 18, 0)
LOCAL_SOURCE, CLOUD_SOURCE = "local", "cloud"
CONFLICTING_SOURCES = "use either :local or :cloud, not both"


@dataclass(frozen=True)
class ModelRef:
    """A model name read for its source: the name without its suffix, and the source the
    suffix asked for ("" none)."""

    base: str
    source: str = ""


def _source_suffix(raw: str) -> tuple[str, str]:
    """modelref.go parseSourceSuffix: the name without its source suffix, and that source."""
    cut = raw.rfind(":")
    if cut < 0:
        return raw, ""
    suffix = raw[cut + 1:].strip()
    if suffix.lower() in (LOCAL_SOURCE, CLOUD_SOURCE):
        return raw[:cut], suffix.lower()
    if "/" not in suffix and suffix.lower().endswith("-" + CLOUD_SOURCE):
        return raw[:cut + 1] + suffix[:-len("-" + CLOUD_SOURCE)], CLOUD_SOURCE
    return raw, ""


def model_ref(name: str) -> ModelRef:
    """The name as Ollama 0.18+ reads its source; ValueError (Ollama's 400) for a name that
    names two sources."""
    raw = name.strip()
    base, source = _source_suffix(raw)
    if source and _source_suffix(base)[1]:
        raise ValueError(f"{CONFLICTING_SOURCES}: {orjson.dumps(raw).decode()}")
    return ModelRef(base, source)


def _read_ref(name: str) -> ModelRef:
    """model_ref, or no source at all for a name asking for two (refused where the engine
    reads sources)."""
    try:
        return model_ref(name)
    except ValueError:
        return ModelRef(name)


def split_source(name: str, reads_source: bool = True) -> tuple[str, str]:
    """The model a call's name places and the source it asks for: a name ending in
    `:local` is placed as the model without it where the engine reads the suffix; a cloud
    name is kept whole (an Ollama before 0.18 knows it as a stub's name)."""
    ref = _read_ref(name)
    if ref.source == LOCAL_SOURCE:
        return (ref.base, LOCAL_SOURCE) if reads_source else (name, "")
    return name, ref.source


def cloud_echo(name: str) -> str:
    """The model a cloud call's answer names: Ollama sends a name with a cloud suffix on
    without it (server/routes.go:267-272), a stub's as it was asked (:361)."""
    ref = _read_ref(name)
    return ref.base if ref.source == CLOUD_SOURCE else name


def normalise_model(name: str) -> str:
    """The name as Ollama's /api/ps shows it (Name.DisplayShortest): the tag filled in,
    the default host and namespace left out, each part spelled as given; a name Ollama
    refuses keeps its spelling, with `:latest` when it names no tag."""
    # A call compares its few names with every listed one (~16 a call, 6 us each); a name
    # longer than Ollama's parts allow is not kept, so callers cannot fill the cache
    return _normalised(name) if len(name) <= CACHED_NAME_CHARS else _normalise(name)


def _normalise(name: str) -> str:
    if not is_valid_model_name(name):
        return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:{DEFAULT_TAG}"
    parts = ollama_name_parts(name)
    prefix = ""
    if parts["host"].lower() != DEFAULT_HOST:
        prefix = f"{parts['host']}/{parts['namespace']}/"
    elif parts["namespace"].lower() != DEFAULT_NAMESPACE:
        prefix = f"{parts['namespace']}/"
    return f"{prefix}{parts['model']}:{parts['tag']}"


CACHED_NAME_CHARS = sum(_NAME_LENGTHS.values()) + 3  # host/namespace/model:tag
_normalised = functools.lru_cache(maxsize=4096)(_normalise)


def model_key(name: str) -> str:
    """What two spellings of one model share (Ollama matches the parts case-insensitively)."""
    return normalise_model(name).lower()


def not_listed(view: ProviderView, model: str) -> bool:
    """The card's catalogue is known and lacks the model: its disk listing now, else the
    one it gave last (an empty one too: an Ollama that lists no model has none). False for
    a card never listed: it may have any model."""
    if view.disk_mib:
        return model not in view.disk_mib
    return (view.listed or bool(view.last_listed)) and model_key(model) not in view.last_listed


def resolve_model(name: str, known: Iterable[str]) -> str:
    """The spelling of `name` among the `known` models (Ollama's getExistingName), else its
    own spelling normalised."""
    key = model_key(name)
    return next((normalise_model(k) for k in known if model_key(k) == key),
                normalise_model(name))


def listing(*names: Iterable[str]) -> frozenset[str]:
    """The keys of the models a card lists (model_key), to ask whether it has one."""
    return frozenset(model_key(n) for group in names for n in group)


@dataclass(frozen=True)
class CallModels:
    """Which models an agent's calls may run: its mulling candidates (best first, as the
    operator ranked them) and the model its triage calls are bound to."""

    mulling: tuple[Candidate, ...] = ()
    triage_model: str | None = None
    # the bound mulling model (KUBEMOOT_MODEL_MODEL), which a call naming no model runs even
    # when the list ranks another first; unset, the list's first stands for it
    preferred: str | None = None

    @property
    def mulling_model(self) -> str | None:
        return self.preferred or (self.mulling[0].model if self.mulling else None)

    def for_call(self, phase: str, model: str | None) -> tuple[Candidate, ...] | None:
        """The candidates of one call, the model it names first; None when it names none
        and none is configured."""
        if phase == "triage":  # its model defaults to the mulling model (CONTRACT.md)
            bound = model or self.triage_model or self.mulling_model
            return (Candidate(self.resolve(bound)),) if bound else None
        model = model or self.preferred
        if model is None:
            return self.mulling or None
        wanted = model_key(model)
        mine = next((c for c in self.mulling if model_key(c.model) == wanted), None)
        if mine is None:
            return (Candidate(self.resolve(model)),)
        return (mine, *(c for c in self.mulling if c is not mine))

    def resolve(self, model: str) -> str:
        """The spelling of `model` among this agent's configured models."""
        known = (*(c.model for c in self.mulling),
                 *filter(None, (self.triage_model, self.preferred)))
        return resolve_model(model, known)


def full_model_name(name: str) -> str:
    """Ollama's full name of a model, as its capability errors spell it (types/model/name.go
    ParseName and Name.String: host `registry.ollama.ai`, namespace `library` and tag
    `latest` filled in): "qwen3:8b" is "registry.ollama.ai/library/qwen3:8b"."""
    if not is_valid_model_name(name):
        return normalise_model(name)
    parts = ollama_name_parts(name)
    return f"{parts['host']}/{parts['namespace']}/{parts['model']}:{parts['tag']}"


def not_found(name: str, embedding: bool = False) -> str:
    """Ollama's 404 for a model it does not have, in the words of the handler: generate's and
    chat's own (server/routes.go:289, 2485), the embedding handlers' a scheduling error with
    the name Go-quoted (handleScheduleError, :3107-3116, from :848-851 and :1066-1070;
    v0.12.6 :2259-2268, from scheduleRunner's GetModel, :121-124, at :654 and :779)."""
    if embedding:
        return f"model {orjson.dumps(name).decode()} not found, try pulling it first"
    return f"model '{name}' not found"
