"""Where the observed traffic changed character (pure): the start of the replay window's last regime, found as the
split that best separates its requests' sizes and kept only when what came after it is unlike every equally long
stretch before it. Periodic bursts and a varying rate are not regimes; a chat server turned document server is.

The size of a request is log(prompt + output tokens): the mix of short and long requests, which sets how much KV a
running request holds, and not the rate, which the replay's heavier-traffic check follows. A recent stretch that
only holds a burst the window has seen before lies inside the range of the earlier stretches; a regime shift lies
beyond it, in both halves of the new regime, by more than `factor` and by more than its own noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from advisor.scheduler.types import RequestSpec


@dataclass(frozen=True)
class RegimeSettings:
    min_seconds: float = 240.0  # the new regime has lasted at least this long (shorter is a burst, or too thin)
    step_seconds: float = 60.0  # change points and the earlier stretches on this grid
    min_requests: int = 30  # on either side of the change point, and in each earlier stretch compared
    factor: float = 1.33  # the recent mean request beyond every earlier stretch's by this factor ...
    sigmas: float = 3.0  # ... and by this many standard errors of the recent mean

    def __post_init__(self) -> None:
        if not (self.min_seconds > 0 and self.step_seconds > 0 and self.min_requests >= 2 and self.factor >= 1
                and self.sigmas >= 0):
            raise ValueError("regime: min_seconds and step_seconds must be > 0, min_requests >= 2, factor >= 1, "
                             "sigmas >= 0")


def request_sizes(requests: Sequence[RequestSpec]) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times, log of prompt + output tokens), by arrival."""
    times = np.asarray([r.time for r in requests], dtype=float)
    sizes = np.log(np.asarray([max(1, r.input_tokens + r.output_tokens) for r in requests], dtype=float))
    order = np.argsort(times, kind="stable")
    return times[order], sizes[order]


class _Sums:
    """Counts, sums and sums of squares of the sizes over any time span, from prefix sums."""

    def __init__(self, times: np.ndarray, sizes: np.ndarray) -> None:
        self.times = times
        self.total = np.concatenate([[0.0], np.cumsum(sizes)])
        self.squares = np.concatenate([[0.0], np.cumsum(sizes * sizes)])

    def span(self, start: float, end: float) -> tuple[int, float, float]:
        """(requests, mean size, variance of a size) of the arrivals in [start, end)."""
        low, high = np.searchsorted(self.times, [start, end], side="left")
        count = int(high - low)
        if count == 0:
            return 0, 0.0, 0.0
        mean = (self.total[high] - self.total[low]) / count
        variance = max(0.0, (self.squares[high] - self.squares[low]) / count - mean * mean)
        return count, float(mean), float(variance)


def regime_start(requests: Sequence[RequestSpec], window_seconds: float,
                 settings: RegimeSettings | None = None) -> float | None:
    """The time (from the window's start, as the requests' times are) at which the window's last regime began, or
    None where the window holds one regime (or too little to tell)."""
    settings = settings or RegimeSettings()
    if window_seconds < 2 * settings.min_seconds or len(requests) < 2 * settings.min_requests:
        return None
    times, sizes = request_sizes(requests)
    sums = _Sums(times, sizes)
    step = settings.step_seconds
    best: tuple[float, float] | None = None  # (contrast, change point)
    # The regime is younger than what came before it: a recent stretch is then compared with at least one as long
    # (and a burst the window's start has not yet repeated cannot pass for one).
    # The change point is sought up to the window's end, and a regime found younger than min_seconds is none yet.
    first = step * math.ceil(window_seconds / 2 / step)
    for split in np.arange(first, window_seconds - step / 2, step):
        before = sums.span(-math.inf, float(split))
        after = sums.span(float(split), math.inf)
        if min(before[0], after[0]) < settings.min_requests:
            continue
        spread = math.sqrt(before[2] / before[0] + after[2] / after[0])
        contrast = abs(after[1] - before[1]) / spread if spread > 0 else 0.0
        if best is None or contrast > best[0]:
            best = (contrast, float(split))
    if best is None:
        return None
    split = best[1]
    if window_seconds - split < settings.min_seconds:
        return None
    count, mean, variance = sums.span(split, math.inf)
    length = window_seconds - split
    earlier = [sums.span(float(a), float(a) + length)
               for a in np.arange(0.0, split - length + 1e-9, step)]
    earlier_means = [m for n, m, _ in earlier if n >= settings.min_requests]
    if not earlier_means:
        return None
    margin = max(math.log(settings.factor), settings.sigmas * math.sqrt(variance / count))
    high, low = max(earlier_means), min(earlier_means)
    if mean - high > margin:
        beyond = high
        side = 1.0
    elif low - mean > margin:
        beyond = low
        side = -1.0
    else:
        return None
    # Both halves of the new regime lie beyond the earlier range: a burst at the window's end fills only one.
    middle = split + (window_seconds - split) / 2
    for start, end in ((split, middle), (middle, math.inf)):
        n, half_mean, _ = sums.span(start, end)
        if n == 0 or side * (half_mean - beyond) <= 0:
            return None
    return split
