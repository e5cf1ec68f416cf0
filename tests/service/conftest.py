"""Every test here runs on the event loop's virtual clock (the looptime plugin): a sleep, a
wait limit or a ticket's TTL passes at once when nothing else can run, so minutes of the
sidecar's time take milliseconds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.service.harness import Fleet

HERE = Path(__file__).parent
# One virtual hour: a test still waiting then has hung, and fails rather than spin.
VIRTUAL_LIMIT_S = 3600.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.looptime(end=VIRTUAL_LIMIT_S))


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    """GPUs and sidecars; the test builds them (`fleet.gpu`, then `await fleet.sidecar()`),
    so that everything reads the clock inside the test, where the clock is virtual."""
    fleet = Fleet()
    yield fleet
    await fleet.close()
