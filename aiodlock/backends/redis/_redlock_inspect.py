"""The Redlock backend's operators: :func:`inspect_masters` (the holders a quorum reports,
from what :func:`scan_holders` reads on each master, as one node's inspect reads it, with
each name's fencing counter), :func:`namespaces_on_masters` and :func:`break_on_masters`.

Example::

    holders, fences = await scan_holders(client, "shop")
    holders[("order:42", Kind.MUTEX)]  # {"<owner>": (8.5, "web-1:4242")}: seconds left, identity
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING

from .. import BackendError, HolderInfo, Kind, LockInfo, LockSpec
from . import _scripts as lua
from ._keys import (
    ANY_NAMESPACE_MATCH,
    HELD_SUFFIXES,
    break_args,
    broken_channel,
    keys_for,
    namespace_in_use,
    namespace_match,
    split_key,
)
from ._operator import lock_infos
from ._quorum import Round

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from ._redlock_rounds import Masters

__all__ = ["break_on_masters", "inspect_masters", "namespaces_on_masters", "scan_holders"]

Held = dict[tuple[str, Kind], dict[str, tuple[float, str | None]]]
"""One master's holders: (name, kind) -> owner -> (seconds left, identity or ``None``)."""


async def scan_holders(client: aioredis.Redis, namespace: str) -> tuple[Held, dict[str, int]]:
    """One master's holders in ``namespace``, read as one node's inspect reads them (a
    ``SCAN``, then the :data:`~._scripts.INSPECT` script per name: one round trip a name):
    (name, kind) -> owner -> (seconds left, identity), and each name's fencing counter."""
    names: set[str] = set()
    async for raw in client.scan_iter(match=namespace_match(namespace), count=500):
        split = split_key(namespace, bytes(raw))
        # A master that does not hold a name still counts its fencing counter in the quorum's.
        if split is not None and (split[1] in HELD_SUFFIXES or split[1] == b":fence"):
            names.add(split[0])
    holders: Held = {}
    fences: dict[str, int] = {}
    for name in names:
        reply = await lua.run(client, lua.INSPECT, keys_for(namespace, name).inspect)
        if reply[1] is not None:
            fences[name] = int(reply[1])
        for info in lock_infos(name, reply):
            holders[name, info.kind] = {
                h.owner: (h.expires_in or 0.0, h.identity) for h in info.holders
            }
    return holders, fences


async def inspect_masters(masters: Masters, namespace: str, pattern: str) -> list[LockInfo]:
    """Locks of ``namespace`` matching ``pattern`` whose holders a quorum reports."""
    sources, majority = masters.sources, masters.majority
    where = masters.describe()
    rnd = Round([source.submit(scan_holders, namespace) for source in sources])
    await rnd.gather(max(s.request_timeout for s in sources), lambda r: False)
    if len(rnd.replies) < majority:
        raise BackendError(
            f"redis inspect failed on {where}: {len(rnd.replies)} masters answered"
        ) from rnd.first_error()
    # (name, kind) -> owner -> [expires_in per master that has it]; name -> tokens
    seen: dict[tuple[str, Kind], dict[str, list[float]]] = {}
    identities: dict[str, str] = {}  # owner -> its identity, as any master stored it
    tokens: dict[str, list[int]] = {}
    for reply in rnd.replies.values():
        holders, fences = reply
        for (name, kind), owners in holders.items():
            bucket = seen.setdefault((name, kind), {})
            for owner, (expires_in, identity) in owners.items():
                bucket.setdefault(owner, []).append(expires_in)
                if identity is not None:
                    identities[owner] = identity
        for name, token in fences.items():
            tokens.setdefault(name, []).append(token)
    found = []
    for (name, kind), owners in sorted(seen.items(), key=lambda e: (e[0][0], e[0][1].value)):
        if not fnmatch.fnmatchcase(name, pattern):
            continue
        held = tuple(
            HolderInfo(owner, sorted(times)[-majority], identities.get(owner))
            for owner, times in sorted(owners.items())
            if len(times) >= majority
        )
        if held:
            found.append(LockInfo(name, kind, held, _newest(tokens.get(name), majority), None))
    return found


async def namespaces_on_masters(masters: Masters) -> list[str]:
    """The namespaces with a lock held or waited for, sorted: the union of what each master's
    ``SCAN`` finds (:func:`~._keys.namespace_in_use`). A majority must answer: a lock a quorum
    holds is then on one of them at least. A master's leftover of a grant that lost its quorum
    may name a namespace with nothing held; callers show what inspect finds there."""
    sources, majority = masters.sources, masters.majority
    rnd = Round([source.submit(_scan_namespaces) for source in sources])
    await rnd.gather(max(s.request_timeout for s in sources), lambda r: False)
    if len(rnd.replies) < majority:
        raise BackendError(
            f"redis namespaces failed on {masters.describe()}: {len(rnd.replies)} of "
            f"{len(sources)} masters answered, a quorum is {majority}"
        ) from rnd.first_error()
    return sorted(set().union(*rnd.replies.values()))


async def _scan_namespaces(client: aioredis.Redis) -> set[str]:
    """One master's namespaces in use (see :func:`namespaces_on_masters`)."""
    found: set[str] = set()
    async for raw in client.scan_iter(match=ANY_NAMESPACE_MATCH, count=500):
        namespace = namespace_in_use(bytes(raw))
        if namespace is not None:
            found.add(namespace)
    return found


def _newest(counters: list[int] | None, majority: int) -> int | None:
    """The newest token handed out: the largest value a majority of counters reach (the
    quorum write put it there; a master that granted late holds a larger one of its own,
    which no lease carries)."""
    if not counters or len(counters) < majority:
        return None
    return sorted(counters, reverse=True)[majority - 1]


async def break_on_masters(masters: Masters, spec: LockSpec, fence_ms: int) -> int:
    """Delete every holder of ``spec``'s family on every master (``BREAK``, as on one
    node) and push its fencing token above every token handed out, through the quorum
    write; waiters are woken as by a release.

    Both phases get the masters' request timeout: a break protects no validity window, so
    the token write is not cut at ``node_timeout`` as a grant's is (cut there, a loaded
    master answering in 200 ms failed a break whose deletes had already landed)."""
    sources, majority = masters.sources, masters.majority
    where = masters.describe()
    keys = keys_for(spec.namespace, spec.name)
    family, family_keys = break_args(spec.kind, keys)
    channel = broken_channel(spec.namespace)  # the holders hear it on every master
    rnd = Round(
        [
            source.submit(lua.run, lua.BREAK, family_keys, family, "p", channel, fence_ms)
            for source in sources
        ]
    )
    timeout = max(s.request_timeout for s in sources)
    await rnd.gather(timeout, lambda r: False)
    if len(rnd.replies) < majority:
        raise BackendError(
            f"redis break failed on {where}: {len(rnd.replies)} of "
            f"{len(sources)} masters answered, a quorum is {majority}"
        ) from rnd.first_error()
    bumped = {i: int(v[1]) for i, v in rnd.replies.items()}
    if await masters.raise_fence(keys, bumped, timeout) is None:
        raise BackendError(f"redis break failed on {where}: the token write failed")
    return _quorum_count([int(v[0]) for v in rnd.replies.values()], len(sources), majority)


def _quorum_count(dropped: list[int], masters: int, majority: int) -> int:
    """How many holders the break dropped: those a quorum may have held. A count is per
    master; a holder counts where as many masters dropped it as a quorum needs, less those
    that did not answer (they may have held it too). A key left on a minority (a release
    still landing on the slower masters, a grant that lost its quorum) is not a holder."""
    need = max(1, majority - (masters - len(dropped)))
    return sorted(dropped, reverse=True)[need - 1]
