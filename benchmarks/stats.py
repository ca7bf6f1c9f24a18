"""Percentiles and medians (times in, milliseconds out)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["median", "median_of", "percentile", "summary_ms"]


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of already sorted values, nearest rank."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary_ms(seconds: Iterable[float]) -> dict[str, float]:
    """count, mean, p50, p99 and max of durations given in seconds, in milliseconds."""
    ordered = sorted(seconds)
    if not ordered:
        return {"count": 0, "mean": math.nan, "p50": math.nan, "p99": math.nan, "max": math.nan}
    return {
        "count": len(ordered),
        "mean": statistics.fmean(ordered) * 1e3,
        "p50": percentile(ordered, 50) * 1e3,
        "p99": percentile(ordered, 99) * 1e3,
        "max": ordered[-1] * 1e3,
    }


def median(values: Iterable[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def median_of(runs: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """Field by field median of repeated runs' metrics (numbers); other fields from the first.

    A field that is a number in every run gets the median; ``True`` wins for flags (a stall or
    a violation in any run is reported).
    """
    if not runs:
        return {}
    merged: dict[str, object] = {}
    for key in runs[0]:
        values = [run.get(key) for run in runs]
        if all(isinstance(v, bool) for v in values):
            merged[key] = any(values)
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            merged[key] = median(float(v) for v in values if isinstance(v, int | float))
        else:
            merged[key] = values[0]
    return merged
