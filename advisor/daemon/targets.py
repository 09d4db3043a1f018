"""What the daemon schedules: a `Target` stands for one or more SGLang servers and runs each one's
`ServerPipeline` cycle. A direct target is one server scraped and its logs followed (`DirectSource`); a store
target (advisor.daemon.store_targets.StoreFleet) is every server a Prometheus store holds, from one query set;
`inspect` runs one cycle over saved files (`SavedFilesSource`). The runner gives every target the same
deadline, ledger, publish and checkpoint whatever it observes.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from advisor.config import AdvisorConfig, TargetConfig
from advisor.daemon.pipeline import InfoAnswer, LogReading, ServerPipeline, ServerResult
from advisor.errors import InputError
from advisor.sources.follow import LogFollower
from advisor.sources.http import HttpClient
from advisor.sources.local_files import read_local_text
from advisor.sources.loglines import LogLineParser, digest
from advisor.sources.metrics import MetricsLimits, MetricsObservation, parse_metrics
from advisor.sources.scrape import scrape_metrics, scrape_server_info
from advisor.sources.server_info import ServerInfo, parse_server_info

# A saved file larger than this is refused (inspect reads it whole).
MAX_SAVED_FILE_BYTES = 1 << 30


class Target(Protocol):
    """One scheduled unit: its servers' cycles run one after another on one thread, under one deadline."""

    name: str  # the scheduling key, unique among targets
    checkpointed: bool  # whether its servers' state goes into the checkpoint (a store also keeps the time read up to)

    def servers(self) -> list[ServerPipeline]: ...  # the servers it stands for now

    def cycle(self, now: float) -> list[ServerResult]: ...

    def close(self) -> None: ...


class DirectSource:
    """A server read directly: its /metrics and /server_info over HTTP, its log files followed."""

    def __init__(self, target: TargetConfig, config: AdvisorConfig) -> None:
        self.url = target.url
        self.client = HttpClient(timeout_seconds=config.timeout_seconds, api_key=target.api_key,
                                 max_body_bytes=config.max_body_bytes)
        self.metrics_limits = MetricsLimits(config.max_line_bytes, config.max_labels_per_series, config.max_series)
        self.followers = [LogFollower(path, max_line_bytes=config.max_line_bytes) for path in target.log_paths]
        self.log_parser = LogLineParser()
        self.open_intervals: dict[str, dict[int | None, list[int]]] = {}  # per log: each rank's decode interval

    def read_logs(self) -> LogReading:
        reading = LogReading()
        for follower in self.followers:
            cut = follower.cut_lines
            try:
                lines = follower.read_lines()
            except OSError as exc:
                reading.errors.append(f"{follower.path}: {exc.strerror or exc}")
                continue
            if follower.cut_lines > cut:
                reading.errors.append(f"{follower.path}: {follower.cut_lines - cut} line(s) longer than "
                                      f"max_line_bytes={follower.max_line_bytes} cut")
            bad_before, abandoned_before = self.log_parser.bad_request_lines, self.log_parser.abandoned_boot_blocks
            found = digest(self.log_parser.feed(lines), source=follower.path,
                           carry=self.open_intervals.setdefault(follower.path, {}))
            if self.log_parser.abandoned_boot_blocks > abandoned_before:  # never finished, or over its line/byte cap
                reading.errors.append(f"{follower.path}: boot block given up (no caps line; superseded or too long)")
            # request-log lines that gave no record (the parser counts them): skipped, counted, the rest kept
            bad = self.log_parser.bad_request_lines - bad_before
            if bad > 0:
                reading.errors.append(f"{follower.path}: {bad} unreadable request-log line(s) skipped")
            reading.add(found)
        return reading

    def fetch_metrics(self) -> tuple[MetricsObservation | None, str | None]:
        return scrape_metrics(self.client, self.url, self.metrics_limits)

    def take_warnings(self) -> list[str]:
        return self.client.take_warnings()

    def ask_server_info(self) -> tuple[ServerInfo | None, str | None]:
        return scrape_server_info(self.client, self.url)

    def fetch_server_info(self, latest: MetricsObservation | None) -> InfoAnswer:
        info, error = self.ask_server_info()
        return InfoAnswer(info, None if info is not None else error or "no server info")

    def state(self) -> dict[str, Any]:
        return {f.path: f.state() for f in self.followers}

    def restore(self, saved: dict[str, Any]) -> None:
        for follower in self.followers:
            offsets = saved.get(follower.path)
            if isinstance(offsets, dict):
                follower.restore(offsets)

    def close(self) -> None:
        self.client.close()


class DirectTarget:
    """One configured server, read directly."""

    checkpointed = True

    def __init__(self, target: TargetConfig, config: AdvisorConfig) -> None:
        self.name = target.name
        self.pipeline = ServerPipeline(target, config, DirectSource(target, config))

    def servers(self) -> list[ServerPipeline]:
        return [self.pipeline]

    def cycle(self, now: float) -> list[ServerResult]:
        return [self.pipeline.run(now)]

    def close(self) -> None:
        self.pipeline.close()


class StandInSource:
    """Base of the sources that stand in for a server's own answers (saved files, a store's rows): they keep no
    log offsets across restarts, and may ask the server directly (`direct`) for what they lack."""

    direct: DirectSource | None = None

    def take_warnings(self) -> list[str]:
        return self.direct.take_warnings() if self.direct is not None else []

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, saved: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        if self.direct is not None:
            self.direct.close()


class SavedFilesSource(StandInSource):
    """A server as saved files say (`inspect`): a /metrics body, a /server_info body and log files read whole,
    each standing in for its live source; what no file gives is asked of `url` when one is given. Unreadable
    or unparsable files are refused at once (InputError); a source with nothing to read reports nothing, not a
    failure."""

    def __init__(self, *, metrics_file: str | None = None, server_info_file: str | None = None,
                 log_files: tuple[str, ...] = (), url: TargetConfig | None = None,
                 config: AdvisorConfig | None = None) -> None:
        self.metrics = parse_metrics(_read(metrics_file, "metrics file")) if metrics_file else None
        self.server_info: ServerInfo | None = None
        if server_info_file:
            try:
                self.server_info = parse_server_info(json.loads(_read(server_info_file, "server info file")))
            except json.JSONDecodeError as exc:
                raise InputError(f"server info file {server_info_file} is not JSON (line {exc.lineno})") from None
            except RecursionError:
                raise InputError(f"server info file {server_info_file} is nested too deeply") from None
        self.logs = [(path, _read(path, "log file")) for path in log_files]
        self.direct = DirectSource(url, config) if url is not None and config is not None else None

    def read_logs(self) -> LogReading:
        reading = LogReading()
        parser = LogLineParser()
        for path, text in self.logs:
            reading.add(digest(parser.feed(text.splitlines()) + parser.flush(), source=path))
        return reading

    def fetch_metrics(self) -> tuple[MetricsObservation | None, str | None]:
        if self.metrics is not None or self.direct is None:
            return self.metrics, None
        return self.direct.fetch_metrics()

    def fetch_server_info(self, latest: MetricsObservation | None) -> InfoAnswer:
        if self.server_info is not None or self.direct is None:
            return InfoAnswer(self.server_info)
        return self.direct.fetch_server_info(latest)



def _read(path: str, what: str) -> str:
    return read_local_text(path, what, MAX_SAVED_FILE_BYTES)  # a regular file only: a FIFO would hang
