"""What the numbers were measured on: CPU, cores, memory, Python, libraries, date."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # no stubs in the dev environment

__all__ = ["describe", "versions"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe() -> dict[str, object]:
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def versions(distributions: Iterable[str]) -> dict[str, str]:
    """Installed version of each distribution ("not installed" if it is not)."""
    found = {}
    for name in sorted(set(distributions)):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found
