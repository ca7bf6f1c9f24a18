"""One option vocabulary for every backend, the driver-native spellings still accepted.

A concept that several services share has one name on every backend that has it:
``connect_timeout``, ``request_timeout``, ``session_ttl``, ``tls``, ``tls_ca``, ``tls_cert``,
``tls_key`` and ``tls_verify``. A backend that documented a native spelling before
(``query_timeout``, ``ssl_ca``, ``sslrootcert``...) keeps accepting it as an alias: it
declares both names in its ``options`` (:func:`with_aliases`) and reads the canonical one from
:func:`canonical`, which refuses the two spellings given together. Error messages name the
option as the user spelled it (:meth:`Options.given`).

Example::

    ALIASES = {"query_timeout": "request_timeout"}
    options = canonical({"query_timeout": 2.0}, ALIASES)
    options["request_timeout"]          # 2.0
    options.given("request_timeout")    # "query_timeout"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["VOCABULARY", "Options", "canonical", "with_aliases"]

VOCABULARY: Final[Mapping[str, type]] = {
    "connect_timeout": float,
    "request_timeout": float,
    "session_ttl": float,
    "tls": bool,
    "tls_ca": str,
    "tls_cert": str,
    "tls_key": str,
    "tls_verify": bool,
}
"""The canonical names and their types (the options table is in docs/options.md)."""


class Options(dict[str, Any]):
    """Options under their canonical names, remembering how each was spelled."""

    def __init__(self, items: Mapping[str, Any], spelled: Mapping[str, str]) -> None:
        super().__init__(items)
        self.spelled: Mapping[str, str] = dict(spelled)
        """Canonical name → the alias the user gave, for options given under an alias."""

    def given(self, name: str) -> str:
        """The spelling the user gave for the canonical option ``name`` (``name`` itself if
        it was given so, or not given)."""
        return self.spelled.get(name, name)


def canonical(options: Mapping[str, Any], aliases: Mapping[str, str]) -> Options:
    """``options`` with each alias (``aliases``: native name → canonical name) renamed.

    Raises:
        ValueError: an option given under two of its names.
    """
    items: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for name, value in options.items():
        target = aliases.get(name, name)
        if target in items:
            first = spelled.get(target, target)
            raise ValueError(
                f"options {first} and {name} are two names of one option: give only one"
            )
        items[target] = value
        if target != name:
            spelled[target] = name
    if isinstance(options, Options):
        spelled = {**options.spelled, **spelled}
    return Options(items, spelled)


def with_aliases(accepted: Mapping[str, type], aliases: Mapping[str, str]) -> dict[str, type]:
    """``accepted`` plus every alias of it, with the type of the option it stands for (the
    ``options`` a backend declares, so URL query strings convert aliases too)."""
    return {**accepted, **{alias: accepted[target] for alias, target in aliases.items()}}
