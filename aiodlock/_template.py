"""Lock names made from a template: ``"order:{order_id}"`` + values → ``"order:42"``.

The integrations (a FastAPI path parameter, an aiohttp ``match_info`` entry) and the
``exclusive`` decorator (a function's arguments) all name a lock from a template. The one rule
that matters: a field that has no value is an error, said in plain words as early as the
caller can know it — never a lock on the literal text ``"{order_id}"``, which every request
would share::

    template = NameTemplate("order:{order_id}")
    template.fields                       # frozenset({'order_id'})
    template.format({"order_id": 42})     # 'order:42'
    template.format({})                   # KeyError: ... has no value for {order_id}
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any, final

from ._validate import check_name

__all__ = ["NameTemplate"]


@final
class NameTemplate:
    """A lock name with ``{field}`` placeholders, checked when it is made.

    Fields are plain identifiers, optionally with a format spec (``"{day:%Y-%m-%d}"``);
    positional (``{}``, ``{0}``), attribute (``{order.id}``) and index (``{ids[0]}``) fields are
    refused, since nothing names them reliably. ``{{`` and ``}}`` stand for a literal brace.
    """

    __slots__ = ("fields", "template")

    def __init__(self, template: str) -> None:
        check_name(template, argument="name_template")
        fields: set[str] = set()
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise ValueError(f"bad lock name template {template!r}: {exc}") from None
        for _, field, _, _ in parsed:
            if field is None:
                continue
            if not field.isidentifier():
                raise ValueError(
                    f"bad lock name template {template!r}: {{{field}}} is not a plain name; "
                    "use named fields such as {order_id}"
                )
            fields.add(field)
        self.template = template
        self.fields = frozenset(fields)

    def missing(self, available: Mapping[str, Any] | frozenset[str] | set[str]) -> list[str]:
        """The fields with no value among ``available`` (names or a mapping), sorted."""
        return sorted(field for field in self.fields if field not in available)

    def format(self, values: Mapping[str, Any], *, source: str = "the values given") -> str:
        """The lock name for ``values``.

        Raises:
            KeyError: a field has no value in ``values`` (``source`` says where they came from).
        """
        missing = self.missing(values)
        if missing:
            fields = ", ".join(f"{{{field}}}" for field in missing)
            raise KeyError(
                f"lock name template {self.template!r}: {source} have no value for {fields}"
            )
        return self.template.format_map(values)

    def __repr__(self) -> str:
        return f"NameTemplate({self.template!r})"
