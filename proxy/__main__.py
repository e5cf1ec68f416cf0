"""Command line: `kubemoot-proxy serve | publish | init-buckets | candidates | bind`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import math
import os
import socket
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult

from proxy import __version__
from proxy.settings import (
    ConfigError,
    Settings,
    load_settings,
    nats_servers,
    parse_listen,
    unknown_settings,
)


def _warn_unknown_settings(config_file: str | None) -> None:
    """One warning per name that looks like a setting and is none (after logging is set up,
    so the warnings come in the log's own format)."""
    from proxy.observability.logging import get_logger

    log = get_logger("kubemoot.settings")
    for unknown in unknown_settings(config_file):
        log.warning(str(unknown), setting=unknown.name, source=unknown.source,
                    did_you_mean=unknown.did_you_mean)


def _serve(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {}
    fleet = []
    if args.demo:
        start_fleet, demo_fleet = _simulator()
        fleet = start_fleet(demo_fleet(time_scale=args.demo_time_scale))
        overrides["providers"] = [s.config.provider_entry(s.url) for s in fleet]
        overrides.setdefault("model_model", "qwen3:8b")
    try:
        if args.listen:
            _check_listen_flag(args.listen)
            overrides["listen"] = args.listen
        settings = load_settings(args.config, **overrides)
        _require_something_to_call(settings)
        if settings.nats_url:  # settings NATS refuses are bad configuration, not an outage
            from proxy.adapters.nats_kv import check_nats
            from proxy.app import nats_options

            check_nats(nats_options(settings))
        # Bound before anything is printed: an address in use is a one-line error.
        sockets = [_bind("--listen" if args.listen else "KUBEMOOT_LISTEN", settings.listen)]
        if settings.ops_listen:
            sockets.append(_bind("KUBEMOOT_OPS_LISTEN", settings.ops_listen))
    except ConfigError:
        for server in fleet:
            server.stop()
        raise
    # The web stack is imported once the settings are good (~1 s of CPU a configuration
    # error need not spend)
    from proxy.api.protocol import listener
    from proxy.app import build_app
    from proxy.observability.logging import configure_logging

    configure_logging(settings.log_level)
    print(_startup_line(settings), flush=True)
    _warn_unknown_settings(args.config)
    if fleet:
        _print_demo_banner(settings, fleet)
    app = build_app(settings)
    # Everything built so far lives as long as the process: move it out of the collector's
    # sight, so a full collection scans only what calls allocate (~2 ms, not ~30 ms with
    # every call in flight stalled behind it).
    gc.collect()
    gc.freeze()
    host, port = settings.listen_host_port
    servers = [(listener(app, host, port, "on"), sockets[0])]
    if settings.ops_listen:
        from proxy.app import build_ops_app

        ops_host, ops_port = parse_listen(settings.ops_listen)
        servers.append((listener(build_ops_app(app), ops_host, ops_port, "off"), sockets[1]))
    _run(_serve_all(servers))
    for server in fleet:
        server.stop()
    return 0


def _positive(text: str) -> float:
    """A finite number above 0: an interval of 0 would spin the loop it paces, a
    concurrency factor of 0 would bind nothing."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is no number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a number above 0")
    return value


def _mib(text: str) -> int:
    """A memory figure: a whole number of MiB, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is no whole number of MiB") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is below 0")
    return value


def _check_listen_flag(address: str) -> None:
    """A bad --listen is named as the flag, not as the setting it overrides."""
    try:
        parse_listen(address)
    except ValueError as exc:
        raise ConfigError(f"--listen: {exc}") from None


def _bind(setting: str, address: str) -> socket.socket:
    host, port = parse_listen(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        # (a host that does not resolve: getaddrinfo's errno is negative, strerror says it)
        reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else \
            (exc.strerror or str(exc)).split(" (while attempting")[0]
        raise ConfigError(f"{setting}: cannot listen on {address}: {reason}") from None


def _startup_line(settings: Settings) -> str:
    """Where the sidecar listens, what it places calls on and where its state lives (no
    credentials: a NATS URL's user and password are left out)."""
    host, port = settings.listen_host_port
    where = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    ops = f", ops on {settings.ops_listen}" if settings.ops_listen else ""
    targets = f"{len(settings.providers)} providers" if settings.providers else \
        "the static endpoint"
    if settings.nats_url:
        servers = ", ".join(map(_without_credentials, nats_servers(settings.nats_url)))
        state = f"shared state in NATS at {servers}"
    else:
        state = "embedded state (this process only)"
    return f"kubemoot-proxy {__version__} listening on {where}{ops}: {targets}, {state}"


def _without_credentials(parts: SplitResult) -> str:
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return parts._replace(netloc=netloc).geturl()


def _simulator() -> tuple[Any, Any]:
    """The simulated fleet of `--demo`, which the product does not ship: loadtest/ beside
    proxy/ in a source checkout, else the kubemoot-proxy-demo distribution built from it."""
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "loadtest" / "ollama_sim.py").is_file():
        package = "loadtest"
        if str(checkout) not in sys.path:  # the console script of an editable install
            sys.path.insert(0, str(checkout))
    else:
        package = "kubemoot_proxy_demo"
    try:
        ollama_sim = importlib.import_module(f"{package}.ollama_sim")
        sim_model = importlib.import_module(f"{package}.sim_model")
    except ModuleNotFoundError as exc:
        if exc.name not in (package, f"{package}.ollama_sim", f"{package}.sim_model"):
            raise  # the simulator is there, one of its dependencies is not
        raise ConfigError('--demo: the simulated fleet is not installed: pip install '
                          '"kubemoot-proxy[demo]" (from a source checkout: pip install '
                          './loadtest, or run `make demo` there)') from None
    return ollama_sim.start_fleet, sim_model.demo_fleet


def _run(main: Coroutine[Any, Any, None]) -> None:
    """uvloop when installed (uvicorn[standard] brings it), else the default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


async def _serve_all(servers: list[tuple[Any, socket.socket]]) -> None:
    await asyncio.gather(*(server.serve(sockets=[sock]) for server, sock in servers))


def _require_something_to_call(settings: Settings) -> None:
    if not settings.providers and settings.model_endpoint is None:
        raise ConfigError("KUBEMOOT_PROVIDERS: no providers and no KUBEMOOT_MODEL_ENDPOINT; "
                          "set one (or run `kubemoot-proxy serve --demo` for a simulated fleet)")


def _print_demo_banner(settings: Settings, fleet: Sequence[object]) -> None:
    host, port = settings.listen_host_port
    lines = [f"kubemoot-proxy demo: sidecar on http://{host}:{port} in front of a simulated fleet:"]
    for server in fleet:
        cfg = server.config  # type: ignore[attr-defined]
        context = cfg.context_length or f"default ({cfg.default_context()})"
        lines.append(f"  {cfg.name:<9} {server.url}  {cfg.total_vram_mib} MiB, context "  # type: ignore[attr-defined]
                     f"{context} x {cfg.num_parallel} slots, KV {cfg.kv_cache_type}")
    lines += [
        "Try it:",
        f"  curl http://{host}:{port}/api/chat -d "
        "'{\"model\":\"qwen3:8b\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'",
        *([] if importlib.util.find_spec("ollama") else
          [f"  {sys.executable} -m pip install ollama   # the client, for the next line"]),
        f"  OLLAMA_HOST={host}:{port} {sys.executable} -c \"import ollama; "
        "print(ollama.chat(model='qwen3:14b', messages=[{'role':'user','content':'hi'}]))\"",
        f"  curl http://{host}:{port}/api/ps",
    ]
    print("\n".join(lines), flush=True)


def _init_buckets(args: argparse.Namespace) -> int:
    settings = load_settings(args.config, **({"nats_url": args.nats_url} if args.nats_url
                                             else {}))
    if not settings.nats_url:
        raise ConfigError("KUBEMOOT_NATS_URL: required for init-buckets")
    from proxy.adapters.nats_kv import (
        connect_client,
        default_replicas,
        ensure_buckets,
        reason_of,
        replicas_refusal,
    )
    from proxy.app import nats_options
    from proxy.observability.logging import configure_logging

    configure_logging(settings.log_level)
    _warn_unknown_settings(args.config)

    async def run() -> list[str]:
        nc = await connect_client(nats_options(settings))
        try:
            await asyncio.sleep(0.2)  # the server's INFO names the cluster's other servers
            replicas = settings.nats_replicas or default_replicas(nc)
            return await ensure_buckets(nc.jetstream(), replicas=replicas,
                                        keep_more=settings.nats_replicas is None)
        finally:
            await nc.close()

    try:
        for line in asyncio.run(run()):
            print(line)
    except Exception as exc:  # connection and JetStream errors alike: one clear line
        # (refused by the server, as refused credentials are: exit 1, the setting named)
        said = replicas_refusal(exc, settings.nats_replicas) or reason_of(exc)
        print(f"kubemoot-proxy init-buckets: {said}", file=sys.stderr)
        return 1
    return 0


def _publish(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    if not settings.nats_url:
        raise ConfigError("KUBEMOOT_NATS_URL: required for publish")
    if not settings.providers:
        raise ConfigError("KUBEMOOT_PROVIDERS: publish needs at least one provider")
    from proxy.adapters.dcgm import DcgmExporter
    from proxy.adapters.nats_kv import NatsStore
    from proxy.adapters.ollama import OllamaClient
    from proxy.app import nats_options
    from proxy.observability.logging import configure_logging
    from proxy.ports import StoreUnavailable
    from proxy.service.prober import PROBE_TIMEOUT_S, Prober

    configure_logging(settings.log_level)
    _warn_unknown_settings(args.config)

    async def run() -> int:
        store = NatsStore(nats_options(settings))
        try:
            await store.start()
        except StoreUnavailable as exc:
            print(f"kubemoot-proxy publish: {exc}", file=sys.stderr)
            return 1
        clients = {p.name: OllamaClient(p.endpoint) for p in settings.providers}
        prober = Prober(settings.providers, clients, store,
                        gpu_memory=DcgmExporter(PROBE_TIMEOUT_S), write_every_s=args.interval)
        try:
            if args.once:
                for state in await prober.round(force=True):
                    print(f"{state.name}: ready={state.ready} "
                          f"loaded={sorted(state.loaded_mib)}")
                return 0
            await prober.run(min(1.0, args.interval), lambda: list(prober.configs))
            return 0
        finally:
            for client in clients.values():
                await client.close()
            await store.close()

    return asyncio.run(run())


def _candidates(args: argparse.Namespace) -> int:
    from proxy.operator import candidates
    from proxy.operator.scheduling import Options

    return candidates.command(args.file, args.output, args.strict,
                              Options(args.eviction_overhead_mib, args.concurrency_factor))


def _bind_command(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    if not settings.nats_url:
        raise ConfigError("KUBEMOOT_NATS_URL: required for bind")
    from proxy.adapters.nats_bus import NatsBus
    from proxy.adapters.nats_kv import NatsStore
    from proxy.app import nats_options
    from proxy.observability.logging import configure_logging
    from proxy.operator.binder import Binder, BinderTiming, DocumentSource, paths_exist
    from proxy.operator.scheduling import Options
    from proxy.ports import BINDINGS, BUCKETS, PROVIDER_STATE, StoreUnavailable

    missing = paths_exist(args.file)
    if missing:
        raise ConfigError(f"-f {missing[0]}: no such file or directory")
    configure_logging(settings.log_level)
    _warn_unknown_settings(args.config)
    source = DocumentSource(args.file)
    source.poll()
    if source.docs is None:
        print(f"kubemoot-proxy bind: {source.error}", file=sys.stderr)
        return 2
    timing = BinderTiming(poll_s=args.poll_interval, stale_s=settings.state_stale_seconds,
                          thread_ttl_s=args.thread_ttl)

    async def run() -> int:
        store = NatsStore(nats_options(settings),
                          tuple(b for b in BUCKETS if b.name in (PROVIDER_STATE, BINDINGS)),
                          replicas=settings.nats_replicas)
        bus = NatsBus()
        store.on_connect.append(bus.attach)
        try:
            await store.start()
        except StoreUnavailable as exc:
            print(f"kubemoot-proxy bind: {exc}", file=sys.stderr)
            await store.close()
            return 1
        binder = Binder(store, bus, source, Options(args.eviction_overhead_mib,
                                                    args.concurrency_factor), timing)
        try:
            await binder.run()
        finally:
            await store.close()
        return 0

    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(run())
    return 0


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

    publish = sub.add_parser("publish", help="probe every provider and publish its state")
    publish.add_argument("--config", help="YAML file with settings (env vars win)")
    publish.add_argument("--once", action="store_true", help="one round, then exit")
    publish.add_argument("--interval", type=_positive, default=5.0,
                         help="seconds between writes when nothing changed (default 5); "
                              "changes are written at the next probe, within 1 s")
    publish.set_defaults(func=_publish)

    init = sub.add_parser("init-buckets", help="create the KV buckets (idempotent)")
    init.add_argument("--config", help="YAML file with settings (env vars win)")
    init.add_argument("--nats-url", help="overrides KUBEMOOT_NATS_URL")
    init.set_defaults(func=_init_buckets)

    cands = sub.add_parser("candidates", help="operator-side scheduling from Kubernetes YAML")
    cands.add_argument("-f", "--file", action="append", required=True, metavar="FILE_OR_DIR",
                       help="YAML with Model, ModelProvider, CrewSchedulingPolicy, Agent and "
                            "MootArchetype documents (repeatable; directories are read whole)")
    cands.add_argument("--output", "-o", choices=["env", "json", "yaml"], default="env")
    cands.add_argument("--strict", action="store_true",
                       help="exit 1 when an agent is unschedulable or a phase is invalid")
    cands.add_argument("--eviction-overhead-mib", type=_mib, default=None,
                       help="VRAM kept free beside a model (default: max(2048, 12%% of total))")
    cands.add_argument("--concurrency-factor", type=_positive, default=4.0,
                       help="agents per parallel slot a provider may serve (default 4)")
    cands.set_defaults(func=_candidates)

    bind = sub.add_parser("bind", help="bind agents live: publish their bindings to NATS as "
                                       "documents and providers change")
    bind.add_argument("-f", "--file", action="append", required=True, metavar="FILE_OR_DIR",
                      help="the documents `candidates` reads (repeatable; directories are "
                           "read whole, and read again when their content changes)")
    bind.add_argument("--config", help="YAML file with settings (env vars win)")
    bind.add_argument("--poll-interval", type=_positive, default=0.5,
                      help="seconds between reads of the documents (default 0.5)")
    bind.add_argument("--thread-ttl", type=_positive, default=3600.0,
                      help="seconds a discussion binding lives after its last ask "
                           "(default 3600)")
    bind.add_argument("--eviction-overhead-mib", type=_mib, default=None,
                      help="VRAM kept free beside a model (default: max(2048, 12%% of total))")
    bind.add_argument("--concurrency-factor", type=_positive, default=4.0,
                      help="agents per parallel slot a provider may serve (default 4)")
    bind.set_defaults(func=_bind_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"kubemoot-proxy: bad configuration: {exc}", file=sys.stderr)
        if hasattr(args, "config"):  # a misspelt name may be why: say so after the error
            for unknown in unknown_settings(args.config):
                print(f"kubemoot-proxy: warning: {unknown}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
