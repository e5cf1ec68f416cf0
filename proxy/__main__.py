"""Command line: `kubemoot-proxy serve | publish | init-buckets | candidates`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from proxy.settings import ConfigError, Settings, load_settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy.app import build_app
    from proxy.observability.logging import configure_logging

    overrides: dict[str, object] = {}
    fleet = []
    if args.demo:
        from loadtest.ollama_sim import start_fleet
        from loadtest.sim_model import demo_fleet

        fleet = start_fleet(demo_fleet(time_scale=args.demo_time_scale))
        overrides["providers"] = [
            {"name": s.config.name, "endpoint": s.url, "totalVramMiB": s.config.total_vram_mib,
             "contextLength": s.config.default_context(), "maxParallel": s.config.num_parallel}
            for s in fleet
        ]
        overrides.setdefault("model_model", "qwen3:8b")
    if args.listen:
        overrides["listen"] = args.listen
    settings = load_settings(args.config, **overrides)
    _require_something_to_call(settings)
    configure_logging(settings.log_level)
    host, port = settings.listen_host_port
    if fleet:
        _print_demo_banner(settings, fleet)
    uvicorn.run(build_app(settings), host=host, port=port, log_level="warning",
                access_log=False, lifespan="on")
    for server in fleet:
        server.stop()
    return 0


def _require_something_to_call(settings: Settings) -> None:
    if not settings.providers and settings.model_endpoint is None:
        raise ConfigError("KUBEMOOT_PROVIDERS: no providers and no KUBEMOOT_MODEL_ENDPOINT; "
                          "set one (or run `kubemoot-proxy serve --demo` for a simulated fleet)")


def _print_demo_banner(settings: Settings, fleet: Sequence[object]) -> None:
    host, port = settings.listen_host_port
    lines = [f"kubemoot-proxy demo: sidecar on http://{host}:{port} in front of a simulated fleet:"]
    for server in fleet:
        cfg = server.config  # type: ignore[attr-defined]
        lines.append(f"  {cfg.name:<9} {server.url}  {cfg.total_vram_mib} MiB")  # type: ignore[attr-defined]
    lines += [
        "Try it:",
        f"  curl http://{host}:{port}/api/chat -d "
        "'{\"model\":\"qwen3:8b\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'",
        f"  OLLAMA_HOST={host}:{port} python -c \"import ollama; "
        "print(ollama.chat(model='qwen3:14b', messages=[{'role':'user','content':'hi'}]))\"",
        f"  curl http://{host}:{port}/api/ps",
    ]
    print("\n".join(lines), flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubemoot-proxy", description=(
        "GPU-aware scheduling sidecar for Ollama fleets."))
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the sidecar")
    serve.add_argument("--config", help="YAML file with settings (env vars win)")
    serve.add_argument("--listen", help="host:port (default KUBEMOOT_LISTEN, 127.0.0.1:11434)")
    serve.add_argument("--demo", action="store_true",
                       help="start a simulated 3-GPU Ollama fleet on loopback and use it")
    serve.add_argument("--demo-time-scale", type=float, default=0.05,
                       help="speed of the simulated fleet (1.0 = real time)")
    serve.set_defaults(func=_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"kubemoot-proxy: bad configuration: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
