"""What the Redlock backend's ``inspect`` reads on one master: :func:`scan_holders`, the
holders of every lock of a namespace (by the key layout of :mod:`._keys`) and each name's
fencing counter.

Example::

    holders, fences = await scan_holders(client, "shop")
    holders[("order:42", Kind.MUTEX)]  # {"<owner>": 8.5}: seconds left
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from .._protocol import Kind

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["scan_holders"]


_SUFFIX_KIND: Final = {
    b"": Kind.MUTEX,
    b":writer": Kind.WRITE,
    b":readers": Kind.READ,
    b":sem": Kind.SEMAPHORE,
}


async def scan_holders(
    client: aioredis.Redis, namespace: str
) -> tuple[dict[tuple[str, Kind], dict[str, float]], dict[str, int]]:
    """One master's holders in ``namespace``: (name, kind) -> owner -> seconds left, and each
    name's fencing counter."""
    prefix = f"{{{namespace}:".encode("utf-8", "surrogatepass")
    match = _glob(prefix) + b"*"
    holders: dict[tuple[str, Kind], dict[str, float]] = {}
    fences: dict[str, int] = {}
    now_s, now_us = await client.time()
    now_ms = now_s * 1000 + now_us // 1000
    async for raw in client.scan_iter(match=match, count=500):
        key = bytes(raw)
        close = key.rfind(b"}")
        if close < 0:
            continue
        name = key[len(prefix) : close].decode("utf-8", "surrogatepass")
        suffix = key[close + 1 :]
        if suffix == b":fence":
            value = await client.get(key)
            if value is not None:
                fences[name] = int(value)
            continue
        kind = _SUFFIX_KIND.get(suffix)
        if kind is None:
            continue
        if kind in (Kind.MUTEX, Kind.WRITE):
            owner: Any = await client.get(key)
            pttl = await client.pttl(key)
            if owner is not None and pttl > 0:
                holders.setdefault((name, kind), {})[bytes(owner).decode()] = pttl / 1000.0
        else:
            members: list[Any] = await client.zrange(key, 0, -1, withscores=True)
            for member, score in members:
                left = float(score) - now_ms
                if left > 0:
                    holders.setdefault((name, kind), {})[bytes(member).decode()] = left / 1000.0
    return holders, fences


def _glob(text: bytes) -> bytes:
    return b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in text)
