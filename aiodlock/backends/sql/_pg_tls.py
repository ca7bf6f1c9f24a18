"""asyncpg's ``ssl`` argument from the postgres backend's TLS options.

libpq's names keep libpq's meanings: ``sslmode`` (``disable``, ``allow``, ``prefer`` — the
default —, ``require``, ``verify-ca``, ``verify-full``), ``sslrootcert``, ``sslcert`` and
``sslkey``. The canonical names of every backend work too: ``tls_ca``, ``tls_cert`` and
``tls_key`` are ``sslrootcert``, ``sslcert`` and ``sslkey``; ``tls=true`` verifies the
server's certificate and host name (``verify-full``) against ``tls_ca`` or else the system's
CAs; ``tls_verify=false`` encrypts without verifying (``require`` without a CA); ``tls=false``
is ``disable``. ``sslmode`` and ``tls``/``tls_verify`` are two ways to say one thing: give one.
``tls_ca``/``tls_cert`` alone imply ``tls``. The table is in docs/postgres.md.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any, Final

from .. import Options, canonical_options, with_aliases

__all__ = ["PG_TLS_ALIASES", "PG_TLS_OPTIONS", "pg_tls"]

PG_TLS_ALIASES: Final[Mapping[str, str]] = {
    "sslrootcert": "tls_ca",
    "sslcert": "tls_cert",
    "sslkey": "tls_key",
}
PG_TLS_OPTIONS: Final[Mapping[str, type]] = {
    "sslmode": str,
    "tls": bool,
    "tls_verify": bool,
    **with_aliases({"tls_ca": str, "tls_cert": str, "tls_key": str}, PG_TLS_ALIASES),
}
_SSL_MODES: Final = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def pg_tls(options: Mapping[str, Any]) -> ssl.SSLContext | str | bool | None:
    """asyncpg's ``ssl`` argument (see the module docstring); None: asyncpg's default.

    Raises:
        ValueError, TypeError: contradictory options, or one of the wrong type.
    """
    opts = canonical_options(
        {k: v for k, v in options.items() if k in PG_TLS_OPTIONS}, PG_TLS_ALIASES
    )
    for name in ("sslmode", "tls_ca", "tls_cert", "tls_key"):
        value = opts.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"{opts.given(name)} must be a non-empty str")
    for name in ("tls", "tls_verify"):
        value = opts.get(name)
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    cert, key = opts.get("tls_cert"), opts.get("tls_key")
    if (cert is None) != (key is None):
        raise ValueError(
            f"{opts.given('tls_cert')} and {opts.given('tls_key')} go together "
            "(a client certificate and its key)"
        )
    canonical = [name for name in ("tls", "tls_verify") if opts.get(name) is not None]
    if opts.get("sslmode") is not None:
        if canonical:
            raise ValueError(
                f"sslmode and {' and '.join(canonical)} are two ways to say one thing: give one"
            )
        return _libpq(opts)
    # tls_ca / tls_cert without sslmode ask for TLS, as on every backend (sslrootcert alone is
    # libpq's prefer, refused below).
    files = [name for name in ("tls_ca", "tls_cert") if opts.get(name) is not None]
    if canonical or any(opts.given(name) == name for name in files):
        return _canonical(opts)
    return _libpq(opts)


def _canonical(opts: Options) -> ssl.SSLContext | bool:
    """``tls`` / ``tls_verify``: verify-full by default, ``tls_verify=false`` unverified."""
    root, cert = opts.get("tls_ca"), opts.get("tls_cert")
    if opts.get("tls") is False:
        if root is not None or cert is not None or opts.get("tls_verify") is not None:
            raise ValueError("tls=false contradicts the other TLS options: drop one")
        return False
    context = ssl.create_default_context(cafile=root)
    if opts.get("tls_verify") is False:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(cert, opts.get("tls_key"))
    return context


def _libpq(opts: Options) -> ssl.SSLContext | str | bool | None:
    """``sslmode`` with libpq's meaning: ``verify-full`` checks the certificate and the host
    name, ``verify-ca`` the certificate only, ``require`` encrypts (and checks the
    certificate if a root certificate is given)."""
    mode, root = opts.get("sslmode"), opts.get("tls_ca")
    cert, key = opts.get("tls_cert"), opts.get("tls_key")
    root_name = opts.given("tls_ca")
    if mode is not None and mode not in _SSL_MODES:
        raise ValueError(f"sslmode must be one of {', '.join(_SSL_MODES)}, not {mode!r}")
    files = root is not None or cert is not None
    if mode == "disable":
        if files:
            raise ValueError(f"sslmode=disable contradicts {root_name}/sslcert: drop one")
        return False
    if mode in ("verify-ca", "verify-full") and root is None:
        raise ValueError(f"sslmode={mode} needs sslrootcert (the CA certificate file)")
    if mode is None and not files:
        return None  # asyncpg's default, libpq's: prefer
    if mode in (None, "allow", "prefer") and not files:
        return mode
    if mode in (None, "allow", "prefer"):
        raise ValueError(
            f"sslmode={mode or 'prefer'} may fall back to a plain connection: with "
            "certificate files, say sslmode=require, verify-ca or verify-full"
        )
    context = ssl.create_default_context(cafile=root)
    context.check_hostname = mode == "verify-full"
    if root is None:  # require without a CA: encrypted, not authenticated (as libpq)
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context
