"""The masters of a Redlock backend and the steps its quorum rounds take on them:
:class:`Masters` sends an attempt (after an earlier one's give-back, or the arbiter first),
gives back what a failed round may hold, writes the fencing token to a quorum, and releases on
one master once its attempt there has landed. docs/redlock.md explains the rounds.

Example::

    futures = [masters.send(owner, i, script=script, keys=keys, args=args) for i in range(n)]
    token = await masters.raise_fence(keys, granted, budget)
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from .. import BackendError, Kind, LockSpec
from . import _scripts as lua
from ._keys import Keys, keys_for
from ._quorum import Round

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from ._node import NodeSource

__all__ = [
    "NOT_ASKED",
    "Masters",
    "acquire_call",
    "arbiter",
    "load",
    "quorum",
    "release_call",
    "renew_call",
    "retry_after",
]

_log = logging.getLogger("aiodlock.redis")

NOT_ASKED: Final = (0, -2)
"""The reply of a master an attempt skipped (:meth:`Masters.arbiter_first`): a refusal that
names no wait, with nothing of ours to give back there."""


def quorum(masters: int, spec: LockSpec) -> int:
    """How many masters must grant ``spec``: a majority, and for a semaphore of limit L
    ``N·L // (L+1) + 1``, the least q for which L+1 holders cannot each hold q masters with
    at most L holders on every master ((L+1)·q > N·L). L = 1 gives the majority."""
    if spec.kind is Kind.SEMAPHORE:
        return masters * spec.limit // (spec.limit + 1) + 1
    return masters // 2 + 1


def arbiter(keys: Keys, masters: int) -> int:
    """The master a name's woken waiters ask first: the same in every process."""
    return zlib.crc32(keys.mutex_acquire[0]) % masters


class Masters:
    """The N masters of one Redlock backend (see the module docstring).

    ``spawn`` runs a background step (``None`` once the backend is closing; the backend's
    ``settle()`` waits for what it started).
    """

    __slots__ = (
        "_client_id",
        "_fence_ms",
        "_giving",
        "_spawn",
        "_where",
        "flights",
        "majority",
        "sources",
    )

    def __init__(
        self,
        sources: list[NodeSource],
        *,
        where: str,
        fence_ms: int,
        client_id: str,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None] | None],
    ) -> None:
        self.sources = sources
        self._client_id = client_id
        self.majority = len(sources) // 2 + 1
        self._where = where
        self._fence_ms = fence_ms
        self._spawn = spawn
        # owner -> master index -> its attempt still in flight (a release there waits for it)
        self.flights: dict[str, dict[int, asyncio.Future[Any]]] = {}
        # (owner, master index) -> the release giving back an attempt that master answered
        # too late (see give_back)
        self._giving: dict[tuple[str, int], asyncio.Task[None]] = {}

    def describe(self) -> str:
        """The backend's URL without its password."""
        return self._where

    def closed_error(self) -> BackendError:
        return BackendError(f"the redlock backend for {self._where} is closed")

    def track(self, owner: str, futures: list[asyncio.Future[Any]]) -> None:
        """``owner``'s attempt is in flight on every master: a release there waits for it."""
        flights = self.flights.setdefault(owner, {})
        for i, fut in enumerate(futures):
            flights[i] = fut
            fut.add_done_callback(partial(self._landed, owner, i))

    def _landed(self, owner: str, i: int, fut: asyncio.Future[Any]) -> None:
        flights = self.flights.get(owner)
        if flights is not None and flights.get(i) is fut:
            del flights[i]
            if not flights:
                del self.flights[owner]

    def send(
        self,
        owner: str,
        i: int,
        *,
        script: lua.Script,
        keys: tuple[bytes, ...],
        args: tuple[Any, ...],
    ) -> asyncio.Future[Any]:
        """The attempt's command on master ``i``, sent at once -- or, if an earlier attempt of
        ``owner`` is still being given back there (its reply was late), right after that."""
        source = self.sources[i]
        before = self._giving.get((owner, i))
        if before is None:
            return source.submit(lua.run, script, keys, *args)
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def after() -> None:
            try:
                await asyncio.wait((before,))
                sent = source.submit(lua.run, script, keys, *args)
                await asyncio.wait((sent,))
            except BaseException:
                outcome.cancel()  # cancelled as we close: nobody will wait for it
                raise
            _mirror(sent, outcome)

        if self._spawn(after()) is None:
            outcome.set_exception(self.closed_error())
        return outcome

    def arbiter_first(
        self,
        send: Callable[[int, int | None], asyncio.Future[Any]],
        arbiter: int,
        patience: float,
        abandoned: asyncio.Future[None],
    ) -> list[asyncio.Future[Any]]:
        """A woken waiter's attempt: to the name's arbiter master first, to the others only
        once the arbiter granted it (or did not answer within ``patience``).

        When a release wakes waiters in several processes at once and each sends to every
        master in parallel, the masters' votes split (each grants whoever came first there):
        nobody reaches a quorum, everybody gives back, and the give-backs wake everybody
        again. Asking one master first -- the same one for a name in every process -- lets
        it pick the winner; the losers are refused there atomically and have nothing to
        give back. A master that was not asked answers ``NOT_ASKED``, a refusal; so do the
        others once the attempt is ``abandoned`` (given back: a release waiting for this
        attempt on a master must not be waited for by it). The others are sent the arbiter's
        token, which they hand out in place of their clock's (``send``'s second argument):
        the quorum agrees on one token, and the grant needs no write phase.
        """
        first = send(arbiter, None)
        loop = asyncio.get_running_loop()
        outcomes: dict[int, asyncio.Future[Any]] = {
            i: loop.create_future() for i in range(len(self.sources)) if i != arbiter
        }
        decided = False

        # Callbacks, not a task per master: most such attempts are refused by the arbiter.
        def decide(_: object = None) -> None:
            nonlocal decided
            if decided:
                return
            decided = True
            timer.cancel()
            answered = first.done() and not first.cancelled() and first.exception() is None
            if abandoned.done() or (answered and first.result()[0] != 1):
                for outcome in outcomes.values():
                    if not outcome.done():
                        outcome.set_result(NOT_ASKED)
                return
            floor = int(first.result()[1]) if answered else None
            for i, outcome in outcomes.items():
                if not outcome.done():
                    send(i, floor).add_done_callback(partial(_relay, outcome))

        timer = loop.call_later(patience, decide)
        first.add_done_callback(decide)
        abandoned.add_done_callback(decide)
        return [first if i == arbiter else outcomes[i] for i in range(len(self.sources))]

    async def raise_fence(self, keys: Keys, granted: dict[int, int], budget: float) -> int | None:
        """The write phase: make the quorum's maximum token known to a quorum of masters
        within ``budget`` seconds."""
        token = max(granted.values())
        have = sum(1 for t in granted.values() if t >= token)
        if have >= self.majority:
            return token
        fence = keys.mutex_acquire[1]
        futures = [
            source.submit(lua.run, lua.FENCE_RAISE, (fence,), str(token), self._fence_ms)
            if granted.get(i, 0) < token
            else _done(1)
            for i, source in enumerate(self.sources)
        ]
        rnd = Round(futures)
        await rnd.gather(budget, lambda r: len(r.replies) >= self.majority)
        if len(rnd.replies) >= self.majority:
            return token
        _log.warning(
            "redlock: the fencing token reached only %d masters of %s",
            len(rnd.replies),
            self._where,
        )
        return None

    def give_back(self, spec: LockSpec, owner: str, rnd: Round) -> list[asyncio.Task[None]]:
        """Release, in tasks of ours, where the attempt granted, failed, or has not answered
        yet -- not where it was refused (the script refused atomically: nothing of ours is
        there). Returns the tasks of the masters that answered (quick to finish)."""
        answered = []
        for i in range(len(self.sources)):
            reply = rnd.replies.get(i)
            if reply is not None and reply[0] != 1:
                continue
            # After this attempt's own command there, not whatever is in flight when the
            # task starts: the owner's next attempt may be sent first (a banked wakeup starts
            # it in this loop step), and it waits for this release, which would wait for it.
            task = self._spawn(self.release_on(i, spec, owner, after=rnd.futures[i]))
            if task is None:
                continue
            if reply is not None:
                answered.append(task)
            else:
                # The next attempt of this owner on master i must come after this release:
                # sent before it, the release would delete what that attempt grants.
                self._giving[owner, i] = task
                task.add_done_callback(partial(self._given, owner, i))
        return answered

    def _given(self, owner: str, i: int, task: asyncio.Task[None]) -> None:
        if self._giving.get((owner, i)) is task:
            del self._giving[owner, i]

    async def release_on(
        self,
        i: int,
        spec: LockSpec,
        owner: str,
        released: list[int] | None = None,
        *,
        after: asyncio.Future[Any] | None = None,
        holder: bool = False,
    ) -> None:
        """Release ``owner`` on master ``i`` once its attempt there has landed (``after``, or
        the one in flight now), noting in ``released[i]`` the script's reply (0: it did not
        hold the lock there; -1: it failed); never raises (a failure leaves the key to its
        TTL).

        A mutex's arbiter wakes the next registered client (:mod:`._redlock_wake`); a
        ``holder``'s release there also leaves it a courtesy if it woke another, and tells
        nobody on the other masters. A give-back publishes on every master: the waiters its
        attempt refused may wait on any of them."""
        try:
            flight = self.flights.get(owner, {}).get(i) if after is None else after
            if flight is not None:
                await asyncio.wait((flight,))
            keys = keys_for(spec.namespace, spec.name)
            script, script_keys, args = self._release_call(spec, keys, i, holder=holder)
            with self.sources[i].errors("release"):
                done = await self.sources[i].call_first(lua.run, script, script_keys, owner, *args)
            if released is not None:
                released[i] = int(done)
        except Exception as exc:
            if released is not None:
                released[i] = -1
            _log.debug("redlock release on %s failed: %s", self.sources[i].describe(), exc)

    def _release_call(
        self, spec: LockSpec, keys: Keys, i: int, *, holder: bool
    ) -> tuple[lua.Script, tuple[bytes, ...], tuple[Any, ...]]:
        """The release script for master ``i``, its keys and its arguments after the
        owner's (see :meth:`release_on`)."""
        if spec.kind is not Kind.MUTEX:
            script, script_keys, args = release_call(spec, keys)
            return script, script_keys, ("p", *args)
        if i == arbiter(keys, len(self.sources)):
            courtesy = (lua.COURTESY_MS, "c") if holder else ()
            return lua.MUTEX_RELEASE, keys.mutex_release_c, ("p", self._client_id, 0, *courtesy)
        return lua.MUTEX_RELEASE, keys.mutex_release, ("q" if holder else "p",)


def retry_after(rnd: Round, need: int, granted: int, timeout: float) -> float | None:
    """Seconds after which a failed attempt should ask again without a wakeup: a
    per-master ``timeout`` if some masters did not answer (stopped, partitioned: they
    cannot send one), or once enough of the refusals have expired to free a quorum
    (``None``: only a wakeup)."""
    retry: float | None = None
    if len(rnd.replies) + len(rnd.errors) < len(rnd.futures):
        retry = timeout
    waits = sorted(int(v[1]) for v in rnd.replies.values() if v[0] == 0 and v[1] >= 0)
    if waits:
        index = min(len(waits) - 1, max(0, need - granted - 1))
        expiry = max(waits[index] + 1, 1) / 1000.0
        retry = expiry if retry is None else min(retry, expiry)
    return retry


def _relay(target: asyncio.Future[Any], source: asyncio.Future[Any]) -> None:
    """Done callback: give ``target`` (unless done already) the outcome of ``source``."""
    if not target.done():
        _mirror(source, target)


def _mirror(source: asyncio.Future[Any], target: asyncio.Future[Any]) -> None:
    """Give ``target`` the outcome of the finished ``source``."""
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def _done(value: Any) -> asyncio.Future[Any]:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


async def load(client: aioredis.Redis) -> None:
    """Load every script a master runs (the single-node ones and ``FENCE_RAISE``)."""
    await lua.load_all(client)
    async with client.pipeline(transaction=False) as pipe:
        for script in (lua.FENCE_RAISE,):
            pipe.script_load(script.text)
        await pipe.execute()


def acquire_call(
    spec: LockSpec,
    keys: Keys,
    owner: str,
    ms: int,
    *,
    client_id: str,
    fence_ms: int,
    identity: bytes,
    registers: str | None = None,
) -> tuple[lua.Script, tuple[bytes, ...], tuple[Any, ...]]:
    """The acquire script of ``spec``'s kind, its keys and its arguments (the client's
    ``identity`` last: each master stores it with the grant, for inspect). On a mutex's
    arbiter, ``registers`` is the pub/sub-mode flag (``r``: a refusal registers the client
    among the waiting ones, see :mod:`._redlock_wake`)."""
    fence = fence_ms
    if spec.kind is Kind.MUTEX and registers is not None:
        args = (owner, ms, client_id, registers, "0", fence, identity)
        return lua.MUTEX_ACQUIRE, keys.mutex_acquire_c, args
    if spec.kind is Kind.MUTEX:
        # The client id only matters to a courtesy left by a release; ours leave none.
        return lua.MUTEX_ACQUIRE, keys.mutex_acquire, (owner, ms, client_id, fence, identity)
    if spec.kind is Kind.READ:
        return lua.READ_ACQUIRE, keys.read_acquire, (owner, ms, "0", fence, identity)
    if spec.kind is Kind.WRITE:
        return lua.WRITE_ACQUIRE, keys.write_acquire, (owner, ms, fence, identity)
    return lua.SEM_ACQUIRE, keys.sem_acquire, (owner, ms, spec.limit, fence, identity)


def release_call(
    spec: LockSpec, keys: Keys
) -> tuple[lua.Script, tuple[bytes, ...], tuple[Any, ...]]:
    """The release script of ``spec``'s kind (not a mutex: see :meth:`Masters.release_on`),
    its keys and its arguments after the owner's."""
    if spec.kind is Kind.READ:
        return lua.READ_RELEASE, keys.read_release, ()
    if spec.kind is Kind.WRITE:
        return lua.WRITE_RELEASE, keys.write_release, ()
    return lua.SEM_RELEASE, keys.sem_release, (spec.limit,)


def renew_call(spec: LockSpec, keys: Keys) -> tuple[lua.Script, tuple[bytes, ...]]:
    """The renew script of ``spec``'s kind and its keys."""
    if spec.kind is Kind.MUTEX:
        return lua.MUTEX_RENEW, (keys.mutex,)
    if spec.kind is Kind.WRITE:
        return lua.MUTEX_RENEW, (keys.writer,)
    if spec.kind is Kind.READ:
        return lua.ZSET_RENEW, (keys.readers,)
    return lua.ZSET_RENEW, keys.sem_renew
