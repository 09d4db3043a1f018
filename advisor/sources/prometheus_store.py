"""A client of the Prometheus HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics): instant and range queries
with bearer or basic auth and a TLS CA. Failures are values (`QueryResult.error`, one line, credentials never
shown), like `advisor.sources.http.FetchResult`, so the daemon can count them and carry on.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from advisor.errors import InputError, LimitExceeded
from advisor.scrub import FIELD_CHARS, NAME_CHARS, redact_url, scrub_text
from advisor.sources.http import HttpClient, Received

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")


def parse_duration(text: str, what: str = "duration") -> float:
    """Prometheus-style durations ('90s', '15m', '7d', '1h30m', or plain seconds) to seconds; InputError else."""
    raw = str(text).strip()
    try:
        value = float(raw)
    except ValueError:
        parts = _DURATION.findall(raw)
        value = sum(float(n) * _DURATION_UNITS[u] for n, u in parts) if "".join(n + u for n, u in parts) == raw else -1.0
    if not value > 0:
        raise InputError(f"{what} {text!r} is not a positive duration like 90s, 15m, 6h or 7d")
    return value


def selector_matchers(selector: str | None) -> str:
    """The matchers inside a series selector `{job="sglang", env="prod"}` ('' for none), checked for shape."""
    if selector is None:
        return ""
    text = selector.strip()
    if not text:
        return ""
    if not (text.startswith("{") and text.endswith("}")):
        raise InputError(f"selector {selector!r} must be label matchers in braces, like '{{job=\"sglang\"}}'")
    inner = text[1:-1].strip().rstrip(",").strip()
    if "{" in inner or "}" in inner or (inner and "=" not in inner and "~" not in inner):
        raise InputError(f"selector {selector!r} is not a list of label matchers")
    return inner


class PromSeries(NamedTuple):
    """One result series: its labels and its samples [(unix seconds, value)] (one sample for an instant query).
    (A named tuple: a fleet's answer makes a million of them.)"""

    labels: dict[str, str]
    samples: list[tuple[float, float]]


@dataclass(frozen=True)
class QueryResult:
    ok: bool
    series: list[PromSeries] = field(default_factory=list)
    error: str | None = None
    elapsed_seconds: float = 0.0
    warnings: tuple[str, ...] = ()
    skipped_samples: int = 0  # NaN or infinite samples left out


@dataclass(frozen=True)
class StoreAuth:
    """How to reach the store: a bearer token, or basic auth, and a CA bundle for TLS (None: the system's)."""

    bearer_token: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if self.bearer_token and (self.username or self.password):
            raise InputError("give a bearer token or basic auth for the Prometheus store, not both")
        if (self.password is not None) and not self.username:
            raise InputError("basic auth for the Prometheus store needs a username with the password")


# What one store answer may hold: a body cap (JSON decodes to ~5-10x its size in objects) and a series cap (each
# series becomes labels, samples and, in the daemon, a server's state). Exceeding either is a counted error.
DEFAULT_STORE_MAX_BODY_BYTES = 32 << 20
DEFAULT_STORE_MAX_SERIES = 20_000
# Servers one store target may hold by default (each gets its own estimator; `max_servers_per_store` raises it):
# beyond it the answer is refused and counted.
MAX_SERVERS_PER_STORE = 2_000
# A fleet's largest answer (a token histogram: ~38 series a server) per server the target may hold, and its
# bytes per series: the caps of a target's client grow with its `max_servers_per_store`, never below the defaults.
SERIES_PER_SERVER = 64
BYTES_PER_SERIES = 256


def store_answer_caps(max_servers: int) -> tuple[int, int]:
    """(max_series, max_body_bytes) of a store client whose target may hold `max_servers` servers."""
    series = max(DEFAULT_STORE_MAX_SERIES, SERIES_PER_SERVER * max_servers)
    return series, max(DEFAULT_STORE_MAX_BODY_BYTES, BYTES_PER_SERIES * series)


def too_many_servers(count: int, cap: int = MAX_SERVERS_PER_STORE) -> str | None:
    """The error for a store answer naming `count` servers, when that is over the cap; None when it is not."""
    if count <= cap:
        return None
    return (f"the store names more than {cap} servers (max_servers_per_store={cap}); narrow the selector, "
            "shard the target over several advisors, or raise max_servers_per_store")


class PrometheusClient:
    """Queries over one kept-alive connection (advisor.sources.http: one total deadline per request and a body
    cap, against a store that trickles or floods). Queries go as POST form bodies (the API accepts both).
    Samples that are not finite numbers (NaN, ±Inf, 1e400) are skipped and counted in `skipped_samples`."""

    def __init__(self, base_url: str, *, timeout_seconds: float = 30.0, auth: StoreAuth | None = None,
                 trust_env: bool = False, max_body_bytes: int = DEFAULT_STORE_MAX_BODY_BYTES,
                 max_series: int = DEFAULT_STORE_MAX_SERIES) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InputError(f"Prometheus URL must be http(s)://…, got {redact_url(base_url)!r}")
        if not timeout_seconds > 0 or not math.isfinite(timeout_seconds):
            raise InputError(f"timeout must be > 0, got {timeout_seconds}")
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = float(timeout_seconds)
        self.auth = auth or StoreAuth()
        self.max_series = int(max_series)
        self.queries_sent = 0
        self.skipped_samples = 0
        tls = None
        if self.auth.ca_file:
            try:
                tls = ssl.create_default_context(cafile=self.auth.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise InputError(f"cannot read the store's CA file {self.auth.ca_file}: {exc}") from None
        basic = (self.auth.username, self.auth.password or "") if self.auth.username else None
        self._http = HttpClient(self.timeout_seconds, self.auth.bearer_token, max_body_bytes=max_body_bytes,
                                trust_env=trust_env, tls_context=tls, basic_auth=basic)

    def __repr__(self) -> str:
        return f"PrometheusClient({redact_url(self.base_url)!r}, timeout_seconds={self.timeout_seconds:g})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def query(self, expr: str, at: float | None = None) -> QueryResult:
        """An instant query (`/api/v1/query`), evaluated at `at` (unix seconds) or the store's now."""
        return self.read(self.send_query(expr, at))

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
        """A range query (`/api/v1/query_range`): one sample per `step` seconds from start to end."""
        return self.read(self.send_query_range(expr, start, end, step))

    def send_query(self, expr: str, at: float | None = None) -> Received:
        """`query`'s request and raw answer, not decoded (`read` decodes it): a thread may wait on the
        store for the next answer while the caller decodes this one."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._send("query", params)

    def send_query_range(self, expr: str, start: float, end: float, step: float) -> Received:
        """`query_range`'s request and raw answer, not decoded (`read` decodes it)."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._send("query_range", params)

    def _scrub(self, message: str) -> str:
        return self._http.scrub(message)

    def _count_series(self, raw: bytes) -> str | None:
        """Refuse an answer with more than `max_series` series before decoding it: each series has one
        `"metric"` key, and counting bytes takes milliseconds where decoding 100,000 series takes a second."""
        count = raw.count(b'"metric"')
        return _too_many_series(count, self.max_series) if count > self.max_series else None

    def _send(self, endpoint: str, params: dict[str, str]) -> Received:
        self.queries_sent += 1
        return self._http.receive_form_json(f"{self.base_url}/api/v1/{endpoint}", params)

    def read(self, received: Received, *, scrub_labels: bool = True,
             take: Callable[[Iterator[Row]], None] | None = None,
             take_texts: Callable[[ScannedVector], int] | None = None,
             known_digest: bytes | None = None) -> QueryResult:
        """A sent query's answer decoded into series (or its failure, one line). `scrub_labels=False` leaves
        each series' labels as the store sent them (an object, its values not yet scrubbed nor known to be
        strings): for a caller that scrubs the few it keeps, a fleet's million rows a cycle being mostly
        looked up and dropped (`advisor.sources.fleet_queries.FleetFrame`). With `take`, the series are
        handed to it as they are decoded, (labels, samples) one at a time, and not kept (the result's
        `series` is empty): `take` raising TypeError or ValueError on a row fails the result as malformed.
        With `take_texts` as well, a vector answer in the layout Prometheus writes (`scan_vector`, told the
        `known_digest` of labels the caller has resolved) is handed to it as texts instead, without decoding
        the JSON into objects; it returns the samples it left out as not finite."""
        shown, started = received.url, received.started

        def failed(message: str) -> QueryResult:
            return QueryResult(False, error=self._http.snippet(f"POST {shown}: {message}", FIELD_CHARS),
                               elapsed_seconds=time.monotonic() - started)

        result = self._http.finish(received, check_raw=self._count_series,
                                   scan=partial(scan_vector, known_digest=known_digest) if take_texts else None)
        body: Any = result.body
        if result.ok and isinstance(body, ScannedVector):
            if len(body.values) > self.max_series:
                return failed(_too_many_series(len(body.values), self.max_series))
            try:
                skipped = take_texts(body) if take_texts is not None else 0
            except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
                return failed(f"malformed result ({type(exc).__name__}: {exc})")
            self.skipped_samples += skipped
            notes: tuple[str, ...] = (f"{skipped} sample(s) not finite (NaN, Inf) skipped",) if skipped else ()
            return QueryResult(True, [], None, time.monotonic() - started, notes, skipped)
        if not result.ok:
            error_body = _json_object(body) if isinstance(body, str) else None
            if error_body is None or not error_body.get("errorType"):
                return QueryResult(False, error=result.error, elapsed_seconds=time.monotonic() - started)
            body = error_body
        if not isinstance(body, dict):
            return failed("response is not a JSON object")
        if body.get("status") != "success":
            kind = body.get("errorType") or f"HTTP {result.status}"
            return failed(f"{kind}: {body.get('error') or 'no error message'}")
        found = [0]
        try:
            rows = _rows(body.get("data"), self.max_series, scrub_labels, found)
            if take is None:
                series = [PromSeries(labels, samples) for labels, samples in rows]
            else:
                series = []
                take(rows)
        except LimitExceeded as exc:
            return failed(str(exc))
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            return failed(f"malformed result ({type(exc).__name__}: {exc})")
        skipped = found[0]
        self.skipped_samples += skipped
        raw_warnings = body.get("warnings") or ()
        warnings = tuple(scrub_text(w, 200) for w in (raw_warnings if isinstance(raw_warnings, list) else [])[:10])
        if skipped:
            warnings += (f"{skipped} sample(s) not finite (NaN, Inf) skipped",)
        return QueryResult(True, series, None, time.monotonic() - started, warnings, skipped)


def _too_many_series(count: int, max_series: int) -> str:
    return f"answer has {count} series, more than the store's max_series={max_series}; narrow the selector"


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text[: 1 << 16])
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _labels(raw: Any, scrubbed: dict[Any, str]) -> dict[str, str]:
    """A series' labels, each name and value scrubbed once per answer (`scrubbed` remembers them: a fleet's
    answer repeats a few hundred names and values across a million series)."""
    if not isinstance(raw, dict):
        raise TypeError("metric labels are not an object")
    labels = {}
    for key, value in raw.items():
        name = scrubbed.get(key)
        if name is None:
            name = scrubbed[key] = scrub_text(key, NAME_CHARS)
        text = scrubbed.get(value)
        if text is None:
            text = scrubbed[value] = scrub_text(value, NAME_CHARS)
        labels[name] = text
    return labels


def _label_object(raw: Any) -> dict[Any, Any]:
    """A series' labels as sent (`scrub_labels=False`): only checked to be an object."""
    if not isinstance(raw, dict):
        raise TypeError("metric labels are not an object")
    return raw


def _finite_samples(pairs: Any) -> tuple[list[tuple[float, float]], int]:
    """(timestamp, value) pairs with both finite; and how many were not. (One pass converts them all; only
    when their sum is not finite — a NaN, an infinity or an overflow among them — are they checked one by
    one: a fleet's history is millions of samples.)"""
    if len(pairs) > 1:
        try:
            converted = [(float(t), float(v)) for t, v in pairs]
        except (TypeError, ValueError):
            converted = None
        if converted is not None and math.isfinite(sum(t + v for t, v in converted)):
            return converted, 0
    samples = []
    skipped = 0
    for t, v in pairs:
        when, value = float(t), float(v)
        if math.isfinite(when) and math.isfinite(value):
            samples.append((when, value))
        else:
            skipped += 1
    return samples, skipped


Row = tuple[Any, list[tuple[float, float]]]  # (labels, [(unix seconds, value)]) of one series
RowText = tuple[str, str, str]  # (labels JSON, value, "," or "") of one vector row, as sent

# A vector answer exactly as Prometheus writes it: no whitespace, each row's labels one flat object, every
# row's sample at the one evaluation time (a JSON number) and its value quoted. A label value holding a brace,
# an escape in a value, rows at different times, or anything else (warnings, another key order) does not
# match, and the answer is decoded as JSON instead.
_VECTOR_HEAD = '{"status":"success","data":{"resultType":"vector","result":['
_VECTOR_TAIL = "]}}"
_VECTOR_STAMP = re.compile(r'\{"metric":\{[^{}]*\},"value":\[(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?),"')
_VECTOR_ROW_AT = r'\{"metric":(\{[^{}]*\}),"value":\[%s,"([^"\\]*)"\]\}(,?)'  # % the stamp, escaped
_VECTOR_ROW_FIXED_CHARS = len('{"metric":,"value":[,""]}')
_SCAN_SLICE_CHARS = 1 << 20


class ScannedVector(NamedTuple):
    """A vector answer read by `scan_vector`: the one timestamp of its rows, the digest of its labels, and
    its values in row order; its rows' texts too, unless its labels were those the caller knew."""

    stamp: str
    digest: bytes
    values: list[str]
    rows: list[RowText] | None


def _value_pattern(stamp: str) -> re.Pattern[str]:
    return re.compile(r',"value":\[' + re.escape(stamp) + r',"([^"\\]*)"\]\}')


def scan_vector(text: str, known_digest: bytes | None = None) -> ScannedVector | None:
    """A vector answer's values and timestamp, found by regular expressions instead of decoding a million
    JSON objects, and the digest of its labels (of the text with every row's sample cut out); None when the
    text is not in that layout. When the digest is `known_digest` (the labels the caller resolved from an
    earlier answer, laid out the same), the values are all it needs: that earlier answer was read row by row,
    and its text without samples has no `"value":[` left, so neither has this one's. Otherwise every row's
    text is read: the rows must tile the result array exactly (their lengths add up to it, commas between
    them), so nothing in it is skipped; a label object is one flat object (JSON strings cannot hold an
    unescaped quote, so no value can fake the `},"value":[` that ends it), decoded as JSON by whoever reads
    it first."""
    if not text.startswith(_VECTOR_HEAD):
        return None
    end = len(text.rstrip())
    if not text.endswith(_VECTOR_TAIL, 0, end):
        return None
    start, end = len(_VECTOR_HEAD), end - len(_VECTOR_TAIL)
    if start == end:
        return ScannedVector("", b"", [], [])
    first = _VECTOR_STAMP.match(text, start, end)
    if first is None:
        return None
    stamp = first.group(1)
    values_at = _value_pattern(stamp)
    hashed = hashlib.blake2b(digest_size=32)
    values: list[str] = []
    at = 0
    while at < len(text):  # a slice of whole rows at a time: the text is not copied at once
        cut = text.find('},{"metric":', at + _SCAN_SLICE_CHARS) + 1 or len(text)
        piece = text[at:cut] if cut < len(text) else text[at:].rstrip()
        hashed.update(values_at.sub("", piece).encode())
        values += values_at.findall(piece)
        at = cut
    digest = hashed.digest()
    if digest == known_digest:
        return ScannedVector(stamp, digest, values, None)
    del values
    rows: list[RowText] = re.compile(_VECTOR_ROW_AT % re.escape(stamp)).findall(text, start, end)
    covered = sum(map(len, itertools.chain.from_iterable(rows))) + (_VECTOR_ROW_FIXED_CHARS + len(stamp)) * len(rows)
    if covered != end - start or not rows or rows[-1][2] or sum(1 for row in rows if not row[2]) != 1:
        return None
    return ScannedVector(stamp, digest, [row[1] for row in rows], rows)


def _series_of(data: Any, max_series: int = DEFAULT_STORE_MAX_SERIES, *,
               scrub_labels: bool = True) -> tuple[list[PromSeries], int]:
    """The API's `data` ({resultType, result}) as series, and the count of non-finite samples left out (a
    series left with none is dropped); scalars become one label-less series. More than `max_series` series
    is a LimitExceeded naming the cap."""
    skipped = [0]
    series = [PromSeries(labels, samples) for labels, samples in _rows(data, max_series, scrub_labels, skipped)]
    return series, skipped[0]


def _rows(data: Any, max_series: int, scrub_labels: bool, skipped: list[int]) -> Iterator[Row]:
    """`_series_of`'s rows, one at a time as they are read (`skipped[0]` counts the non-finite samples left
    out). Each decoded row is dropped from `data` as it is read, so a fleet's answer (a million rows) is never
    held twice over, as JSON objects and as series."""
    kind = data["resultType"]
    result = data["result"]
    if kind == "scalar":
        result = [{"metric": {}, "value": result}]
        kind = "vector"
    if kind not in ("vector", "matrix"):
        raise ValueError(f"result type {scrub_text(kind, 40)!r} is not a vector, matrix or scalar")
    if not isinstance(result, list):
        raise TypeError("result is not a list")
    if len(result) > max_series:
        raise LimitExceeded(_too_many_series(len(result), max_series))
    scrubbed: dict[Any, str] = {}
    result.reverse()
    isfinite = math.isfinite
    labels_of = partial(_labels, scrubbed=scrubbed) if scrub_labels else _label_object
    while result:
        item = result.pop()
        if kind == "vector":  # one sample: read it here (the common case of a fleet's every cycle)
            t, v = item["value"]
            when, value = float(t), float(v)
            if isfinite(when) and isfinite(value):
                yield labels_of(item["metric"]), [(when, value)]
            else:
                skipped[0] += 1
            continue
        samples, dropped = _finite_samples(item["values"])
        skipped[0] += dropped
        if samples:
            yield labels_of(item["metric"]), samples


__all__ = ["MAX_SERVERS_PER_STORE", "PromSeries", "store_answer_caps", "PrometheusClient", "QueryResult", "StoreAuth", "parse_duration", "selector_matchers", "too_many_servers"]
