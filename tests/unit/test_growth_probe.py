"""growth_probe measures what the project's objects hold: containers reached through them."""

from __future__ import annotations

from loadtest.growth_probe import sizes
from proxy.service.fleet_calls import FleetCalls
from tests.unit.test_fleet_calls import ring_of, whole


def test_containers_reached_through_the_projects_objects_are_measured() -> None:
    fleet = FleetCalls()
    before = sizes({"fleet": fleet})
    for n in range(5):
        fleet.merge(whole(ring_of(1), f"i{n}"))
    after = sizes({"fleet": fleet})
    assert before["fleet.heard"] == 0 and after["fleet.heard"] == 5
    assert after["fleet.calls"] == 5
