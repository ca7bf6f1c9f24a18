"""What an operator asks of a ZooKeeper lock: who holds it (``inspect``), and ``break``; which
namespaces are in use (``namespaces``); and whether our credentials are the ones the chroot
was made with (``check_identity``).

Both read the directories as the recipe does (the queue engine's ``holders``), so they need no
state of the client that runs them. A break needs DELETE on the lock's directory: one the
lock's ACL refuses is a ``BackendError`` saying so (docs/zookeeper.md, "Authentication and
ACLs").

Example::

    infos = await inspect(ctx, nodes, "shop", "order:*")
"""

from __future__ import annotations

import contextlib
import fnmatch

from .. import BackendError, HolderInfo, LockInfo, LockSpec
from ..queue import holders
from ._auth import format_acl, names_another_password
from ._context import ZKContext
from ._errors import NoAuthError, NoNodeError
from ._layout import (
    KIND_OF_FAMILY,
    contenders,
    decode_segment,
    namespace_of,
    namespace_path,
    node_identity,
    node_owner,
)
from ._nodes import Nodes
from ._transport import ZKTransport

__all__ = ["break_lock", "check_identity", "inspect", "namespaces"]


async def inspect(
    ctx: ZKContext, nodes: Nodes, namespace: str, pattern: str = "*"
) -> list[LockInfo]:
    """Every held lock of ``namespace`` whose name matches ``pattern``, sorted by name.

    Lists the namespace's directories, and each family's contenders: the holders are the
    nodes the recipe grants (the queue engine's ``holders``), the rest wait. A holder's owner
    and its client's identity are in its node's data (``owner=... identity=...``); its token
    is its node's czxid, and the lock's fencing token the newest holder's. ``expires_in`` is
    ``None``: the lease lives as long as the holder's session.

    A ``sync`` first: our server of an ensemble may not have applied a release (or a grant)
    that another session made through another member a moment ago, and ``locked()`` after
    the holder's ``release()`` returned must say free.
    """
    transport = ctx.require_open()
    base = namespace_path(ctx.settings.root, namespace)
    with contextlib.suppress(NoNodeError):
        await transport.sync(base, timeout=ctx.request_timeout)
    found: list[LockInfo] = []
    encoded = {decode_segment(e): e for e in await nodes.children(transport, base)}
    for name in sorted(n for n in encoded if fnmatch.fnmatchcase(n, pattern)):
        for family in ("mutex", "rw", "semaphore"):
            directory = f"{base}/{encoded[name]}/{family}"
            queue = contenders(await nodes.children(transport, directory))
            found_holders: list[HolderInfo] = []
            tokens: list[int] = []
            kind = KIND_OF_FAMILY[family]
            for holder in holders(queue):
                try:
                    data, stat = await transport.get(
                        f"{directory}/{holder.id}", timeout=ctx.request_timeout
                    )
                except NoNodeError:
                    continue  # released meanwhile
                owner = node_owner(data, stat.ephemeral_owner)
                found_holders.append(HolderInfo(owner, None, node_identity(data)))
                tokens.append(stat.czxid)
                if family == "rw":
                    kind = holder.kind
            if found_holders:
                waiters = len(queue) - len(found_holders)
                found.append(LockInfo(name, kind, tuple(found_holders), max(tokens), waiters))
    return found


async def namespaces(ctx: ZKContext, nodes: Nodes) -> list[str]:
    """The namespaces with a directory under the root, sorted: one ``getChildren``.

    A namespace's directory is a container node, which the server deletes a while (60 s by
    default) after its last lock went: a namespace may be named a little after its last use.
    Without a chroot the root is ``/``, whose other nodes (``zookeeper``, another
    application's) are left out when no namespace encodes to them; one that happens to is
    named, and ``inspect`` finds no lock in it. A ``sync`` first: a namespace another
    session made a moment ago, through another server of the ensemble, is seen.
    """
    transport = ctx.require_open()
    root = ctx.settings.root or "/"
    with contextlib.suppress(NoNodeError):
        await transport.sync(root, timeout=ctx.request_timeout)
    found = (namespace_of(child) for child in await nodes.children(transport, root))
    return sorted(namespace for namespace in found if namespace is not None)


async def break_lock(ctx: ZKContext, nodes: Nodes, spec: LockSpec) -> int:
    """Delete the holders' nodes of ``spec``'s family (waiters keep their place). Each
    holder's watch on its node reports the deletion, so its lease is lost at once; the
    next grant is a node created later, so its token (czxid) is larger."""
    transport = ctx.require_open()
    directory = ctx.directory(spec)
    # Our server may not have applied a grant the leader committed a moment ago (another
    # session's, on another member of an ensemble): catch up before listing.
    with contextlib.suppress(NoNodeError):
        await transport.sync(directory, timeout=ctx.request_timeout)
    dropped = 0
    for holder in holders(contenders(await nodes.children(transport, directory))):
        try:
            await transport.delete(f"{directory}/{holder.id}", timeout=ctx.request_timeout)
        except NoNodeError:
            continue  # released meanwhile
        except NoAuthError as exc:
            credentials = ctx.settings.credentials
            who = "an unauthenticated client" if credentials is None else credentials.describe()
            raise BackendError(
                f"cannot break {spec.describe()} on {ctx.describe()}: the lock's ACL does not "
                f"give {who} DELETE on {directory} (NoAuth); the holder keeps it"
            ) from exc
        dropped += 1
    return dropped


async def check_identity(ctx: ZKContext, transport: ZKTransport) -> None:
    """At connect: BackendError if the chroot's ACL names our digest user with another
    password (a wrong password is no error to ZooKeeper, only another identity, which our
    own nodes would refuse later, one request at a time). One ``getACL``, only with
    credentials and a chroot that exists."""
    credentials, root = ctx.settings.credentials, ctx.settings.root
    if credentials is None or not root:
        return
    try:
        acl = await transport.get_acl(root, timeout=ctx.request_timeout)
    except (NoNodeError, NoAuthError):
        return  # not made yet (ours to make), or not readable: the requests will tell
    if names_another_password(acl, credentials):
        raise BackendError(
            f"{ctx.describe()}: wrong password for {credentials.describe()}: {root} belongs "
            f"to that user with another password (its ACL: {format_acl(acl)})"
        )
