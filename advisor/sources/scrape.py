"""One fetch-and-parse of each HTTP source of an SGLang server: /metrics and /server_info. Errors come back
as one-line strings beside a None value, never raised, so the daemon can count them and `inspect` can print
them; the daemon and `inspect` share this sequence."""

from __future__ import annotations

from dataclasses import replace

from advisor.errors import InputError
from advisor.scrub import FIELD_CHARS, NAME_CHARS, scrub_text
from advisor.sources.http import HttpClient
from advisor.sources.metrics import DEFAULT_LIMITS, MetricsLimits, MetricsObservation, parse_metrics
from advisor.sources.server_info import ServerInfo, fetch_server_info, parse_server_info


def scrape_metrics(
    client: HttpClient, base_url: str, limits: MetricsLimits = DEFAULT_LIMITS
) -> tuple[MetricsObservation | None, str | None]:
    """GET {base_url}/metrics and parse it within `limits`: (observation, None) or (None, why not)."""
    result = client.get_text(f"{base_url.rstrip('/')}/metrics")
    if not result.ok or not isinstance(result.body, str):
        return None, result.error or "empty /metrics body"
    try:
        return parse_metrics(result.body, limits), None
    except InputError as exc:  # the message may quote the body: scrubbed with this client's secrets
        return None, client.snippet(str(exc), FIELD_CHARS)


def scrape_server_info(client: HttpClient, base_url: str) -> tuple[ServerInfo | None, str | None]:
    """GET {base_url}/server_info (falling back to /get_server_info) and parse it."""
    result = fetch_server_info(client, base_url.rstrip("/"))
    if not result.ok or not isinstance(result.body, dict):
        return None, result.error or "no JSON object from /server_info"
    try:
        return scrubbed_server_info(parse_server_info(result.body)), None
    except InputError as exc:
        return None, client.snippet(str(exc), FIELD_CHARS)


def scrubbed_server_info(info: ServerInfo) -> ServerInfo:
    """`info` with the strings the server chose (version, model name) through the one scrubber."""
    return replace(
        info,
        version=scrub_text(info.version, NAME_CHARS) if info.version is not None else None,
        model_name=scrub_text(info.model_name, NAME_CHARS) if info.model_name is not None else None,
    )
