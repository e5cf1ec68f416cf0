"""Operator documents and provider states for the binding tests: one agent, two providers,
a 14B model on one and an 8B model on the other, preferred by the weights given."""

from __future__ import annotations

from pathlib import Path

from proxy.service.codec import ProviderState

NAMESPACE, AGENT = "crew", "tooler"


def documents(big: int = 100, small: int = 50, big_provider: str = "gpu-a",
              others: tuple[str, ...] = ()) -> str:
    """`others`: more agents beside AGENT, with the same capabilities."""
    return "".join(f"""\
apiVersion: kubemoot.ai/v1alpha1
kind: Agent
metadata: {{name: {other}, namespace: {NAMESPACE}}}
spec: {{capabilities: [tool-calling]}}
---
""" for other in others) + f"""\
apiVersion: kubemoot.ai/v1alpha1
kind: ModelProvider
metadata: {{name: gpu-a}}
spec: {{endpoint: "http://gpu-a:11434"}}
---
apiVersion: kubemoot.ai/v1alpha1
kind: ModelProvider
metadata: {{name: gpu-b}}
spec: {{endpoint: "http://gpu-b:11434"}}
---
apiVersion: kubemoot.ai/v1alpha1
kind: Model
metadata:
  name: big
  labels: {{size: big, capability/tool-calling: "true"}}
spec: {{model: "qwen3:14b", providerRef: {big_provider}, vramMib: 9300}}
---
apiVersion: kubemoot.ai/v1alpha1
kind: Model
metadata:
  name: small
  labels: {{size: small, capability/tool-calling: "true"}}
spec: {{model: "qwen3:8b", providerRef: gpu-b, vramMib: 5200}}
---
apiVersion: kubemoot.ai/v1alpha1
kind: CrewSchedulingPolicy
metadata: {{name: crew-policy, namespace: {NAMESPACE}}}
spec:
  rules:
    - phase: mulling
      require: {{matchLabels: {{capability/tool-calling: "true"}}}}
      prefer:
        - {{weight: {big}, selector: {{matchLabels: {{size: big}}}}}}
        - {{weight: {small}, selector: {{matchLabels: {{size: small}}}}}}
    - phase: triage
      require: {{matchLabels: {{size: small}}}}
---
apiVersion: kubemoot.ai/v1alpha1
kind: Agent
metadata: {{name: {AGENT}, namespace: {NAMESPACE}}}
spec: {{capabilities: [tool-calling]}}
"""


def write_documents(directory: Path, **weights: object) -> Path:
    """Written as a ConfigMap volume updates: a new file swapped in whole."""
    path = directory / "crew.yaml"
    staged = directory / ".crew.yaml.new"
    staged.write_text(documents(**weights))  # type: ignore[arg-type]
    staged.replace(path)
    return path


def state(name: str, now: float, ready: bool = True, total_mib: int = 24576) -> ProviderState:
    """A provider as the publisher reports it: both models on its disk, none loaded."""
    return ProviderState(name=name, endpoint=f"http://{name}:11434", ready=ready,
                         last_probed_at=now, total_vram_mib=total_mib, max_parallel=2,
                         available_mib={"qwen3:14b": 9300, "qwen3:8b": 5200})
