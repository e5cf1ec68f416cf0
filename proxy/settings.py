"""Settings: the only module that reads the environment.

Every name in docs/configuration.md is a field here (prefix ``KUBEMOOT_``). A YAML file given with
``--config`` may set the same keys (``model_model`` or ``KUBEMOOT_MODEL_MODEL``); the
environment wins over the file, so a Deployment can override a mounted ConfigMap.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import socket
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import SplitResult, urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from proxy import strict_yaml
from proxy.core.attention import MIB
from proxy.core.models import model_key, model_ref, ollama_name_parts, valid_name_part
from proxy.ports import ConfigError as ConfigError  # raised here; callers import it here

ENV_PREFIX = "KUBEMOOT_"


def check_model_name(name: str) -> str:
    """`name` if Ollama takes it as a model name (a source suffix aside, `:local` or `:cloud`,
    as 0.18 reads it), else ValueError saying which part is not."""
    base = model_ref(name).base  # (two sources at once: ValueError, Ollama's words)
    for kind, part in ollama_name_parts(base).items():
        if not valid_name_part(kind, part):
            raise ValueError(f"{name!r} is not a model name as Ollama reads one "
                             "([host/][namespace/]model[:tag]; letters, digits, '_', '-' and "
                             f"'.'): its {kind} is not valid")
    return name


def check_endpoint(value: str) -> str:
    """An Ollama server's URL, `http(s)://host[:port]`, without its trailing slash; else
    ValueError saying what is wrong."""
    if not value.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    try:
        parts = urlsplit(value)
        port = parts.port  # (a ValueError when out of 0-65535 or not a number)
    except ValueError as exc:
        raise ValueError(f"is no URL ({exc})") from None
    if not parts.hostname or any(c.isspace() for c in value) or port == 0:
        raise ValueError("is no URL: http(s)://host[:port] with a host, no spaces, "
                         "a port from 1 to 65535")
    return value.rstrip("/")


def same_server(endpoint: str) -> str:
    """An endpoint as the server it reaches: scheme and host in lower case, the default
    port spelled out, no trailing slash."""
    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{port}" \
        f"{parts.path.rstrip('/')}"


class ProviderConfig(BaseModel):
    """One Ollama server (one GPU) the sidecar may place calls on."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True,
                              allow_inf_nan=False)

    name: str = Field(min_length=1)
    endpoint: str = Field(min_length=1)
    total_vram_mib: int | None = Field(default=None, alias="totalVramMiB", gt=0)
    context_length: int | None = Field(default=None, alias="contextLength", ge=0)
    max_parallel: int = Field(default=1, alias="maxParallel", ge=1)
    # OLLAMA_MAX_LOADED_MODELS; 0 (unset) is Ollama's automatic limit, 3 x its GPUs
    max_loaded_models: int = Field(default=0, alias="maxLoadedModels", ge=0)
    gpus: int = Field(default=1, ge=1)  # the GPUs the provider's Ollama runs on
    # OLLAMA_KV_CACHE_TYPE (f16 unless set; before 0.30 only with flash attention on)
    kv_cache_type: Literal["f16", "q8_0", "q4_0"] = Field(default="f16", alias="kvCacheType")
    # OLLAMA_FLASH_ATTENTION; None (unset): Ollama's default for its version and each model;
    # false also for GPUs without flash attention (core/attention.py)
    flash_attention: bool | None = Field(default=None, alias="flashAttention")
    # OLLAMA_GPU_OVERHEAD, in bytes as Ollama takes it: kept free on each GPU (counted_total_mib)
    gpu_overhead_bytes: int = Field(default=0, alias="gpuOverheadBytes", ge=0)
    weight: float = 100.0
    dcgm_url: str | None = Field(default=None, alias="dcgmUrl")

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_http(cls, value: str) -> str:
        return check_endpoint(value)

    @model_validator(mode="after")
    def _overhead_leaves_memory(self) -> ProviderConfig:
        if self.total_vram_mib is not None and \
                self.gpu_overhead_mib * self.gpus >= self.total_vram_mib:
            raise ValueError(f"gpuOverheadBytes ({self.gpu_overhead_bytes}) leaves nothing of "
                             f"totalVramMiB ({self.total_vram_mib}) on {self.gpus} GPU(s)")
        return self

    @property
    def gpu_overhead_mib(self) -> int:
        return -(-self.gpu_overhead_bytes // MIB)

    def counted_total_mib(self, total_mib: int | None) -> int | None:
        """The card's memory as Ollama counts it: OLLAMA_GPU_OVERHEAD off each GPU. Its default
        context reads this total (v0.24.0 server/routes.go:1899-1902), and before 0.30 each
        load's layout keeps the overhead free (llm/server.go:1004; v0.12.6 llm/memory.go:324,
        349); from 0.30 the sidecar keeps it free too, as the operator set it to be."""
        if total_mib is None:
            return None
        return max(0, total_mib - self.gpu_overhead_mib * self.gpus)

    @field_validator("dcgm_url")
    @classmethod
    def _dcgm_url(cls, value: str | None) -> str | None:
        # A URL the exporter cannot be asked at (`dcgm-exporter:9400/metrics`, no scheme)
        # left the card's total unknown at every probe, without a word.
        return check_endpoint(value) if value else None


class CandidateModel(BaseModel):
    """One entry of a phase's candidate list, as the operator publishes it."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True,
                              allow_inf_nan=False)

    model: str = Field(min_length=1)
    score: float  # the model's quality score: the operator publishes one for every entry
    vram_mib: int | None = Field(default=None, alias="vramMib", ge=0)

    @model_validator(mode="before")
    @classmethod
    def _scored(cls, value: Any) -> Any:
        # Said with the entry's model: pydantic's own "score: Field required" names neither
        if isinstance(value, dict) and "score" not in value and isinstance(
                value.get("model"), str):
            raise ValueError(f"the entry for {value['model']!r} has no score (each entry is "
                             '{"model", "score", "vramMib"?}, as the operator publishes it)')
        return value

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str) -> str:
        return check_model_name(value)


def _parse_json_or_file(value: Any, setting: str) -> Any:
    """Inline JSON, or a path to a YAML/JSON file."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return []
    if text[0] in "[{":
        try:
            return json.loads(text, object_pairs_hook=_keys_once)
        except json.JSONDecodeError as exc:
            raise ValueError(f"is not valid JSON ({exc.msg} at char {exc.pos})") from exc
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"is neither inline JSON nor a readable file: {text!r}")
    try:
        return strict_yaml.load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"file {text} is not valid YAML/JSON: {yaml_problem(exc)}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"file {text} cannot be read: {unreadable(exc)}") from None


def unreadable(exc: OSError | UnicodeDecodeError) -> str:
    """Why a file could not be read, in a few words."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.start})"
    return exc.strerror or str(exc)


def _keys_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (as a file's YAML must have them)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"is not valid JSON (key {key!r} is given twice in one object)")
        seen[key] = value
    return seen


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one line: what is wrong, and where."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = f" ({exc.context})" if exc.context else ""
        return f"{exc.problem}{where}{context}"
    return " ".join(str(exc).split())


_config_file: ContextVar[Path | None] = ContextVar("kubemoot_config_file", default=None)


class _YamlFileSource(PydanticBaseSettingsSource):
    """Values from the ``--config`` YAML file; keys with or without the env prefix."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole mapping

    def __call__(self) -> dict[str, Any]:
        path = _config_file.get()
        if path is None:
            return {}
        try:
            data = strict_yaml.load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"--config {path}: not valid YAML: {yaml_problem(exc)}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--config {path}: cannot read: {unreadable(exc)}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--config {path}: top level must be a mapping")
        out: dict[str, Any] = {}
        for key, value in data.items():
            name = str(key).lower()
            if name.startswith(ENV_PREFIX.lower()):
                name = name[len(ENV_PREFIX) :]
            out[name] = value
        return out


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True,
                                      allow_inf_nan=False)

    # The agent pod's model settings (docs/configuration.md).
    model_model: str | None = None
    model_endpoint: str | None = None
    model_candidates_mulling: Annotated[list[CandidateModel], NoDecode] = []
    model_candidates_triage: Annotated[list[CandidateModel], NoDecode] = []
    triage_model_model_id: str | None = None
    triage_model_endpoint: str | None = None
    model_candidate_tolerance: float = 10.0
    discuss_gpu_wait_limit_seconds: float = 0.0
    discuss_synthesis_timeout_seconds: float = Field(default=90.0, gt=0)
    # (not empty: `<namespace>/<agent>` names this sidecar's tickets and its binding)
    namespace: str = Field(default="default", min_length=1)
    agent_name: str = Field(default_factory=socket.gethostname, min_length=1)
    crew: str | None = None

    # Settings this project adds.
    listen: str = "127.0.0.1:11434"
    ops_listen: str | None = None  # /metrics, /healthz, /readyz and the status page
    providers: Annotated[list[ProviderConfig], NoDecode] = []
    nats_url: str | None = None
    nats_creds: Path | None = None
    nats_user: str | None = None
    nats_password: str | None = Field(default=None, repr=False)
    nats_token: str | None = Field(default=None, repr=False)
    nats_tls_ca: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    # Copies of every bucket on the cluster; None: 3 when it has at least 3 servers, else 1
    nats_replicas: int | None = Field(default=None, ge=1, le=5)
    role: Literal["specialist", "coordinator"] = "specialist"
    max_request_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    connect_timeout_seconds: float = Field(default=3.0, gt=0)
    first_byte_timeout_seconds: float = Field(default=180.0, gt=0)
    chunk_timeout_seconds: float = Field(default=60.0, gt=0)
    answer_timeout_seconds: float = Field(default=900.0, gt=0)
    probe_interval_seconds: float = Field(default=2.0, gt=0)
    state_stale_seconds: float = Field(default=15.0, gt=0)
    ticket_ttl_seconds: float = Field(default=60.0, ge=5)
    max_plans: int = Field(default=4, ge=0)  # held plans per agent (this sidecar)
    # Share of the fleet's usable memory that loads held for plans may take, all agents'
    plan_memory_share: float = Field(default=0.5, ge=0, le=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # CORS origins beyond Ollama's own (localhost, 127.0.0.1, 0.0.0.0, app://, file://, ...),
    # comma-separated, `*` a wildcard, as OLLAMA_ORIGINS
    origins: Annotated[list[str], NoDecode] = []

    @field_validator("model_candidates_mulling", "model_candidates_triage", mode="before")
    @classmethod
    def _candidates(cls, value: Any) -> Any:
        return _parse_json_or_file(value, "candidates")

    @field_validator("model_candidates_mulling", "model_candidates_triage")
    @classmethod
    def _one_entry_per_model(cls, value: list[CandidateModel]) -> list[CandidateModel]:
        # Two entries of one model (as Ollama matches names) would give it two scores.
        seen: dict[str, str] = {}
        for entry in value:
            key = model_key(entry.model)
            if key in seen:
                raise ValueError(f"{entry.model!r} is listed twice (also as {seen[key]!r}); "
                                 "one entry per model")
            seen[key] = entry.model
        return value

    @field_validator("providers", mode="before")
    @classmethod
    def _providers(cls, value: Any) -> Any:
        return _parse_json_or_file(value, "providers")

    @field_validator("providers")
    @classmethod
    def _unique_provider_names(cls, value: list[ProviderConfig]) -> list[ProviderConfig]:
        names = [p.name for p in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate provider name(s): {', '.join(duplicates)}")
        # One Ollama under two names would have its GPU's memory counted twice: loads placed
        # "beside" each other on one card, which Ollama spills or evicts.
        by_server: dict[str, str] = {}
        for provider in value:
            server = same_server(provider.endpoint)
            if server in by_server:
                raise ValueError(f"providers {by_server[server]!r} and {provider.name!r} "
                                 f"have one endpoint ({provider.endpoint}): one Ollama is "
                                 "one provider")
            by_server[server] = provider.name
        return value

    @field_validator("model_model", "triage_model_model_id")
    @classmethod
    def _model_names(cls, value: str | None) -> str | None:
        return check_model_name(value) if value else value

    @field_validator("model_endpoint", "triage_model_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        return check_endpoint(value)

    @field_validator("origins", mode="before")
    @classmethod
    def _origins(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [o.strip() for o in value.split(",") if o.strip()]
        return value

    @field_validator("origins")
    @classmethod
    def _each_an_origin(cls, value: list[str]) -> list[str]:
        # Ollama refuses to start on such an entry too: gin-contrib/cors panics with
        # "bad origin" (config.go Validate), called from server/routes.go:1872.
        for origin in value:
            if not ORIGIN.fullmatch(origin):
                raise ValueError(f"{origin!r} is not an origin: use scheme://host[:port] "
                                 "(`*` a wildcard within the host, like "
                                 "https://*.example.com), or `*` alone for every origin")
        return value

    @field_validator("nats_url")
    @classmethod
    def _nats_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        nats_servers(value)
        return value

    @field_validator("listen", "ops_listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value:
            parse_listen(value)
        return value or None

    @field_validator("listen", "namespace", "agent_name", mode="before")
    @classmethod
    def _empty_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        # A manifest's `value: ""` (an unset chart value) means unset, as for the other
        # settings: the default, not a refusal (nor an empty identity or address).
        if isinstance(value, str) and not value.strip():
            field = cls.model_fields[str(info.field_name)]
            return field.get_default(call_default_factory=True)
        return value

    @field_validator("nats_password")
    @classmethod
    def _password_with_a_user(cls, value: str | None, info: ValidationInfo) -> str | None:
        # nats-py sends a password only with a user: alone it was silently left out, and
        # the connect went without credentials.
        if value and not info.data.get("nats_user"):
            raise ValueError("set without KUBEMOOT_NATS_USER (a password goes with a user; "
                             "a token alone is KUBEMOOT_NATS_TOKEN)")
        return value or None

    @field_validator("nats_creds", "nats_tls_ca", "nats_tls_cert", "nats_tls_key",
                     mode="before")
    @classmethod
    def _empty_path_is_unset(cls, value: Any) -> Any:
        # An empty value (an optional Secret's key absent, `value: ""`) is no file: as
        # unset, not Path("") read as the working directory.
        return None if isinstance(value, str) and not value.strip() else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlFileSource(settings_cls))

    # Derived values the rest of the program asks for.
    @property
    def listen_host_port(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    @property
    def triage_model(self) -> str | None:
        return self.triage_model_model_id or self.model_model

    @property
    def triage_endpoint(self) -> str | None:
        return self.triage_model_endpoint or self.model_endpoint

    @property
    def tolerance(self) -> float:
        return max(0.0, self.model_candidate_tolerance)

    @property
    def wait_limit_seconds(self) -> float:
        limit = self.discuss_gpu_wait_limit_seconds
        return limit if limit > 0 else self.discuss_synthesis_timeout_seconds


# What a browser sends as Origin: a scheme and a host (and port), no path; `*` stands for any
# run of characters within the host, and alone for every origin (OLLAMA_ORIGINS=*).
ORIGIN = re.compile(r"\*|[a-z][a-z0-9+.-]*://[^/?#\s,]+", re.IGNORECASE)


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` into (host, port)."""
    if "://" in value:
        raise ValueError(f"expected host:port without a scheme (like 127.0.0.1:11434), got "
                         f"{value!r}")
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected host:port, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"port is not a number in {value!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range in {value!r}")
    return host, port


# The schemes nats-py connects with (nats/aio/client.py _parse_server_uri); an entry without
# one is nats://. ws and wss leave the port to the scheme, the others default it to 4222.
NATS_SCHEMES = ("nats", "tls", "ws", "wss")
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?", re.IGNORECASE)


def nats_servers(value: str) -> list[SplitResult]:
    """The servers of a `KUBEMOOT_NATS_URL`, comma-separated, each `[scheme://][user[:password]
    @]host[:port]`; ValueError naming the entry (its credentials left out) when one is no URL
    nats-py can connect to. nats-py itself would take a mistyped scheme for a host name and
    wait for it without end, and fail on a bad port with a traceback."""
    servers = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            raise ValueError("an empty entry in the comma-separated list")
        scheme, has_scheme, _ = entry.partition("://")
        shown = repr(_without_userinfo(entry))
        if has_scheme and scheme not in NATS_SCHEMES:  # (lower case: nats-py reads no other)
            raise ValueError(f"{shown}: the scheme must be nats://, tls://, ws:// or wss://")
        parts = urlsplit(entry if has_scheme else f"nats://{entry}")
        host = parts.hostname or ""
        if not (_HOST_NAME.fullmatch(host) or _ip_address(host)):
            raise ValueError(f"{shown}: no valid host name in it")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{shown}: the port must be a number from 1 to 65535") from None
        if port == 0:
            raise ValueError(f"{shown}: the port must be a number from 1 to 65535")
        servers.append(parts)
    websocket = {p.scheme in ("ws", "wss") for p in servers}
    if len(websocket) > 1:  # nats-py refuses such a list
        raise ValueError("websocket (ws://, wss://) and other servers mixed in one list")
    return servers


def _without_userinfo(entry: str) -> str:
    """A server URL as given, any `user:password@` replaced, fit for an error line."""
    head, at, address = entry.rpartition("@")
    if not at:
        return entry
    scheme, has_scheme, _ = head.partition("://")
    return f"{scheme}://***@{address}" if has_scheme and scheme.isalpha() else f"***@{address}"


def _ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def describe_validation_error(exc: ValidationError) -> str:
    """The first error as one line naming the setting the way an operator spells it."""
    err = exc.errors()[0]
    loc = list(err.get("loc", ()))
    name = f"{ENV_PREFIX}{str(loc[0]).upper()}" if loc else "settings"
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
    message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{name}{path}: {message}"


# Kubernetes' service links (a Service named kubemoot* puts these into every container unless
# the pod sets enableServiceLinks: false): each name's shape with its value's, so that a typo
# such as KUBEMOOT_PORT=8080 is still warned of.
_LINK = "KUBEMOOT_(?:[A-Z0-9_]+_)?"
_ADDRESS = r"[0-9a-fA-F.:]+"  # an IPv4 or IPv6 address
SERVICE_LINKS = tuple((re.compile(_LINK + name), re.compile(value)) for name, value in (
    ("SERVICE_HOST", _ADDRESS),
    ("SERVICE_PORT(?:_[A-Z0-9_]+)?", r"\d+"),
    (r"PORT(?:_\d+_(?:TCP|UDP|SCTP))?", r"(?:tcp|udp|sctp)://\S+"),
    (r"PORT_\d+_(?:TCP|UDP|SCTP)_PROTO", "tcp|udp|sctp"),
    (r"PORT_\d+_(?:TCP|UDP|SCTP)_PORT", r"\d+"),
    (r"PORT_\d+_(?:TCP|UDP|SCTP)_ADDR", _ADDRESS)))


def service_link(name: str, value: str) -> bool:
    return any(n.fullmatch(name) and v.fullmatch(value) for n, v in SERVICE_LINKS)


@dataclass(frozen=True)
class UnknownSetting:
    """A name that looks like a setting and is none, with the known one it is closest to."""

    name: str
    source: str  # "environment", or "--config <path>"
    did_you_mean: str | None

    def __str__(self) -> str:
        hint = f"; did you mean {self.did_you_mean}?" if self.did_you_mean else ""
        return f"{self.name} ({self.source}) is not a setting and is ignored{hint}"


def _closest(name: str, known: list[str]) -> str | None:
    return next(iter(difflib.get_close_matches(name, known, n=1, cutoff=0.75)), None)


def unknown_settings(config_file: str | Path | None = None,
                     environ: Mapping[str, str] = os.environ) -> list[UnknownSetting]:
    """The `KUBEMOOT_*` environment names and `--config` keys that name no setting (a typo
    would otherwise silently leave the default), service links aside."""
    fields = list(Settings.model_fields)
    known_env = [f"{ENV_PREFIX}{f.upper()}" for f in fields]
    found = [UnknownSetting(name, "environment", _closest(name.upper(), known_env))
             for name in sorted(environ) if name.upper().startswith(ENV_PREFIX)
             and name.upper() not in known_env
             and not service_link(name.upper(), environ[name].strip())]
    return found + _unknown_keys(Path(config_file), fields, known_env) if config_file else found


def _unknown_keys(path: Path, fields: list[str], known_env: list[str]) -> list[UnknownSetting]:
    try:
        data = strict_yaml.load(path.read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []  # load_settings has said why already
    keys: Iterable[Any] = data if isinstance(data, dict) else ()
    found = []
    for key in map(str, keys):
        prefixed = key.upper().startswith(ENV_PREFIX)
        name = key.lower().removeprefix(ENV_PREFIX.lower())
        if name not in fields:
            hint = _closest(key.upper(), known_env) if prefixed else _closest(name, fields)
            found.append(UnknownSetting(key, f"--config {path}", hint))
    return found


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from env (and an optional YAML file); ConfigError on bad input."""
    if config_file is not None and not str(config_file).strip():
        # (`--config "$CONFIG"` with CONFIG unset: not the same as no --config at all)
        raise ConfigError("--config: an empty path")
    path = Path(config_file) if config_file else None
    if path is not None and not path.is_file():
        what = "a directory, not a file" if path.is_dir() else "no such file"
        raise ConfigError(f"--config {path}: {what}")
    token = _config_file.set(path)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from None
    finally:
        _config_file.reset(token)
