"""The PNG: contended throughput and p99 wait per library (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .report import BACKEND_TITLES

__all__ = ["write"]

COLORS = {"aiodlock": "#2b7bba", "incumbent": "#e08a2c", "floor": "#888888",
          "reference": "#9e9e9e"}  # fmt: skip


def write(doc: Mapping[str, Any], path: Path) -> bool:
    """Draw the contended rows of ``doc`` into ``path``; False (nothing written, an older
    chart removed) when the run had none, as ``--only mysql,postgres`` (uncontended only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    libs = doc["libraries"]
    rows = [r for r in doc["results"] if r["scenario"] in ("contended", "contended_procs")
            and r["median"] and isinstance(r["median"].get("throughput"), int | float)]  # fmt: skip
    order = {backend: i for i, backend in enumerate([*BACKEND_TITLES, "none"])}
    catalogue = list(libs)
    rows.sort(key=lambda r: (order[libs[r["library"]]["backend"]], catalogue.index(r["library"]),
                             r["scenario"], r["loop"]))  # fmt: skip
    if not rows:  # a log-scaled axis of no values is an error to matplotlib
        path.unlink(missing_ok=True)  # a chart of another run would pass for this one's
        return False
    labels = []
    for r in rows:
        lib = libs[r["library"]]
        procs = ""
        if r["scenario"] == "contended_procs":
            procs = f" \N{MULTIPLICATION SIGN}{doc['settings']['workers']} processes"
        backend = "" if lib["backend"] == "none" else f"{lib['backend']}: "
        labels.append(f"{backend}{lib['label']}{procs} [{r['loop']}]")
    colors = [COLORS[libs[r["library"]]["role"]] for r in rows]
    throughput = [float(r["median"]["throughput"]) for r in rows]
    p99 = [max(float(r["median"]["wait_p99"] or math.nan), 0.01) for r in rows]
    worst = [max(float(r["median"]["wait_max"] or math.nan), 0.01) for r in rows]
    s = doc["settings"]

    height = max(4.0, 0.32 * len(rows) + 1.5)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, height), sharey=True)
    ys = range(len(rows))
    left.barh(ys, throughput, color=colors)
    left.axvline(1.0 / s["section"], color="black", linestyle="--", linewidth=0.8)
    left.set_xlabel(f"grants/s ({s['workers']} workers, {s['section'] * 1000:g} ms section; "
                    "dashed: ideal)")  # fmt: skip
    left.set_yticks(list(ys), labels, fontsize=8)
    left.invert_yaxis()
    left.set_title("Contended throughput (higher is better)")
    right.barh(ys, p99, color=colors)
    right.scatter(worst, list(ys), marker="|", s=120, color="black", label="max wait")
    right.set_xscale("log")
    right.set_xlabel("wait, ms (log scale): bar = p99, | = max")
    right.set_title("Contended wait (lower is better)")
    right.legend(loc="lower right", fontsize=8)
    for axis in (left, right):
        axis.grid(axis="x", alpha=0.3)
    quick = " — quick smoke run" if doc["quick"] else ""
    fig.suptitle(f"aiodlock vs incumbents, medians of {s['repeat']} run(s){quick} — "
                 f"{doc['machine']['cpu']}, {doc['machine']['cores']} cores")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
