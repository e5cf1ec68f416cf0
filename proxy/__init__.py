"""kubemoot-proxy: a GPU-aware scheduling sidecar that speaks Ollama's API."""

__version__ = "0.1.0"
