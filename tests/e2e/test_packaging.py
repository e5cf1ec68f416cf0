"""The product's wheel holds the sidecar and nothing else; the demo's wheel holds the simulated
fleet; the two installed outside a checkout run `kubemoot-proxy serve --demo`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
import venv
import zipfile
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest

from loadtest.relay_bench import free_port

ROOT = Path(__file__).resolve().parents[2]
SIMULATOR = {"__init__", "ollama_sim", "serving", "sim_audio", "sim_bindings", "sim_cache",
             "sim_checks", "sim_cloud", "sim_dialects", "sim_engine", "sim_gojson", "sim_gpus",
             "sim_model", "sim_output", "sim_sched"}


def _setuptools_major() -> int:
    return int(version("setuptools").split(".")[0])


# Built with this environment's setuptools, so the test needs no network; the dev extra
# brings one that reads the product's metadata (an SPDX license string needs 77).
pytestmark = pytest.mark.skipif(_setuptools_major() < 77,
                                reason="needs setuptools>=77: pip install -e '.[dev]'")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both wheels, built from copies of what the Dockerfile copies and of loadtest/: a
    build in place would leave build/ and *.egg-info in the checkout."""
    src = tmp_path_factory.mktemp("src")
    junk = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "out", "report")
    product = src / "product"
    shutil.copytree(ROOT / "proxy", product / "proxy", ignore=junk)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, product / name)
    shutil.copytree(ROOT / "loadtest", src / "demo", ignore=junk)
    dist = src / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--wheel-dir", str(dist),
                    str(product), str(src / "demo")], check=True, timeout=120)
    return {"product": next(dist.glob("kubemoot_proxy-*.whl")),
            "demo": next(dist.glob("kubemoot_proxy_demo-*.whl"))}


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def _modules(names: list[str], package: str) -> set[str]:
    return {Path(n).stem for n in names if n.startswith(f"{package}/") and n.endswith(".py")}


def test_product_wheel_ships_only_the_sidecar(wheels: dict[str, Path]) -> None:
    names = _names(wheels["product"])
    assert {n.split("/")[0] for n in names} == {"proxy", "kubemoot_proxy-0.1.0.dist-info"}
    assert not [n for n in names if "loadtest" in n or "sim_" in n or "bench" in n]
    assert "proxy/api/ui.html" in names  # the status page, read as a package resource
    with zipfile.ZipFile(wheels["product"]) as archive:
        metadata = archive.read("kubemoot_proxy-0.1.0.dist-info/METADATA").decode()
    assert 'Requires-Dist: kubemoot-proxy-demo==0.1.0; extra == "demo"' in metadata


def test_demo_wheel_ships_the_simulator_only(wheels: dict[str, Path]) -> None:
    names = _names(wheels["demo"])
    assert {n.split("/")[0] for n in names} == {"kubemoot_proxy_demo",
                                                "kubemoot_proxy_demo-0.1.0.dist-info"}
    assert _modules(names, "kubemoot_proxy_demo") == SIMULATOR


def _fresh_venv(where: Path) -> Path:
    """A new environment that sees this one's dependencies (fastapi, uvicorn, ...) but neither
    the checkout nor this environment's install of kubemoot-proxy."""
    venv.create(where, with_pip=False)
    python = where / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True)
    # A path line only: the .pth files there (an editable install's finder) stay unread.
    Path(site.stdout.strip(), "dependencies.pth").write_text(sysconfig.get_path("purelib"))
    return python


def test_serve_demo_runs_from_the_two_wheels_outside_a_checkout(
        wheels: dict[str, Path], tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path / "venv")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--no-deps", "--no-index", str(wheels["product"]), str(wheels["demo"])],
                   check=True, timeout=120)
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("KUBEMOOT_")}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "import proxy, kubemoot_proxy_demo, importlib.util;"
                            "print(proxy.__file__, importlib.util.find_spec('loadtest'))"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(tmp_path / "venv")) and where.stdout.endswith(" None\n")

    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        serve = subprocess.Popen([str(tmp_path / "venv" / "bin" / "kubemoot-proxy"), "serve",
                                  "--demo", "--listen", f"127.0.0.1:{port}"],
                                 cwd=elsewhere, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        tags = _tags_when_up(f"http://127.0.0.1:{port}", serve, log)
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=15)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    assert "qwen3:8b" in {m["name"] for m in tags["models"]}
    assert "simulated fleet" in log.read_text()


def _tags_when_up(url: str, serve: subprocess.Popen[bytes], log: Path) -> dict[str, list[dict[
        str, str]]]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert serve.poll() is None, log.read_text()
        try:
            answer = httpx.get(f"{url}/api/tags", timeout=2)
        except httpx.TransportError:
            time.sleep(0.1)
            continue
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]
    raise AssertionError(f"serve --demo did not answer in 30 s:\n{log.read_text()}")
