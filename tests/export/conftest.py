"""Makes the real-Prometheus fixture from prom_harness available to the export tests."""

from prom_harness import prometheus_server  # noqa: F401
