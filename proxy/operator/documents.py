"""The operator documents' schemas: Model, ModelProvider, CrewSchedulingPolicy, Agent and
MootArchetype as pydantic models, so a wrong type or value is refused with its field path
(`problem()` says it in one line) instead of being coerced by hand.

Fields the scheduling does not read (spec.type, discussRole ...) are ignored;
a known field misspelt (`vramMiB`) is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from proxy.operator import scheduling as s
from proxy.settings import check_endpoint, check_model_name


def _empty_when_null(default: Any) -> BeforeValidator:
    """`labels:` with nothing after it is YAML null: the same as absent."""
    return BeforeValidator(lambda value: default() if value is None else value)


def _label_value(value: Any) -> Any:
    """Kubernetes label values are strings; YAML's unquoted `true` and `32` are read as the
    strings they are written as."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return value


LabelValue = Annotated[str, BeforeValidator(_label_value)]
Labels = Annotated[dict[str, LabelValue], _empty_when_null(dict)]
Name = Annotated[str, Field(min_length=1)]
# Numbers are YAML numbers: a quoted "6000" is a string, which the CRD schema (type: integer)
# refuses at `kubectl apply`; the operator does not take what the cluster would not.
Mib = Annotated[int, Field(ge=0, strict=True)]
Weight = Annotated[float, Field(strict=True)]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_misspelt_field(cls, data: Any) -> Any:
        """Unknown keys are ignored (the CRDs have fields the scheduling does not read), but
        one that is a known field misspelt (`vramMiB`, `matchLabel`) is refused: ignored, its
        value would silently be the default (no VRAM check, no selector)."""
        if isinstance(data, dict):
            for key in data:
                near = misspelt(key, cls.model_fields)
                if near is not None:
                    raise ValueError(f"unknown field {key!r}: did you mean {near!r}?")
        return data


def misspelt(key: Any, fields: Iterable[str]) -> str | None:
    """The known field `key` misspells (case, `_`/`-`, one letter added, dropped, changed or
    two swapped), or None. Closer is not enough: `maxLoadedModels` is no `loadedModels`."""
    known = list(fields)
    if not isinstance(key, str) or key in known or len(key) < 4:
        return None
    return next((name for name in known if _one_slip(_fold(key), _fold(name))), None)


def _fold(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def _one_slip(a: str, b: str) -> bool:
    """At most one edit (insert, delete, substitute, swap of neighbours) apart."""
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) <= 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


class Metadata(_Schema):
    name: Name
    namespace: Name = "default"
    labels: Labels = {}


GROUP = "kubemoot.ai"


class _Document(_Schema):
    # Optional (documents written for this command alone may leave it out); another group
    # (`v1`, a copy from another CRD) is another resource to the cluster, no such kind here
    apiVersion: str | None = None
    metadata: Metadata

    @field_validator("apiVersion")
    @classmethod
    def _our_group(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(f"{GROUP}/"):
            raise ValueError(f"must be {GROUP}/v1alpha1 (this kind's API group is {GROUP})")
        return value


class Requirement(_Schema):
    key: str
    operator: str
    values: Annotated[list[LabelValue], _empty_when_null(list)] = []

    @model_validator(mode="after")
    def _well_formed(self) -> Requirement:
        self.to_core()  # raises SelectorError, a ValueError pydantic reports with the path
        return self

    def to_core(self) -> s.Requirement:
        return s.Requirement(self.key, self.operator, tuple(self.values))


class Selector(_Schema):
    matchLabels: Labels = {}
    matchExpressions: Annotated[list[Requirement], _empty_when_null(list)] = []

    def to_core(self) -> s.Selector:
        return s.Selector(dict(self.matchLabels),
                          tuple(r.to_core() for r in self.matchExpressions))


EmptySelector = Annotated[Selector, _empty_when_null(Selector)]


# -- Model ----------------------------------------------------------------------------------

class ModelSpec(_Schema):
    # What the sidecar takes (KUBEMOOT_MODEL_MODEL, the candidates' `model`): a name Ollama
    # does not read would be printed, and `serve` would refuse the env it is in
    model: Annotated[Name, AfterValidator(check_model_name)]
    providerRef: Name
    vramMib: Mib | None = None  # 0: a CPU model, nothing to check


class ModelStatus(_Schema):
    ready: StrictBool = True  # a Model without status.ready counts as Ready


class ModelDocument(_Document):
    spec: ModelSpec
    status: Annotated[ModelStatus, _empty_when_null(ModelStatus)] = ModelStatus()


# -- ModelProvider --------------------------------------------------------------------------

class LoadedModel(_Schema):
    name: Name
    sizeMiB: Mib | None = None


class Capacity(_Schema):
    # 0, as none: not checked (a CPU provider; a reconciler that has not measured it yet)
    vramTotalMiB: Mib | None = None
    vramUsedMiB: Mib | None = None
    maxParallel: Mib | None = None
    agentCount: Mib = 0
    loadedModels: Annotated[list[LoadedModel], _empty_when_null(list)] = []


class ProviderScheduling(_Schema):
    weight: Weight = 100.0


class ProviderSpec(_Schema):
    endpoint: str = ""

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_http(cls, value: str) -> str:
        # The sidecar's check (KUBEMOOT_MODEL_ENDPOINT is this endpoint): host, port 1-65535
        return check_endpoint(value) if value else value
    scheduling: Annotated[ProviderScheduling, _empty_when_null(ProviderScheduling)] = \
        ProviderScheduling()


class ProviderStatus(_Schema):
    ready: StrictBool = False
    capacity: Annotated[Capacity, _empty_when_null(Capacity)] = Capacity()


class ProviderDocument(_Document):
    spec: Annotated[ProviderSpec, _empty_when_null(ProviderSpec)] = ProviderSpec()
    status: Annotated[ProviderStatus, _empty_when_null(ProviderStatus)] = ProviderStatus()


# -- CrewSchedulingPolicy -------------------------------------------------------------------

class Preference(_Schema):
    weight: Weight = 0.0
    selector: EmptySelector = Selector()


class Rule(_Schema):
    phase: Name
    require: EmptySelector = Selector()
    prefer: Annotated[list[Preference], _empty_when_null(list)] = []


class TopologySpread(_Schema):
    whenUnsatisfiable: Literal["ScheduleAnyway", "DoNotSchedule"] = "ScheduleAnyway"
    topologyKey: str = "provider"
    phaseKeys: Annotated[list[str], _empty_when_null(list)] = []


class PolicySpec(_Schema):
    rules: Annotated[list[Rule], _empty_when_null(list)] = []
    # Values that are not floats in [0, 1] are ignored, as documented (scheduling.parse_bias)
    qualityBias: Labels = {}
    topologySpread: TopologySpread | None = None
    strategy: Literal["spread", "binpack"] = "spread"
    crewRef: str | None = None
    archetypeRef: str | None = None
    candidateTolerance: Annotated[float, Field(ge=0, strict=True)] | None = None

    @field_validator("rules")
    @classmethod
    def _one_rule_per_phase(cls, rules: list[Rule]) -> list[Rule]:
        # Two rules for one phase: the scheduling keeps one of them, and the other is dropped
        # without a word (as contradictory as two Models of one name).
        first: dict[str, int] = {}
        for index, rule in enumerate(rules):
            if rule.phase in first:
                raise ValueError(f"phase {rule.phase!r} has two rules (rules[{first[rule.phase]}]"
                                 f" and rules[{index}]): one rule per phase")
            first[rule.phase] = index
        return rules


class PolicyDocument(_Document):
    spec: PolicySpec


# -- Agent, MootArchetype -------------------------------------------------------------------

class AgentSpec(_Schema):
    capabilities: Annotated[list[str], _empty_when_null(list)] = []
    crewRef: str | None = None


class AgentDocument(_Document):
    spec: Annotated[AgentSpec, _empty_when_null(AgentSpec)] = AgentSpec()


def _phase_name(value: Any) -> Any:
    """A phase is its name, or a mapping with one."""
    return value.get("name") if isinstance(value, dict) else value


class ArchetypeSpec(_Schema):
    phases: Annotated[list[Annotated[Name, BeforeValidator(_phase_name)]],
                      _empty_when_null(list)] = []


class ArchetypeDocument(_Document):
    spec: Annotated[ArchetypeSpec, _empty_when_null(ArchetypeSpec)] = ArchetypeSpec()


SCHEMAS: dict[str, type[_Document]] = {
    "Model": ModelDocument, "ModelProvider": ProviderDocument,
    "CrewSchedulingPolicy": PolicyDocument, "Agent": AgentDocument,
    "MootArchetype": ArchetypeDocument}


# -- one line per problem -------------------------------------------------------------------

def field_path(location: tuple[int | str, ...]) -> str:
    """`spec.rules[0].prefer[1].weight`, as kubectl names a field."""
    out = ""
    for part in location:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def problem(error: ValidationError) -> str:
    """The first problem, named by its field path (more are counted, not listed: fixing the
    first often fixes the rest)."""
    errors = error.errors(include_url=False)
    first = errors[0]
    path = field_path(first["loc"])
    kind = first["type"]
    if kind == "missing":
        text = f"{path} is required"
    elif kind in ("model_type", "dict_type", "model_attributes_type"):
        text = f"{path} must be a mapping (got {_short(first['input'])})"
    elif kind == "list_type":
        text = f"{path} must be a list (got {_short(first['input'])})"
    else:
        message = str(first["msg"]).removeprefix("Value error, ")
        given = first["input"]
        # A whole mapping or list quoted back is noise: the message names what is wrong
        got = "" if isinstance(given, dict | list) else f" (got {_short(given)})"
        text = f"{path}: {message}{got}" if path else message
    more = len(errors) - 1
    return text + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
