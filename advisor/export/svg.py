"""export.svg: the landing page's charts, drawn on the server as plain SVG (no JavaScript, no assets):
predicted concurrency against the ratio r from the pool model (advisor.model.split_pools), the
context-length distribution with its quantiles, and the recommendation's history. Pure functions of
their inputs; every number shown comes from the model or the published snapshot."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from advisor.estimate.histogram import BUCKET_ENDS, BUCKET_STARTS
from advisor.estimate.summary import WorkloadSummary
from advisor.model.pools import kv_capacity_requests, split_pools
from advisor.model.serving import slots_per_request
from advisor.recommend.types import Recommendation

WIDTH, HEIGHT = 600, 310
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 56, 16, 40, 44
CURVE_POINTS = 160
STATE_COLOUR, KV_COLOUR, LIVE_COLOUR, RECOMMENDED_COLOUR, AREA_COLOUR = (
    "#1f77b4", "#ff7f0e", "#555555", "#2ca02c", "#2ca02c",
)


def _fmt(value: float) -> str:
    """A short human number for tick labels: 0.25, 1.8, 2,310, 12.5k, 1.2M."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.3g}k"
    if magnitude >= 1e3:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _text(x: float, y: float, content: str, *, anchor: str = "middle", size: int = 11, colour: str = "#222",
          extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" fill="{colour}"{extra}>'
            f"{html.escape(content)}</text>")


@dataclass(frozen=True)
class _Axes:
    """Maps data coordinates to pixels inside the plot area; log or linear on each axis."""

    x_min: float
    x_max: float
    y_min: float
    y_max: float
    x_log: bool = False
    y_log: bool = False

    def _unit(self, value: float, low: float, high: float, log: bool) -> float:
        if log:
            value, low, high = math.log(max(value, 1e-300)), math.log(low), math.log(high)
        return 0.5 if high == low else (value - low) / (high - low)

    def x(self, value: float) -> float:
        return MARGIN_LEFT + self._unit(value, self.x_min, self.x_max, self.x_log) * (WIDTH - MARGIN_LEFT - MARGIN_RIGHT)

    def y(self, value: float) -> float:
        plot = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
        return HEIGHT - MARGIN_BOTTOM - self._unit(value, self.y_min, self.y_max, self.y_log) * plot


def _ticks(low: float, high: float, log: bool, count: int = 6) -> list[float]:
    if log:
        ticks = []
        for exponent in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
            for mantissa in (1, 2, 5):
                value = mantissa * 10.0**exponent
                if low <= value <= high:
                    ticks.append(value)
        return ticks
    span = high - low
    if span <= 0:
        return [low]
    step = 10 ** math.floor(math.log10(span / count))
    for multiple in (1, 2, 5, 10):
        if span / (step * multiple) <= count:
            step *= multiple
            break
    first = math.ceil(low / step) * step
    return [first + index * step for index in range(int((high - first) / step) + 1)]


def _frame(title: str, axes: _Axes, x_label: str, y_label: str, body: list[str], legend: list[tuple[str, str]],
           chart_id: str, x_format: Any = _fmt) -> str:
    left, right, top, bottom = MARGIN_LEFT, WIDTH - MARGIN_RIGHT, MARGIN_TOP, HEIGHT - MARGIN_BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{html.escape(chart_id)}" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" font-family="DejaVu Sans, sans-serif">',
        f"<title>{html.escape(title)}</title>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>',
        f'<clipPath id="{html.escape(chart_id)}-plot"><rect x="{left}" y="{top}" width="{right - left}" '
        f'height="{bottom - top}"/></clipPath>',
        _text(left, 16, title, anchor="start", size=13, extra=' font-weight="bold"'),
    ]
    for tick in _ticks(axes.x_min, axes.x_max, axes.x_log):
        x = axes.x(tick)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#eee"/>')
        parts.append(_text(x, bottom + 14, x_format(tick)))
    for tick in _ticks(axes.y_min, axes.y_max, axes.y_log, count=5):
        y = axes.y(tick)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(_text(left - 4, y + 4, _fmt(tick), anchor="end"))
    parts.append(f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" stroke="#999"/>')
    parts.append(_text((left + right) / 2, HEIGHT - 8, x_label))
    parts.append(_text(14, (top + bottom) / 2, y_label, extra=f' transform="rotate(-90 14 {(top + bottom) / 2:.1f})"'))
    parts.append(f'<g clip-path="url(#{html.escape(chart_id)}-plot)">')
    parts.extend(body)
    parts.append("</g>")
    legend_x = float(left)  # one row under the title, outside the plot: it never hides a curve or a mark
    for label, colour in legend:
        y = top - 8
        parts.append(f'<line x1="{legend_x:.1f}" y1="{y - 4}" x2="{legend_x + 16:.1f}" y2="{y - 4}" '
                     f'stroke="{colour}" stroke-width="3"/>')
        parts.append(_text(legend_x + 20, y, label, anchor="start", size=10))
        legend_x += 30 + 6 * len(label)
    parts.append("</svg>")
    return "\n".join(parts)


def _empty(title: str, message: str, chart_id: str) -> str:
    heading = _text(12, 24, title, anchor="start", size=13, extra=' font-weight="bold"')
    note = _text(12, 52, message, anchor="start", colour="#666")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" id="{html.escape(chart_id)}" width="{WIDTH}" height="80" '
            f'viewBox="0 0 {WIDTH} 80" role="img" font-family="DejaVu Sans, sans-serif"><title>{html.escape(title)}</title>'
            f'<rect width="{WIDTH}" height="80" fill="#fff" stroke="#ccc"/>{heading}{note}</svg>')


def _polyline(points: Sequence[tuple[float, float]], colour: str, *, width: float = 2, dash: str = "") -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dashes = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="{width}"{dashes}/>'


def _vertical(axes: _Axes, x_value: float, colour: str, label: str, *, dash: str = "", row: int = 0) -> list[str]:
    x = axes.x(x_value)
    top, bottom = MARGIN_TOP, HEIGHT - MARGIN_BOTTOM
    dashes = f' stroke-dasharray="{dash}"' if dash else ""
    return [f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="{colour}" stroke-width="2"{dashes}/>',
            _text(x + 3, top + 12 + 12 * row, label, anchor="start", size=10, colour=colour)]


@dataclass(frozen=True)
class ConcurrencyCurve:
    """Per DP worker, at each ratio: the state-pool clamp and the requests of length L the KV pool holds."""

    ratios: tuple[float, ...]
    state_clamp: tuple[float, ...]
    kv_capacity: tuple[float, ...]


def concurrency_curve(model: Any, context_length: float, ratios: Sequence[float]) -> ConcurrencyCurve:
    """The pool model's predictions over `ratios` for an advisor.recommend.engine.ServerModel."""
    serving = replace(model.serving, max_mamba_cache_size=None)
    slots = slots_per_request(serving)
    state, kv = [], []
    for ratio in ratios:
        split = split_pools(model.rest_bytes, replace(serving, mamba_full_memory_ratio=ratio), model.constants,
                            model_context_len=model.model_context_len)
        state.append(float(split.max_mamba_cache_size // slots))
        kv.append(kv_capacity_requests(split.kv_capacity_tokens, context_length, serving.dcp_size))
    return ConcurrencyCurve(tuple(ratios), tuple(state), tuple(kv))


def concurrency_chart(model: Any, rec: Recommendation | None, workload: WorkloadSummary, chart_id: str = "concurrency") -> str:
    """Predicted concurrency against r: state clamp, KV capacity, their minimum shaded; live and recommended r."""
    title = "Predicted concurrency against --mamba-full-memory-ratio"
    context = workload.effective_context_length or workload.context_length_mean
    if model is None or getattr(model, "constants", None) is None or not getattr(model, "rest_bytes", None):
        return _empty(title, "byte constants or pool memory unknown yet: no curve to draw", chart_id)
    if not context:
        return _empty(title, "no context lengths observed yet: no curve to draw", chart_id)
    marks = [value for value in (rec.live_ratio, rec.ratio, rec.ratio_lower, rec.ratio_upper) if value] if rec else []
    low = max(0.01, min([0.1, *marks]) / 3)
    high = min(100.0, max([4.0, *marks]) * 3)
    ratios = [low * (high / low) ** (index / (CURVE_POINTS - 1)) for index in range(CURVE_POINTS)]
    try:
        curve = concurrency_curve(model, float(context), ratios)
    except (ValueError, ZeroDivisionError) as exc:
        return _empty(title, f"the pool model cannot draw this server: {exc}", chart_id)
    concurrency = [min(s, k) for s, k in zip(curve.state_clamp, curve.kv_capacity, strict=True)]
    y_max = max(max(concurrency) * 1.6, 1.0)
    axes = _Axes(low, high, 0.0, y_max, x_log=True)
    body: list[str] = []
    if rec and rec.ratio_lower and rec.ratio_upper:
        x0, x1 = axes.x(rec.ratio_lower), axes.x(rec.ratio_upper)
        body.append(f'<rect x="{x0:.1f}" y="{MARGIN_TOP}" width="{max(x1 - x0, 1):.1f}" '
                    f'height="{HEIGHT - MARGIN_TOP - MARGIN_BOTTOM}" fill="{RECOMMENDED_COLOUR}" fill-opacity="0.12"/>')
    area = [(axes.x(r), axes.y(c)) for r, c in zip(ratios, concurrency, strict=True)]
    base = f"{axes.x(ratios[-1]):.1f},{axes.y(0):.1f} {axes.x(ratios[0]):.1f},{axes.y(0):.1f}"
    body.append(f'<polygon points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in area)} {base}" '
                f'fill="{AREA_COLOUR}" fill-opacity="0.10" stroke="none"/>')
    body.append(_polyline([(axes.x(r), axes.y(v)) for r, v in zip(ratios, curve.state_clamp, strict=True)], STATE_COLOUR))
    body.append(_polyline([(axes.x(r), axes.y(v)) for r, v in zip(ratios, curve.kv_capacity, strict=True)], KV_COLOUR))
    if rec and rec.live_ratio:
        body.extend(_vertical(axes, rec.live_ratio, LIVE_COLOUR, f"live r {rec.live_ratio:.3g}", dash="5,4"))
    if rec and rec.ratio:
        body.extend(_vertical(axes, rec.ratio, RECOMMENDED_COLOUR, f"recommended r {rec.ratio:.3g}", row=1))
    legend = [("state-pool clamp (requests)", STATE_COLOUR), (f"KV capacity at L {_fmt(float(context))}", KV_COLOUR)]
    return _frame(title, axes, "--mamba-full-memory-ratio r (log scale)", "requests per DP worker", body, legend, chart_id)


def goodput_chart(rec: Recommendation | None, chart_id: str = "goodput") -> str:
    """The what-if replay's curve: goodput of the server's recent traffic replayed at each candidate r, with the
    plateau within noise of the best shaded, and the live and recommended r."""
    title = "Replayed goodput against --mamba-full-memory-ratio"
    if rec is None or len(rec.goodput_curve) < 2:
        return _empty(title, "no replay yet: it needs the pool sizes and enough observed requests", chart_id)
    ratios = [r for r, _ in rec.goodput_curve]
    values = [g for _, g in rec.goodput_curve]
    marks = [value for value in (rec.live_ratio, rec.ratio) if value]
    low, high = min([*ratios, *marks]) / 1.2, max([*ratios, *marks]) * 1.2
    axes = _Axes(low, high, 0.0, max(max(values) * 1.25, 1.0), x_log=True)
    body: list[str] = []
    if rec.ratio and rec.goodput_curve_width_ratio and rec.ratio_lower and rec.ratio_upper:
        x0, x1 = axes.x(rec.ratio_lower), axes.x(rec.ratio_upper)
        body.append(f'<rect x="{x0:.1f}" y="{MARGIN_TOP}" width="{max(x1 - x0, 1):.1f}" '
                    f'height="{HEIGHT - MARGIN_TOP - MARGIN_BOTTOM}" fill="{RECOMMENDED_COLOUR}" fill-opacity="0.12"/>')
    body.append(_polyline([(axes.x(r), axes.y(g)) for r, g in rec.goodput_curve], STATE_COLOUR))
    body.extend(f'<circle cx="{axes.x(r):.1f}" cy="{axes.y(g):.1f}" r="3" fill="{STATE_COLOUR}"/>'
                for r, g in rec.goodput_curve)
    if rec.live_ratio:
        body.extend(_vertical(axes, rec.live_ratio, LIVE_COLOUR, f"live r {rec.live_ratio:.3g}", dash="5,4"))
    if rec.ratio:
        body.extend(_vertical(axes, rec.ratio, RECOMMENDED_COLOUR, f"recommended r {rec.ratio:.3g}", row=1))
    scored = ("raw, no split meets the queue bound" if rec.replay_metric == "raw_goodput"
              else "3/4 within-SLO + 1/4 raw")
    legend = [(f"replayed goodput, {scored} (output tokens/s)", STATE_COLOUR)]
    return _frame(title, axes, "--mamba-full-memory-ratio r (log scale)", "output tokens/s", body, legend, chart_id)


def _regrouped(weights: Sequence[float], group: int) -> list[tuple[float, float, float]]:
    """(start, end, weight) bins of `group` histogram buckets each, empty bins at the ends dropped."""
    bins = []
    for first in range(0, len(weights), group):
        last = min(first + group, len(weights)) - 1
        end = float(BUCKET_ENDS[last]) if math.isfinite(BUCKET_ENDS[last]) else float(BUCKET_STARTS[last]) * 1.05**group
        bins.append((float(BUCKET_STARTS[first]), end, float(sum(weights[first:last + 1]))))
    nonzero = [index for index, (_, _, weight) in enumerate(bins) if weight > 0]
    return bins[nonzero[0]:nonzero[-1] + 1] if nonzero else []


def context_chart(weights: Sequence[float] | None, workload: WorkloadSummary, chart_id: str = "context") -> str:
    """The recency-weighted context-length histogram (share of requests per bin) with p50/p90/p99/mean/L_eff."""
    title = "Context length (prompt + output) of finished requests"
    if not weights or len(weights) != len(BUCKET_STARTS) or not sum(weights) > 0:
        return _empty(title, "no finished requests observed yet", chart_id)
    total = float(sum(weights))
    bins = _regrouped([w / total for w in weights], group=5)  # 5 buckets of 5% each: bins ~28% wide
    low, high = max(bins[0][0], 1.0), bins[-1][1]
    marks = [("p50", workload.context_length_p50), ("p90", workload.context_length_p90),
             ("p99", workload.context_length_p99), ("mean", workload.context_length_mean),
             ("L_eff", workload.effective_context_length)]
    values = [value for _, value in marks if value]
    low, high = min([low, *values]) / 1.2, max([high, *values]) * 1.2
    axes = _Axes(low, high, 0.0, max(weight for _, _, weight in bins) * 1.25, x_log=True)
    body = []
    for start, end, weight in bins:
        x0, x1 = axes.x(max(start, low)), axes.x(end)
        y = axes.y(weight)
        body.append(f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0 - 1, 1):.1f}" '
                    f'height="{axes.y(0) - y:.1f}" fill="{STATE_COLOUR}" fill-opacity="0.55"/>')
    colours = {"p50": "#444", "p90": "#9467bd", "p99": "#d62728", "mean": "#8c564b", "L_eff": KV_COLOUR}
    for row, (label, value) in enumerate(marks):
        if value:
            body.extend(_vertical(axes, value, colours[label], f"{label} {_fmt(value)}", dash="4,3", row=row))
    return _frame(title, axes, "tokens (log scale)", "share of requests", body, [], chart_id)


def history_chart(points: Sequence[Any], chart_id: str = "history") -> str:
    """Recommended r with its band and the live r over the kept history (advisor time, minutes ago)."""
    title = "Recommendation history"
    usable = [p for p in points if p.ratio or p.live_ratio]
    if len(usable) < 2:
        return _empty(title, f"{len(usable)} cycle(s) with a ratio so far: a history needs two", chart_id)
    end = usable[-1].time
    values = [v for p in usable for v in (p.ratio, p.ratio_lower, p.ratio_upper, p.live_ratio) if v]
    start_minutes = (usable[0].time - end) / 60
    axes = _Axes(min(start_minutes, -1e-3), 0.0, 0.0, max(values) * 1.25)
    body = []
    band = [p for p in usable if p.ratio_lower and p.ratio_upper]
    if len(band) >= 2:
        upper = " ".join(f"{axes.x((p.time - end) / 60):.1f},{axes.y(p.ratio_upper):.1f}" for p in band)
        lower = " ".join(f"{axes.x((p.time - end) / 60):.1f},{axes.y(p.ratio_lower):.1f}" for p in reversed(band))
        body.append(f'<polygon points="{upper} {lower}" fill="{RECOMMENDED_COLOUR}" fill-opacity="0.15" stroke="none"/>')
    for field_name, colour, dash in (("ratio", RECOMMENDED_COLOUR, ""), ("live_ratio", LIVE_COLOUR, "5,4")):
        line = [(axes.x((p.time - end) / 60), axes.y(getattr(p, field_name))) for p in usable if getattr(p, field_name)]
        if line:
            body.append(_polyline(line, colour, dash=dash))
    previous = None
    for point in usable:
        if point.decision and point.decision != previous:
            x = axes.x((point.time - end) / 60)
            body.append(f'<line x1="{x:.1f}" y1="{HEIGHT - MARGIN_BOTTOM - 8}" x2="{x:.1f}" y2="{HEIGHT - MARGIN_BOTTOM}" stroke="#000"/>')
            body.append(_text(x + 2, HEIGHT - MARGIN_BOTTOM - 10, point.decision, anchor="start", size=9, colour="#333"))
            previous = point.decision
    legend = [("recommended r (band shaded)", RECOMMENDED_COLOUR), ("live r", LIVE_COLOUR)]
    return _frame(title, axes, "minutes before the last cycle", "--mamba-full-memory-ratio", body, legend, chart_id,
                  x_format=lambda value: f"{value:.3g}")
