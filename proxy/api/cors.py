"""CORS as Ollama answers it (envconfig.AllowedOrigins, server/routes.go): browsers on
localhost, 127.0.0.1 and 0.0.0.0 (any port, http or https), app://, file://, tauri:// and VS
Code webviews, plus the operator's KUBEMOOT_ORIGINS (browser extensions only when named
there, `chrome-extension://*`, as Ollama wants them in OLLAMA_ORIGINS); the headers Ollama
allows, and the sidecar's own X-Kubemoot-* request and answer headers."""

from __future__ import annotations

import re
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.api.errors import Dialect, dialect_of, error_response

LOCAL_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0")
SCHEMES = ("app", "file", "tauri", "vscode-webview", "vscode-file")
ALLOWED_HEADERS = ("Authorization", "Content-Type", "User-Agent", "Accept", "X-Requested-With",
                   "OpenAI-Beta", "x-stainless-arch", "x-stainless-async",
                   "x-stainless-custom-poll-interval", "x-stainless-helper-method",
                   "x-stainless-lang", "x-stainless-os", "x-stainless-package-version",
                   "x-stainless-poll-helper", "x-stainless-retry-count",
                   "x-stainless-runtime", "x-stainless-runtime-version", "x-stainless-timeout",
                   "anthropic-version", "anthropic-beta", "x-api-key",
                   "X-Kubemoot-Phase", "X-Kubemoot-Wait", "X-Kubemoot-Thread")
EXPOSED_HEADERS = ("X-Kubemoot-Provider", "X-Kubemoot-Model", "X-Kubemoot-Placement",
                   "X-Kubemoot-Waited-Ms", "X-Kubemoot-Evicted", "Retry-After")


def origin_pattern(extra: Iterable[str]) -> str:
    """One regular expression for every allowed origin; `*` in an origin matches any run of
    characters but a slash (so `http://*.example.com` cannot reach into a path), and `*`
    alone every origin (gin-contrib/cors's AllowAllOrigins, as OLLAMA_ORIGINS=* does)."""
    wildcards = [f"{scheme}://{host}" for host in LOCAL_HOSTS for scheme in ("http", "https")]
    wildcards += [f"{scheme}://{host}:*" for host in LOCAL_HOSTS for scheme in ("http", "https")]
    wildcards += [f"{scheme}://*" for scheme in SCHEMES]
    wildcards += list(extra)
    parts = (".+" if w == "*" else re.escape(w).replace(r"\*", "[^/]*") for w in wildcards)
    return "(?:" + "|".join(parts) + ")"


MAX_ORIGIN_CHARS = 256  # longer is no origin a browser sends; the pattern never sees it


class OllamaCors(CORSMiddleware):
    def __init__(self, app: ASGIApp, extra_origins: Iterable[str] = ()) -> None:
        super().__init__(app, allow_origin_regex=origin_pattern(extra_origins),
                         allow_methods=("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD",
                                        "OPTIONS"),
                         allow_headers=ALLOWED_HEADERS, expose_headers=EXPOSED_HEADERS,
                         max_age=12 * 3600)

    def is_allowed_origin(self, origin: str) -> bool:
        return len(origin) <= MAX_ORIGIN_CHARS and super().is_allowed_origin(origin)

    async def simple_response(self, scope: Scope, receive: Receive, send: Send,
                              request_headers: Headers) -> None:
        """Any other request from an origin not allowed is refused too, as gin-contrib/cors
        aborts it with 403 (cors.go applyCors); one from the page's own host is not a
        cross-origin call, and one without an Origin (a client that is no browser,
        kubelet, Prometheus) is left alone."""
        origin = request_headers.get("origin")
        if origin is None or self.is_allowed_origin(origin) or \
                origin in same_host_origins(request_headers.get("host", "")):
            await super().simple_response(scope, receive, send, request_headers)
            return
        await refused_origin(origin, dialect_of(scope["path"]))(scope, receive, send)

    def preflight_response(self, request_headers: Headers) -> Response:
        """A preflight from an origin not allowed is 403 with no CORS headers, as Ollama's
        gin-contrib/cors answers it (server/routes.go:1842-1872); any other refusal is a 400,
        both in the sidecar's error shape rather than Starlette's plain text."""
        origin = request_headers["origin"]
        if not self.is_allowed_origin(origin):
            return refused_origin(origin)
        answer = super().preflight_response(request_headers)
        if answer.status_code < 400:
            return answer
        refused = error_response(400, "bad-request", f"CORS preflight refused: "
                                 f"{bytes(answer.body).decode()}")
        refused.headers.update({k: v for k, v in answer.headers.items()
                                if k.startswith("access-control-") or k == "vary"})
        return refused


def same_host_origins(host: str) -> tuple[str, ...]:
    return (f"http://{host}", f"https://{host}") if host else ()


def refused_origin(origin: str, dialect: Dialect = "ollama") -> Response:
    """403 with no CORS headers: the browser then shows the page nothing of the answer."""
    return error_response(403, "origin-not-allowed",
                          f"origin {origin[:MAX_ORIGIN_CHARS]!r} may not call the sidecar "
                          "from a browser; allow it with KUBEMOOT_ORIGINS", dialect=dialect)
