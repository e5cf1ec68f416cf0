"""The status page in a real headless browser (Debian's chromium and chromedriver), read as a
person would: the demo fleet's bars and rows appear, and they change after a call."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from tests.conftest import empty_buckets

webdriver = pytest.importorskip("selenium.webdriver", reason="pip install -e '.[dev]'")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="no chromium or chromedriver: apt-get install chromium chromium-driver")
MODEL = "qwen3:8b"
PAGE_WAIT_S = 20  # a wait, not a sleep: chromium on two cores beside the suite can lag seconds
# Headless, and nothing that reaches for the network (the machine has none).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    assert CHROMIUM is not None
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    # The driver is given, so selenium looks for none to download.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(10)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_page_shows_the_fleet_and_a_call_as_it_happens(
        sim_factory: Callable[..., SimServer], sidecar_factory: Callable[..., ThreadedServer],
        browser: webdriver.Chrome) -> None:  # the browser leaves before the sidecar stops
    a, b = sim_factory("a", total_vram_mib=32768), sim_factory("b", total_vram_mib=16376)
    url = sidecar_factory([a, b]).url
    browser.get(f"{url}/kubemoot/ui")
    wait = WebDriverWait(browser, PAGE_WAIT_S)

    def css(selector: str) -> list[object]:
        return browser.find_elements(By.CSS_SELECTOR, selector)  # type: ignore[no-any-return]

    wait.until(lambda _: len(css("[data-gpu] .bar .seg.free")) == 2)
    assert {g.get_attribute("data-gpu") for g in css("[data-gpu]")} == {"a", "b"}  # type: ignore[attr-defined]
    assert len(css("[data-gpu] .bar .seg.reserve")) == 2
    assert browser.find_element(By.ID, "conn").text == "live"
    assert css("#calls tbody tr.empty") and not css("[data-gpu] .seg[data-model]")

    # kept loaded for good: at the simulator's time scale its default keep-alive is 0.6 s,
    # which a browser beside the suite's load can miss
    r = httpx.post(f"{url}/api/chat", timeout=30, json={
        "model": MODEL, "stream": False, "keep_alive": -1,
        "messages": [{"role": "user", "content": "hi"}]})
    placed = r.headers["x-kubemoot-provider"]

    wait.until(lambda _: css("#calls tbody tr:not(.empty)"))
    row = browser.find_element(By.CSS_SELECTOR, "#calls tbody tr").text
    assert MODEL in row and placed in row and "cold" in row and "ok" in row
    wait.until(lambda _: css(f'[data-gpu="{placed}"] .seg[data-model="{MODEL}"]'))


def test_with_nats_the_page_shows_another_sidecars_call(
        nats_server: NatsServer, sim_factory: Callable[..., SimServer],
        sidecar_factory: Callable[..., ThreadedServer], browser: webdriver.Chrome) -> None:
    asyncio.run(empty_buckets(nats_server.url))
    gpus = [sim_factory("a", total_vram_mib=32768)]
    one = sidecar_factory(gpus, nats_url=nats_server.url, agent_name="one").url
    two = sidecar_factory(gpus, nats_url=nats_server.url, agent_name="two").url
    browser.get(f"{one}/kubemoot/ui")
    wait = WebDriverWait(browser, PAGE_WAIT_S)
    wait.until(lambda _: "2 heard from" in browser.find_element(By.ID, "calls-from").text)

    httpx.post(f"{two}/api/chat", timeout=30, json={
        "model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    ).raise_for_status()
    wait.until(lambda _: "default/two" in browser.find_element(By.ID, "calls").text)
    row = browser.find_element(By.CSS_SELECTOR, "#calls tbody tr").text
    assert "default/two" in row and MODEL in row and "ok" in row
