"""A Griffe extension for the API page: the docstrings' Sphinx roles become links.

The docstrings are written for readers of the source and for ``help()``, in the Sphinx
spelling (``:class:`~aiodlock.LockLostError```, ``:meth:`extend```). mkdocstrings reads
Markdown, so without this they render literally. Each role becomes an *optional* autorefs
cross-reference: a link where the target is on the site, plain code where it is not (a
private helper), never a broken reference failing the strict build.

Loaded by mkdocs.yml (``extensions: [scripts/griffe_sphinx_roles.py]``); not part of the package.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

# :class:`Name`, :meth:`~pkg.mod.Class.method`, :func:`.relative` ... (roles of the Python domain)
# ... and the explicit title form, :meth:`the election <LockClient.election>`.
_ROLE = re.compile(
    r":(?:py:)?(?:class|meth|func|attr|data|exc|mod|obj):"
    r"`(?:(?P<title>[^`<]+?)\s*<(?P<titled>~?[\w.]+)>|(?P<tilde>~?)(?P<target>[\w.]+))`"
)


def _target_path(obj: griffe.Object, target: str) -> str:
    """The full dotted path ``target`` names, seen from ``obj`` (as Sphinx resolves it)."""
    if target.startswith("."):  # relative to the object's package
        package = obj.module.path if obj.module.is_init_module else obj.module.parent
        base = package.path if isinstance(package, griffe.Object) else str(package)
        return f"{base}{target}"
    head, _, rest = target.partition(".")
    try:
        resolved = obj.resolve(head)
    except (griffe.NameResolutionError, AttributeError):
        # A bare member name (:meth:`extend`) in a class's docstring or one of its members'.
        owner = obj if obj.is_class else obj.parent
        if isinstance(owner, griffe.Object) and owner.is_class and head in owner.members:
            return f"{owner.path}.{target}"
        return target
    return f"{resolved}.{rest}" if rest else resolved


def _public(path: str) -> str:
    """``aiodlock._client.LockClient`` as the site shows it: ``aiodlock.LockClient`` (the
    private modules' names are re-exported by their packages, which the page renders)."""
    parts = path.split(".")
    return ".".join(p for i, p in enumerate(parts) if i == 0 or not p.startswith("_"))


def _crossref(obj: griffe.Object, match: re.Match[str]) -> str:
    if match["titled"] is not None:
        target, shown = match["titled"].lstrip("~"), match["title"]
    else:
        target = match["target"]
        shown = target.rsplit(".", 1)[-1] if match["tilde"] else target.lstrip(".")
    path = _public(_target_path(obj, target))
    title = f"<code>{html.escape(shown)}</code>"
    return f'<autoref identifier="{html.escape(path)}" optional>{title}</autoref>'


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring as optional cross-references."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(lambda m: _crossref(obj, m), obj.docstring.value)
