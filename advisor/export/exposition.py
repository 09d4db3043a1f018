"""export.exposition: the /metrics body. The per-server families change only when the daemon publishes,
so their encoded (and gzipped) bytes are kept per snapshot generation and format, rendered when the daemon's
cycle ends; the advisor process's own metrics (build info, step histogram, process_*) are encoded fresh on
every scrape and appended. The format (text 0.0.4 or OpenMetrics) and gzip are negotiated by
prometheus_client itself."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Mapping, Sequence

from prometheus_client.exposition import _bake_output, choose_encoder, gzip_accepted
from prometheus_client.registry import CollectorRegistry

from advisor.export.collector import build_daemon_registry, build_registry
from advisor.export.snapshot import SnapshotStore

OPENMETRICS_EOF = b"# EOF\n"


class MetricsRenderer:
    """Renders /metrics for one store; thread-safe. The per-server part is encoded once per snapshot and format:
    at the end of each daemon cycle for every format scraped so far (so a scrape only sends bytes), else on the
    first scrape that finds it missing. A scrape re-encodes only the few daemon families (a fleet of 1000
    servers is ~5 MB of per-server text, ~0.7 s to encode)."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store
        self._per_server = build_registry(store, daemon_metrics=False)
        self._daemon = build_daemon_registry(store)
        self._everything = build_registry(store)  # for name[] filtering, which bypasses the cache
        self._lock = threading.Lock()
        self._cache: dict[tuple[int, str, bool], bytes] = {}
        self._formats: dict[tuple[str, bool], str] = {}  # (content type, gzip) scraped so far -> an Accept for it
        store.on_cycle_end(self.prerender)

    def render(self, accept: str, accept_encoding: str,
               params: Mapping[str, Sequence[str]]) -> tuple[list[tuple[str, str]], bytes]:
        """(headers, body) for a scrape with these Accept and Accept-Encoding headers and query params."""
        if "name[]" in params:
            _, headers, body = _bake_output(self._everything, accept, accept_encoding, params, False)
            return list(headers), body
        encoder, content_type = choose_encoder(accept)
        compress = gzip_accepted(accept_encoding)
        with self._lock:
            self._formats.setdefault((content_type, compress), accept)
        head = self._per_server_part(accept, compress)
        tail = encoder(self._daemon)
        # gzip members concatenate into one valid stream (RFC 1952 §2.2; Go's and Python's readers accept it)
        body = head + (gzip.compress(tail, compresslevel=6) if compress else tail)
        headers = [("Content-Type", content_type)]
        if compress:
            headers.append(("Content-Encoding", "gzip"))
        return headers, body

    def prerender(self) -> None:
        """Encode the current snapshot in every format scraped so far (the daemon calls this once per cycle)."""
        with self._lock:
            formats = list(self._formats.items())
        for (_, compress), accept in formats:
            self._per_server_part(accept, compress)

    def ready(self) -> bool:
        """Whether the current snapshot is encoded in every format scraped so far."""
        publishes = self.store.snapshot().publishes
        with self._lock:
            return all((publishes, content_type, compress) in self._cache for content_type, compress in self._formats)

    def _per_server_part(self, accept: str, compress: bool) -> bytes:
        encoder, content_type = choose_encoder(accept)
        key = (self.store.snapshot().publishes, content_type, compress)  # read before encoding: never stale
        with self._lock:
            head = self._cache.get(key)
        if head is not None:
            return head
        head = encoder(self._per_server)
        if content_type.startswith("application/openmetrics-text") and head.endswith(OPENMETRICS_EOF):
            head = head[: -len(OPENMETRICS_EOF)]  # the daemon part closes the document
        if compress:
            head = gzip.compress(head, compresslevel=6)
        with self._lock:
            for stale in [k for k in self._cache if k[0] < key[0]]:
                del self._cache[stale]
            if key[0] >= max((k[0] for k in self._cache), default=key[0]):
                self._cache[key] = head
        return head


def bake_registry(registry: CollectorRegistry, accept: str, accept_encoding: str,
                  params: Mapping[str, Sequence[str]]) -> tuple[list[tuple[str, str]], bytes]:
    """(headers, body) for a caller-supplied registry, uncached."""
    _, headers, body = _bake_output(registry, accept, accept_encoding, params, False)
    return list(headers), body
