"""A decaying histogram of token counts (after the VPA recommender's `decaying_histogram.go`).

Exponential buckets 5% wide from 16 tokens to past 4M; each sample's weight grows by 2^((t - t_ref)/half_life)
so older samples count half as much per half-life. Percentiles return a bucket's end; the mean is exact.
Pure: `now` is always an argument. Serializes to a small JSON-friendly dict.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

FIRST_BUCKET_TOKENS = 16.0
BUCKET_GROWTH = 1.05
MAX_TOKENS = 4_194_304.0
# Shift the reference time forward before 2^exponent overflows (VPA: maxDecayExponent = 100).
MAX_DECAY_EXPONENT = 100.0
EPSILON_WEIGHT = 1e-9


def _bucket_starts() -> np.ndarray:
    count = int(math.ceil(math.log(1 + MAX_TOKENS * (BUCKET_GROWTH - 1) / FIRST_BUCKET_TOKENS) / math.log(BUCKET_GROWTH))) + 1
    n = np.arange(count, dtype=float)
    starts = FIRST_BUCKET_TOKENS * (BUCKET_GROWTH**n - 1) / (BUCKET_GROWTH - 1)
    return starts


BUCKET_STARTS = _bucket_starts()
BUCKET_ENDS = np.append(BUCKET_STARTS[1:], np.inf)


def bucket_indices(values: np.ndarray) -> np.ndarray:
    """The bucket of each value (values below the first start go to the first bucket, past the last to the last;
    a NaN's index is meaningless, and `add_many` leaves it out)."""
    return np.minimum(np.maximum(np.searchsorted(BUCKET_STARTS, values, side="right") - 1, 0), len(BUCKET_STARTS) - 1)


class DecayingHistogram:
    def __init__(self, half_life_seconds: float) -> None:
        if not half_life_seconds > 0:
            raise ValueError(f"half-life must be > 0 seconds, got {half_life_seconds}")
        self.half_life_seconds = float(half_life_seconds)
        self.weights = np.zeros(len(BUCKET_STARTS))
        self.weighted_sum = 0.0  # sum of weight * value, for the exact mean
        self.reference_time: float | None = None
        self.first_sample_time: float | None = None
        self.last_sample_time: float | None = None
        self.sample_count = 0.0

    def _factor(self, now: float) -> float:
        if self.reference_time is None:
            self.reference_time = math.floor(now / self.half_life_seconds) * self.half_life_seconds
        exponent = (now - self.reference_time) / self.half_life_seconds
        if exponent > MAX_DECAY_EXPONENT:
            shift = math.floor(exponent) * self.half_life_seconds
            scale = 2.0 ** (-math.floor(exponent))
            self.weights *= scale
            self.weighted_sum *= scale
            self.reference_time += shift
            exponent = (now - self.reference_time) / self.half_life_seconds
        return 2.0**exponent

    @staticmethod
    def bucket_of(value: float) -> int:
        index = int(np.searchsorted(BUCKET_STARTS, value, side="right")) - 1
        return min(max(index, 0), len(BUCKET_STARTS) - 1)

    def add(self, value: float, weight: float, now: float) -> None:
        if weight <= 0 or not math.isfinite(value) or value < 0:
            return
        scaled = weight * self._factor(now)
        self.weights[self.bucket_of(value)] += scaled
        self.weighted_sum += scaled * value
        self.sample_count += 1
        if self.first_sample_time is None:
            self.first_sample_time = now
        self.last_sample_time = now if self.last_sample_time is None else max(self.last_sample_time, now)

    def add_many(self, values: np.ndarray, weights: np.ndarray, now: float, samples: float | None = None,
                 buckets: np.ndarray | None = None) -> None:
        """Add `values` with their `weights` (non-positive weights, negative or non-finite values left out);
        `buckets` may give `bucket_indices(values)` already worked out (histograms fed the same values)."""
        values = np.asarray(values, dtype=float)
        weights = np.asarray(weights, dtype=float)
        keep = (weights > 0) & np.isfinite(values) & (values >= 0)
        if not keep.any():
            return
        index = bucket_indices(values) if buckets is None else buckets
        if not keep.all():  # (all kept, the usual case: no copies)
            index, values, weights = index[keep], values[keep], weights[keep]
        factor = self._factor(now)
        self.weights += np.bincount(index, weights=weights * factor, minlength=len(self.weights))
        self.weighted_sum += float(np.sum(values * weights)) * factor
        self.sample_count += float(len(values) if samples is None else samples)
        if self.first_sample_time is None:
            self.first_sample_time = now
        self.last_sample_time = now if self.last_sample_time is None else max(self.last_sample_time, now)

    def total_weight(self, now: float) -> float:
        """Total weight in units of a sample added at `now`."""
        if self.reference_time is None:
            return 0.0
        return float(self.weights.sum()) / 2.0 ** ((now - self.reference_time) / self.half_life_seconds)

    def mean(self) -> float | None:
        total = float(self.weights.sum())
        return None if total <= EPSILON_WEIGHT else self.weighted_sum / total

    def percentile(self, fraction: float) -> float | None:
        return self.percentiles((fraction,))[0]

    def percentiles(self, fractions: tuple[float, ...]) -> list[float | None]:
        """`percentile` of each fraction, the cumulative weights summed once."""
        total = float(self.weights.sum())
        if total <= EPSILON_WEIGHT:
            return [None] * len(fractions)
        cumulative = np.cumsum(self.weights)
        found: list[float | None] = []
        for fraction in fractions:
            index = int(np.searchsorted(cumulative, fraction * total - 1e-12 * total, side="left"))
            index = min(index, len(BUCKET_STARTS) - 1)
            end = BUCKET_ENDS[index]
            found.append(float(BUCKET_STARTS[index] if math.isinf(end) else end))
        return found

    def to_dict(self) -> dict[str, Any]:
        nonzero = np.nonzero(self.weights > EPSILON_WEIGHT * max(1.0, float(self.weights.max(initial=0.0))))[0]
        return {
            "half_life_seconds": self.half_life_seconds,
            "reference_time": self.reference_time,
            "buckets": {str(int(i)): float(self.weights[i]) for i in nonzero},
            "weighted_sum": self.weighted_sum,
            "first_sample_time": self.first_sample_time,
            "last_sample_time": self.last_sample_time,
            "sample_count": self.sample_count,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecayingHistogram:
        hist = cls(float(data["half_life_seconds"]))
        hist.reference_time = data.get("reference_time")
        for key, weight in dict(data.get("buckets", {})).items():
            index = int(key)
            if not 0 <= index < len(BUCKET_STARTS) or not float(weight) >= 0:
                raise ValueError(f"bad histogram bucket {key}={weight}")
            hist.weights[index] = float(weight)
        hist.weighted_sum = float(data.get("weighted_sum", 0.0))
        hist.first_sample_time = data.get("first_sample_time")
        hist.last_sample_time = data.get("last_sample_time")
        hist.sample_count = float(data.get("sample_count", 0.0))
        return hist


class DecayingMoments:
    """Exponentially decayed sums of weight, weight*x and weight*x^2 (for a time-weighted mean and spread)."""

    def __init__(self, half_life_seconds: float) -> None:
        self.half_life_seconds = float(half_life_seconds)
        self.last_time: float | None = None
        self.weight = 0.0
        self.sum_x = 0.0
        self.sum_x2 = 0.0

    def _decay_to(self, now: float) -> None:
        if self.last_time is not None and now > self.last_time:
            factor = 2.0 ** (-(now - self.last_time) / self.half_life_seconds)
            self.weight *= factor
            self.sum_x *= factor
            self.sum_x2 *= factor
        if self.last_time is None or now > self.last_time:
            self.last_time = now

    def add(self, x: float, weight: float, now: float) -> None:
        if weight <= 0 or not math.isfinite(x):
            return
        self._decay_to(now)
        self.weight += weight
        self.sum_x += weight * x
        self.sum_x2 += weight * x * x

    def mean(self) -> float | None:
        return None if self.weight <= EPSILON_WEIGHT else self.sum_x / self.weight

    def std(self) -> float | None:
        mean = self.mean()
        if mean is None:
            return None
        return math.sqrt(max(self.sum_x2 / self.weight - mean * mean, 0.0))

    def to_dict(self) -> dict[str, Any]:
        return {"half_life_seconds": self.half_life_seconds, "last_time": self.last_time, "weight": self.weight,
                "sum_x": self.sum_x, "sum_x2": self.sum_x2}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecayingMoments:
        moments = cls(float(data["half_life_seconds"]))
        moments.last_time = data.get("last_time")
        moments.weight = float(data["weight"])
        moments.sum_x = float(data["sum_x"])
        moments.sum_x2 = float(data["sum_x2"])
        return moments
