"""TLS options on a backend that cannot use TLS yet: refused, with a ``ValueError`` saying so.

Someone who adds ``?ssl_ca_certs=...`` to a URL expects an encrypted connection. Connecting
in the clear anyway would be worse than refusing, and "unknown option" would suggest a typo,
so a backend without TLS declares these options (:data:`NO_TLS_OPTIONS`) and refuses them
(:func:`refuse_tls`). ``ssl=false`` asks for nothing and passes.

Example::

    options: ClassVar[Mapping[str, type]] = {"connect_timeout": float, **NO_TLS_OPTIONS}

    def __init__(self, url: ParsedURL, options: Mapping[str, Any]) -> None:
        refuse_tls(url.scheme, options, "docs/zookeeper.md")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["NO_TLS_OPTIONS", "refuse_tls"]

NO_TLS_OPTIONS: Final[Mapping[str, type]] = {
    "ssl": bool,
    "tls": bool,
    # redis-py's names (what rediss:// takes) ...
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": str,
    "ssl_check_hostname": bool,
    # ... and the MySQL clients' names.
    "ssl_ca": str,
    "ssl_cert": str,
    "ssl_key": str,
}


def refuse_tls(scheme: str, options: Mapping[str, Any], docs: str) -> None:
    """``ValueError`` if ``options`` ask for TLS, which ``scheme://`` does not support yet."""
    given = sorted(
        key for key in NO_TLS_OPTIONS if options.get(key) is not None and options[key] is not False
    )
    if given:
        raise ValueError(
            f"{scheme}:// does not support TLS yet (option {', '.join(given)}); "
            f"connections are not encrypted: see {docs}"
        )
