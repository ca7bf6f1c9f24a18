"""Client TLS settings from URL options, for drivers that take an :class:`ssl.SSLContext`.

The options are the names MySQL's own clients use: ``ssl`` (turn TLS on, trusting the system's
CAs), ``ssl_ca`` (a CA bundle to trust instead; implies ``ssl``), ``ssl_cert`` and
``ssl_key`` (a client certificate, and its key when it is not in the same file), and
``ssl_check_hostname`` (default true: the server's certificate must name the host of the URL).
A file that cannot be read is a ``ValueError`` naming the option and the path, raised when the
client is made, not at the first lock.

Example::

    context = tls_context(options, scheme="mysql")  # None: no TLS asked for
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["TLS_OPTIONS", "tls_context"]

TLS_OPTIONS: Final[Mapping[str, type]] = {
    "ssl": bool,
    "ssl_ca": str,
    "ssl_cert": str,
    "ssl_key": str,
    "ssl_check_hostname": bool,
}
_FILES: Final = ("ssl_ca", "ssl_cert", "ssl_key")


def tls_context(options: Mapping[str, Any], *, scheme: str) -> ssl.SSLContext | None:
    """The context ``options`` ask for, or None when they ask for no TLS.

    Raises:
        ValueError: contradictory options, or a file that cannot be used.
        TypeError: an option of the wrong type.
    """
    files = {}
    for name in _FILES:
        value = options.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise TypeError(f"option {name} must be a non-empty str (a file path)")
        files[name] = value
    wanted = options.get("ssl")
    check_hostname = options.get("ssl_check_hostname", True)
    for name, value in (("ssl", wanted), ("ssl_check_hostname", check_hostname)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"option {name} must be a bool, got {type(value).__name__}")
    if wanted is False:
        if files:
            raise ValueError(
                f"ssl=false contradicts {', '.join(sorted(files))}: drop one of them"
            )
        return None
    if not wanted and not files:
        return None
    if "ssl_key" in files and "ssl_cert" not in files:
        raise ValueError("ssl_key needs ssl_cert (the client certificate it belongs to)")
    try:
        context = ssl.create_default_context(cafile=files.get("ssl_ca"))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"{scheme}:// option ssl_ca={files['ssl_ca']!r}: {exc}") from None
    context.check_hostname = bool(check_hostname)
    if "ssl_cert" in files:
        try:
            context.load_cert_chain(files["ssl_cert"], files.get("ssl_key"))
        except (OSError, ssl.SSLError) as exc:
            given = ", ".join(f"{k}={files[k]!r}" for k in ("ssl_cert", "ssl_key") if k in files)
            raise ValueError(f"{scheme}:// options {given}: {exc}") from None
    return context
