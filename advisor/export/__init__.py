"""export: renders the last computed snapshot for Prometheus, humans (/) and tools (/status)."""
