"""Client TLS settings from URL options, for drivers that take an :class:`ssl.SSLContext`.

The options: ``tls`` (turn TLS on, trusting the system's CAs), ``tls_ca`` (a CA bundle to
trust instead; implies ``tls``), ``tls_cert`` and ``tls_key`` (a client certificate, and its
key when it is not in the same file), ``tls_verify`` (default true: the server's certificate
must be signed by a trusted CA and name the host of the URL; false checks neither, for tests
only). MySQL's client spellings are accepted too: ``ssl``, ``ssl_ca``, ``ssl_cert``,
``ssl_key``, and ``ssl_check_hostname`` (false: the certificate is still verified, its host
name is not). A file that cannot be read is a ``ValueError`` naming the option and the path,
raised when the client is made, not at the first lock.

Example::

    context = tls_context(options, scheme="mysql")  # None: no TLS asked for
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any, Final

from ._options import canonical, with_aliases

__all__ = ["TLS_ALIASES", "TLS_OPTIONS", "tls_context"]

TLS_ALIASES: Final[Mapping[str, str]] = {
    "ssl": "tls",
    "ssl_ca": "tls_ca",
    "ssl_cert": "tls_cert",
    "ssl_key": "tls_key",
}
TLS_OPTIONS: Final[Mapping[str, type]] = {
    **with_aliases(
        {"tls": bool, "tls_ca": str, "tls_cert": str, "tls_key": str, "tls_verify": bool},
        TLS_ALIASES,
    ),
    "ssl_check_hostname": bool,
}
"""Every TLS option :func:`tls_context` reads, canonical names and aliases."""
_FILES: Final = ("tls_ca", "tls_cert", "tls_key")


def tls_context(options: Mapping[str, Any], *, scheme: str) -> ssl.SSLContext | None:
    """The context ``options`` ask for, or None when they ask for no TLS.

    Raises:
        ValueError: contradictory options, or a file that cannot be used.
        TypeError: an option of the wrong type.
    """
    opts = canonical({k: v for k, v in options.items() if k in TLS_OPTIONS}, TLS_ALIASES)
    files = {}
    for name in _FILES:
        value = opts.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise TypeError(f"option {opts.given(name)} must be a non-empty str (a file path)")
        files[name] = value
    wanted = opts.get("tls")
    verify = opts.get("tls_verify", True)
    check_hostname = opts.get("ssl_check_hostname", True)
    for name, value in (
        ("tls", wanted),
        ("tls_verify", verify),
        ("ssl_check_hostname", check_hostname),
    ):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"option {opts.given(name)} must be a bool, got {type(value).__name__}")
    if wanted is False:
        if files or "tls_verify" in opts:
            given = sorted(opts.given(name) for name in (*files, "tls_verify") if name in opts)
            raise ValueError(
                f"{opts.given('tls')}=false contradicts {', '.join(given)}: drop one of them"
            )
        return None
    if not wanted and not files:
        return None
    if "tls_key" in files and "tls_cert" not in files:
        key = opts.given("tls_key")
        cert = "ssl_cert" if key == "ssl_key" else "tls_cert"  # in the spelling the user chose
        raise ValueError(f"{key} needs {cert} (the client certificate it belongs to)")
    try:
        context = ssl.create_default_context(cafile=files.get("tls_ca"))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"{scheme}:// option {opts.given('tls_ca')}={files['tls_ca']!r}: {exc}"
        ) from None
    context.check_hostname = bool(check_hostname) and bool(verify)
    if not verify:
        context.verify_mode = ssl.CERT_NONE
    if "tls_cert" in files:
        try:
            context.load_cert_chain(files["tls_cert"], files.get("tls_key"))
        except (OSError, ssl.SSLError) as exc:
            shown = ", ".join(
                f"{opts.given(k)}={files[k]!r}" for k in ("tls_cert", "tls_key") if k in files
            )
            raise ValueError(f"{scheme}:// options {shown}: {exc}") from None
    return context
