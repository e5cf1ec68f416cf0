"""Integration tests share the top-level fixtures (real nats-server, simulators)."""

from tests.conftest import empty_buckets

__all__ = ["empty_buckets"]
