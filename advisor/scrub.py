"""The one scrubber of text that came from outside (a target's body or headers, a store's answer, a config
value): secrets are replaced, control characters and newlines flattened, and the text cut to a per-field cap,
in that order (a cut before the scrub could leave half a secret). Every output (`/status`, `run --once`,
`inspect`, log lines, error messages) shows outside text only after it went through here.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# What one field may contribute to any output: an error message, a model name, a version string.
FIELD_CHARS = 400
NAME_CHARS = 200  # a model name, a version: SGLang's are far shorter
REASON_CHARS = 2000  # a recommendation's reason, a note, the flag line
# Authorization values as a server might echo them: `Bearer sk-…`, `Basic dXNlcjpw…`, `Token …`.
_AUTH_VALUE = re.compile(r"(?i)\b(bearer|basic|token|apikey|api-key)(\s*[:=]?\s+|\s*[:=]\s*)([A-Za-z0-9._~+/=-]{6,})")
_TOKEN_MARK = re.compile(r"[0-9+/=._-]")  # a credential has one of these, or is long; a word has neither
# `key=value` pairs whose name says secret (query strings, JSON dumps, env echoes).
_SECRET_PAIR = re.compile(
    r"(?i)\b([A-Za-z0-9_-]*(?:api[_-]?key|token|secret|password|passwd))\b"
    r"(\"?\s*[:=]\s*\"?)([^\s\"',;&}]{4,})"
)
# user:password@ after a scheme: everything between `//` and the last `@` before the host is userinfo.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s@/]*(?:/[^\s@/]*)*@")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
REDACTED = "<redacted>"


def _auth_value(match: re.Match[str]) -> str:
    token = match.group(3)
    if len(token) >= 20 or _TOKEN_MARK.search(token):
        return match.group(1) + " " + REDACTED
    return match.group(0)


def redact_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret and every credential-looking value replaced (no cut, no flattening)."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = _USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _AUTH_VALUE.sub(_auth_value, text)
    return _SECRET_PAIR.sub(_secret_pair, text)


def _secret_pair(match: re.Match[str]) -> str:
    value = match.group(3)
    try:
        float(value)
        return match.group(0)  # a number ("bytes per token: 12345") is a figure, not a secret
    except ValueError:
        return match.group(1) + match.group(2) + REDACTED


# Results of `scrub_text` without named secrets, for short strings: a fleet's statuses repeat the same
# server names, info values and reasons every cycle (a pure function of its input, so a cache changes nothing).
_PLAIN: dict[tuple[str, int], str] = {}
_PLAIN_MAX_ENTRIES = 1 << 15
_PLAIN_MAX_CHARS = 160


def scrub_text(value: Any, limit: int = FIELD_CHARS, secrets: Iterable[str] = ()) -> str:
    """Outside text fit for any output: at most `limit` characters on one line, secrets replaced before the
    cut. Only a bounded window of a huge input is looked at (a 5 MB field costs no more than a short one)."""
    text = value if isinstance(value, str) else str(value)
    if not secrets and len(text) <= _PLAIN_MAX_CHARS:
        key = (text, limit)
        found = _PLAIN.get(key)
        if found is None:
            if len(_PLAIN) >= _PLAIN_MAX_ENTRIES:
                _PLAIN.clear()
            found = _PLAIN[key] = _scrub_text(text, limit, [])
        return found
    return _scrub_text(text, limit, [s for s in secrets if s])


def _scrub_text(text: str, limit: int, known: list[str]) -> str:
    window = limit * 4 + max((len(s) for s in known), default=0) + 64
    clipped = len(text) > window
    text = redact_secrets(text[:window], known)
    text = " ".join(_CONTROL.sub(" ", text).split())
    if len(text) > limit or clipped:
        return text[: max(limit - 3, 0)] + "..."
    return text


def scrub_tree(value: Any, limit: int = FIELD_CHARS, secrets: Iterable[str] = (), *, max_items: int = 10_000) -> Any:
    """A JSON-like tree (dicts, lists, strings, numbers) with every string (keys too) through `scrub_text`
    and every container cut to `max_items` entries."""
    known = tuple(secrets)
    if isinstance(value, str):
        return scrub_text(value, limit, known)
    if isinstance(value, dict):
        items = list(value.items())[:max_items]
        return {scrub_text(str(k), limit, known): scrub_tree(v, limit, known, max_items=max_items) for k, v in items}
    if isinstance(value, (list, tuple)):
        return [scrub_tree(item, limit, known, max_items=max_items) for item in list(value)[:max_items]]
    return value


MAX_SHOWN_ERRORS = 20  # a status's last errors: the first ones of the cycle
MAX_INFO_FIELDS = 64


def scrub_status_fields(status: Any) -> None:
    """Scrub, in place, the outside text a `TargetStatus` carries to every output (server and model names,
    the info strings from /server_info, the errors quoting what a server said): called once, as it is made."""
    status.server = scrub_text(status.server, NAME_CHARS)
    status.model_name = scrub_text(status.model_name, NAME_CHARS) if status.model_name else status.model_name
    if isinstance(status.info, dict):
        status.info = {scrub_text(key, 64): scrub_text(value, NAME_CHARS)
                       for key, value in list(status.info.items())[:MAX_INFO_FIELDS]}
    status.last_errors = [scrub_text(error) for error in list(status.last_errors)[:MAX_SHOWN_ERRORS]]
    if status.last_restart_reason:
        status.last_restart_reason = scrub_text(status.last_restart_reason)
    rec = status.recommendation
    if rec is not None:  # its reason and notes may name what a server reported (a dtype, an algorithm)
        rec.reason = scrub_text(rec.reason, REASON_CHARS)
        rec.notes = [scrub_text(note, REASON_CHARS) for note in list(rec.notes)[:MAX_SHOWN_ERRORS]]
        if rec.flag_line:
            rec.flag_line = scrub_text(rec.flag_line, REASON_CHARS)


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 120, 120
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 6


def shown_value(value: Any, limit: int = 60) -> str:
    """A value for an error message: a repr bounded in depth and length before it is built (a nested value
    shared many times over never expands), then scrubbed and cut to `limit`."""
    return scrub_text(_SHOWN.repr(value), limit)


def redact_url(url: str) -> str:
    """The URL without credentials in its authority part (`http://user:pw@host` -> `http://host`), even when
    the password holds a `/`, `?` or `#` that makes `urlsplit` read it as the path."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return _USERINFO.sub(lambda m: m.group(1), text) if "@" in text else text
    if "@" in rest:
        # The host follows the last '@' that comes before the first '/' after it; anything earlier is userinfo.
        authority_end = len(rest)
        for index in range(len(rest)):
            if rest[index] == "@":
                tail = rest[index + 1:]
                cut = min((p for p in (tail.find("/"), tail.find("?"), tail.find("#")) if p >= 0), default=len(tail))
                if "@" not in tail[:cut]:
                    authority_end = index
                    break
        if authority_end < len(rest):
            rest = rest[authority_end + 1:]
    try:
        parts = urlsplit(f"{scheme}://{rest}")
    except ValueError:
        return "<invalid url>"
    return urlunsplit(parts)


__all__ = ["FIELD_CHARS", "NAME_CHARS", "REDACTED", "redact_secrets", "redact_url", "scrub_status_fields", "scrub_text", "scrub_tree", "shown_value"]
