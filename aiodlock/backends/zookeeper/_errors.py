"""What a ZooKeeper request answers besides its result, and the node stat the recipe reads.

:class:`NoNodeError`, :class:`NodeExistsError` and :class:`NotEmptyError` are answers the
recipe expects; :class:`NotConnected` means "never sent" and :class:`ConnectionLoss` "sent,
outcome unknown", :class:`NoAuthError` "refused by the node's ACL" and
:class:`AuthFailedError` "the server refused our credentials" (all
:class:`~aiodlock.BackendError`). Every other aiozk error becomes a ``BackendError`` with the
aiozk exception chained (see :mod:`._transport`).

Example::

    with contextlib.suppress(NoNodeError):
        await transport.delete(path, timeout=10)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import BackendError

__all__ = [
    "AuthFailedError",
    "ConnectRefusedError",
    "ConnectionLoss",
    "NoAuthError",
    "NoNodeError",
    "NodeExistsError",
    "NodeStat",
    "NotConnected",
    "NotEmptyError",
    "node_stat",
]


class NoNodeError(Exception):
    """The server answered: no node at that path."""


class NodeExistsError(Exception):
    """The server answered: the node already exists."""


class NotEmptyError(Exception):
    """The server answered: the node has children."""


class NotConnected(BackendError):
    """The request was not sent: no connection within the time allowed. Nothing happened."""


class ConnectionLoss(BackendError):
    """The request was sent but no answer came (connection lost or timed out).

    Its outcome is unknown: a create may have created the node.
    """


class NoAuthError(BackendError):
    """The server answered NoAuth: the node's ACL does not give our identity that right."""


class AuthFailedError(BackendError):
    """The server answered AUTH_FAILED to our credentials (and closed the session)."""


class ConnectRefusedError(BackendError):
    """Every endpoint refused the first connect for a reason retrying cannot cure (the TLS
    settings do not fit the servers): said at once, not after ``connect_timeout``."""


@dataclass(frozen=True, slots=True)
class NodeStat:
    """The parts of a znode's stat the recipe uses."""

    czxid: int
    mzxid: int
    version: int
    ephemeral_owner: int
    num_children: int


def node_stat(raw: Any) -> NodeStat:
    return NodeStat(
        czxid=int(raw.created_zxid),
        mzxid=int(raw.last_modified_zxid),
        version=int(raw.version),
        ephemeral_owner=int(raw.ephemeral_owner),
        num_children=int(raw.num_children),
    )
