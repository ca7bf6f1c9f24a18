"""The etcd backend's options, read once from the URL and the keyword options.

``session_ttl``, ``connect_timeout`` and ``request_timeout``, and TLS: ``tls``, ``tls_ca``,
``tls_cert``, ``tls_key`` (or their ``ssl``/``ssl_ca``/... spellings) as gRPC channel
credentials. The table with the defaults: docs/etcd.md, "URL and options". ``identity`` is the
client's (``connect()`` passes it; ``host:pid`` for a backend made directly), written once
per session lease, in the lease's identity key (:func:`._keys.identity_key`).

Example::

    settings = EtcdSettings.from_url(parse_url("etcd://h1,h2/locks"), {"session_ttl": 5})
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

from ..._validate import check_identity, default_identity
from .. import (
    TLS_ALIASES,
    TLS_OPTIONS,
    Options,
    ParsedURL,
    canonical_options,
    check_seconds,
)
from ._keys import encode_segment

__all__ = ["OPTIONS", "EtcdSettings"]

OPTIONS: Final[Mapping[str, type]] = {
    "session_ttl": float,
    "connect_timeout": float,
    "request_timeout": float,
    "identity": str,  # the client's, passed by connect(): inspect names holders by it
    **TLS_OPTIONS,
}
"""Every option the backend accepts, canonical names and their aliases."""

_DEFAULT_PORT: Final = 2379
_DEFAULT_SESSION_TTL: Final = 10.0
_DEFAULT_CONNECT_TIMEOUT: Final = 5.0
_DEFAULT_REQUEST_TIMEOUT: Final = 5.0
_FILES: Final = ("tls_ca", "tls_cert", "tls_key")


@dataclass(frozen=True, slots=True)
class EtcdSettings:
    """Where the cluster is, where our keys live, and how long things may take."""

    endpoints: tuple[str, ...]
    root: str  # every key of ours starts with it ("/aiodlock" unless the URL has a path)
    session_ttl: float
    connect_timeout: float
    request_timeout: float
    credentials: Any  # grpc.ChannelCredentials, or None for plaintext
    identity: str  # the client's identity, in the identity key of each of our leases

    @classmethod
    def from_url(cls, url: ParsedURL, options: Mapping[str, Any]) -> EtcdSettings:
        """Raises ValueError (or TypeError) for a URL or options that cannot work."""
        if not url.hosts:
            raise ValueError("etcd:// url needs a host: etcd://h1:2379,h2:2379/prefix")
        if (url.username is None) != (url.password is None):
            raise ValueError(f"{url.redacted()}: give both a user name and a password, or neither")
        return cls(
            endpoints=tuple(
                f"{host or 'localhost'}:{port or _DEFAULT_PORT}" for host, port in url.hosts
            ),
            root=_prefix(url.path),
            session_ttl=_seconds(options, "session_ttl", _DEFAULT_SESSION_TTL),
            connect_timeout=_seconds(options, "connect_timeout", _DEFAULT_CONNECT_TIMEOUT),
            request_timeout=_seconds(options, "request_timeout", _DEFAULT_REQUEST_TIMEOUT),
            credentials=_credentials(options),
            identity=_identity(options.get("identity")),
        )


def _prefix(path: str) -> str:
    parts = [unquote(part) for part in path.split("/") if part]
    return "".join(f"/{encode_segment(part)}" for part in parts) or "/aiodlock"


def _identity(given: object) -> str:
    """``connect()`` always passes the client's identity; a backend made directly may not."""
    return check_identity(default_identity() if given is None else given)


def _seconds(options: Mapping[str, Any], key: str, default: float) -> float:
    value = options.get(key)
    if value is None:
        return default
    checked = check_seconds(value, argument=key, allow_none=False)
    assert checked is not None
    return checked


def _credentials(options: Mapping[str, Any]) -> Any:
    """gRPC channel credentials for the TLS options, or None for plaintext."""
    opts = canonical_options({k: v for k, v in options.items() if k in TLS_OPTIONS}, TLS_ALIASES)
    files = {name: opts.get(name) for name in _FILES}
    wanted = opts.get("tls")
    if opts.get("tls_verify", True) is False:
        # gRPC's channel credentials always check the member's certificate.
        raise ValueError(
            f"etcd:// cannot skip the certificate check ({opts.given('tls_verify')}=false): "
            f"give the CA that signed the members' certificates ({opts.given('tls_ca')})"
        )
    if wanted is False:
        if any(files.values()):
            given = ", ".join(opts.given(name) for name, path in files.items() if path)
            raise ValueError(f"{opts.given('tls')}=false contradicts {given}: drop one of them")
        return None
    if not wanted and not any(files.values()):
        return None
    if files["tls_key"] and not files["tls_cert"]:
        key_name = opts.given("tls_key")
        cert_name = "ssl_cert" if key_name == "ssl_key" else "tls_cert"  # in the user's words
        raise ValueError(f"{key_name} needs {cert_name} (the client certificate it belongs to)")
    blobs = {name: _read(opts, name, path) for name, path in files.items()}
    cert, key = blobs["tls_cert"], blobs["tls_key"]
    if cert is not None and key is None:
        key = cert  # one PEM file holding the certificate and its key
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=blobs["tls_ca"], private_key=key, certificate_chain=cert
    )


def _read(opts: Options, name: str, path: Any) -> bytes | None:
    if path is None:
        return None
    if not isinstance(path, str) or not path:
        raise TypeError(f"option {opts.given(name)} must be a non-empty str (a file path)")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"etcd:// option {opts.given(name)}={path!r}: {exc}") from None
