"""export.webconfig: TLS and basic auth for the exporter, read from a file with the semantics of
Prometheus' exporter web config (exporter-toolkit's `--web.config.file`): `tls_server_config`
(cert_file, key_file, client_auth_type, client_ca_file, min_version, max_version) and
`basic_auth_users` (user: bcrypt hash). Relative paths resolve against the file's directory."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import ssl
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.errors import InputError
from advisor.scrub import shown_value
from advisor.sources.local_files import read_local_bytes
from advisor.yaml_loading import load_yaml

# exporter-toolkit's client_auth_type values -> ssl verify mode (RequestClientCert and
# RequireAnyClientCert accept unverified certificates, which Python's ssl module cannot express).
CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_TLS_FIELDS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
# exporter-toolkit fields we do not implement: named in the error rather than silently ignored.
_TLS_UNSUPPORTED = {"cipher_suites", "curve_preferences", "prefer_server_cipher_suites", "client_allowed_sans"}
_TOP_FIELDS = {"tls_server_config", "basic_auth_users", "http_server_config"}
# Compared against when the user is unknown, so a wrong user costs the same bcrypt time as a wrong
# password (exporter-toolkit does the same). The hash of a random string nobody knows.
_DUMMY_HASH = b"$2b$10$9rustXAZYuYZpqlkbHAXduxZtz3.I.w6sPYMec2f3H6PVzmCg/71K"
# Successful checks cached by a keyed digest of user, hash and password, so each scrape does not
# pay bcrypt's deliberate ~50 ms; bounded.
_AUTH_CACHE_SIZE = 256
MAX_WEB_CONFIG_BYTES = 64 << 10  # a web config is a few hundred bytes; PyYAML needs ~70x the text in memory


@dataclass
class WebConfig:
    """The loaded web config: an SSL context when TLS is on, and the basic-auth users (may be empty)."""

    ssl_context: ssl.SSLContext | None = None
    basic_auth_users: dict[str, bytes] = field(default_factory=dict)
    source: str = ""
    _cache: OrderedDict[bytes, bool] = field(default_factory=OrderedDict, repr=False)
    _cache_key: bytes = field(default_factory=lambda: os.urandom(32), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def requires_auth(self) -> bool:
        return bool(self.basic_auth_users)

    def authorized(self, authorization: str | None) -> bool:
        """True when no users are configured, or the Authorization header names one with its password."""
        if not self.basic_auth_users:
            return True
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        known = user in self.basic_auth_users
        hashed = self.basic_auth_users.get(user, _DUMMY_HASH)
        key = hmac.new(self._cache_key, b"\0".join((user.encode(), hashed, password.encode())), hashlib.sha256).digest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return known and self._cache[key]
        import bcrypt  # only needed when basic auth is configured

        try:
            ok = bcrypt.checkpw(password.encode(), hashed)
        except ValueError:
            ok = False
        with self._lock:
            self._cache[key] = ok
            while len(self._cache) > _AUTH_CACHE_SIZE:
                self._cache.popitem(last=False)
        return known and ok


def _basic_credentials(authorization: str | None) -> tuple[str, str] | None:
    if not authorization:
        return None
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def _path(value: Any, name: str, base: Path) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"web config: field '{name}' must be a file path, got {shown_value(value)}")
    path = Path(value)
    resolved = path if path.is_absolute() else base / path
    try:
        regular = stat.S_ISREG(os.stat(resolved).st_mode)
    except OSError:
        regular = True  # missing: the loader names the problem
    if not regular:  # ssl would open a FIFO and wait for a writer
        raise InputError(f"web config: field '{name}' names {resolved}, which is not a regular file")
    return str(resolved)


def _ssl_context(raw: Any, base: Path) -> ssl.SSLContext | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError("web config: 'tls_server_config' must be a mapping")
    for key in raw:
        if not isinstance(key, str):
            raise InputError(f"web config: field names in 'tls_server_config' must be strings, got {shown_value(key)}")
        if key in _TLS_UNSUPPORTED:
            raise InputError(f"web config: 'tls_server_config.{key}' is not supported by pool-advisor")
        if key not in _TLS_FIELDS:
            raise InputError(f"web config: unknown field 'tls_server_config.{key}'")
    if not raw.get("cert_file") and not raw.get("key_file"):
        raise InputError("web config: 'tls_server_config' needs cert_file and key_file")
    if not raw.get("cert_file"):
        raise InputError("web config: missing 'tls_server_config.cert_file'")
    if not raw.get("key_file"):
        raise InputError("web config: missing 'tls_server_config.key_file'")
    auth_type = raw.get("client_auth_type", "NoClientCert")
    if not isinstance(auth_type, str) or auth_type not in CLIENT_AUTH_TYPES:
        raise InputError(
            f"web config: 'tls_server_config.client_auth_type' {shown_value(auth_type)} is not one of "
            f"{', '.join(CLIENT_AUTH_TYPES)}"
        )
    versions = {}
    for name, default in (("min_version", "TLS12"), ("max_version", None)):  # exporter-toolkit's minimum: TLS 1.2
        version = raw.get(name, default)
        if version is None:
            continue
        if not isinstance(version, str) or version not in TLS_VERSIONS:
            raise InputError(f"web config: 'tls_server_config.{name}' {shown_value(version)} is not one of "
                             f"{', '.join(TLS_VERSIONS)}")
        versions["minimum_version" if name == "min_version" else "maximum_version"] = TLS_VERSIONS[version]
    cert = _path(raw["cert_file"], "tls_server_config.cert_file", base)
    key = _path(raw["key_file"], "tls_server_config.key_file", base)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InputError(f"web config: cannot load cert_file {cert} / key_file {key}: {exc}") from None
    context.verify_mode = CLIENT_AUTH_TYPES[auth_type]
    if raw.get("client_ca_file"):
        ca = _path(raw["client_ca_file"], "tls_server_config.client_ca_file", base)
        try:
            context.load_verify_locations(ca)
        except (OSError, ssl.SSLError) as exc:
            raise InputError(f"web config: cannot load client_ca_file {ca}: {exc}") from None
    elif context.verify_mode != ssl.CERT_NONE:
        raise InputError(f"web config: client_auth_type {auth_type} needs 'tls_server_config.client_ca_file'")
    for attribute, value in versions.items():
        setattr(context, attribute, value)
    return context


def _users(raw: Any) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InputError("web config: 'basic_auth_users' must map user names to bcrypt hashes")
    users = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise InputError(f"web config: basic_auth_users: bad user name {shown_value(user)}")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise InputError(f"web config: basic_auth_users.{shown_value(user)} must be a bcrypt hash ($2y$...), "
                             "not a password")
        users[user] = hashed.encode()
    if users:
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise InputError("web config: basic_auth_users needs the 'bcrypt' package (pip install bcrypt)") from None
    return users


def web_config_from_dict(data: Any, base: Path | None = None, source: str = "") -> WebConfig:
    """Validate a web config mapping; relative paths resolve against `base` (default: the cwd)."""
    if data is None:
        return WebConfig(source=source)
    if not isinstance(data, dict):
        raise InputError("web config must be a mapping at the top level")
    for key in data:
        if not isinstance(key, str) or key not in _TOP_FIELDS:
            raise InputError(f"web config: unknown field {shown_value(key)}")
    http = data.get("http_server_config")
    if http not in (None, {}) and not (isinstance(http, dict) and set(http) <= {"http2"}):
        raise InputError("web config: only 'http_server_config.http2' is accepted (and ignored: HTTP/1.1 only)")
    root = base or Path.cwd()
    return WebConfig(ssl_context=_ssl_context(data.get("tls_server_config"), root),
                     basic_auth_users=_users(data.get("basic_auth_users")), source=source)


def load_web_config(path: str | Path) -> WebConfig:
    """Read a web config file (YAML); a one-line InputError names what is wrong."""
    file = Path(path)
    raw = read_local_bytes(file, "web config", MAX_WEB_CONFIG_BYTES)  # a regular file only: a FIFO would hang
    data = load_yaml(raw, f"web config {path}", MAX_WEB_CONFIG_BYTES)  # no aliases: no YAML bomb
    return web_config_from_dict(data, base=file.resolve().parent, source=str(path))
