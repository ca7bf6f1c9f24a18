"""Background-worker recipes on the public API: one run at a time, one instance on a timer.

* :func:`exclusive` — the decorator behind ``@locks.exclusive("report:{day}")``: every call
  of the coroutine function holds the mutex its arguments name, guarded like an
  ``async with`` body (cancelled on loss, :class:`~aiodlock.LockLostError`)::

      @locks.exclusive("report:{day}", timeout=60)
      async def build_report(day: str) -> None: ...

* :func:`run_periodic` — behind ``locks.periodic(name, fn, every=60)``: every instance calls
  it, exactly one (the leader of the election ``name``) runs ``fn`` every ``every``
  seconds; when it stops or loses its lease, another instance takes over.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NoReturn, ParamSpec, TypeVar, TypeVarTuple

from ._leader import Election
from ._locks import Lock
from ._template import NameTemplate
from ._validate import check_async_callable, check_seconds

__all__ = ["exclusive", "run_periodic"]

P = ParamSpec("P")
T = TypeVar("T")
Ts = TypeVarTuple("Ts")

logger = logging.getLogger("aiodlock.recipes")


def exclusive(
    name_template: str, make_lock: Callable[[str], Lock]
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """A decorator: each call holds ``make_lock(name)``, ``name`` formatted from the call's
    arguments (bound to the function's signature, defaults applied).

    A template field that is not a parameter of the function is a ``ValueError`` when the
    function is decorated (unless it takes ``**kwargs``; then a missing value is a
    ``KeyError`` at the call). Never a lock on the literal text ``"{day}"``.
    """
    template = NameTemplate(name_template)

    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        check_async_callable(fn)
        signature = inspect.signature(fn)
        qualname = getattr(fn, "__qualname__", repr(fn))
        var_keyword = next(
            (p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None
        )
        missing = template.missing(signature.parameters)
        if missing and var_keyword is None:
            fields = ", ".join(f"{{{field}}}" for field in missing)
            raise ValueError(
                f"exclusive({name_template!r}) on {qualname}: {fields} is not a parameter "
                f"of {qualname}{signature}"
            )

        @functools.wraps(fn)
        async def held(*args: P.args, **kwargs: P.kwargs) -> T:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = dict(bound.arguments)
            if var_keyword is not None:
                values.update(values.pop(var_keyword, {}))
            name = template.format(values, source=f"the arguments of {qualname}")
            async with make_lock(name):
                return await fn(*args, **kwargs)

        return held

    return decorate


async def run_periodic(
    election: Election, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts, every: float
) -> NoReturn:
    """Run ``await fn(*args)`` every ``every`` seconds on the one instance that leads.

    The period runs from the start of one call to the start of the next (a call longer than
    the period is followed by the next at once). An exception from ``fn`` is logged and the
    schedule goes on; a lost leadership cancels the call under way, and whichever instance
    wins the next term runs ``fn`` at once. Returns never: cancel the task to stop.
    """
    check_async_callable(fn)
    period = check_seconds(every, argument="every", allow_none=False)
    assert period is not None

    async def schedule() -> NoReturn:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await fn(*args)
            except Exception:
                logger.exception("periodic job %r failed; next run as scheduled", election.name)
            # A timer is what this waits for: the next run is due at started + period.
            await asyncio.sleep(max(0.0, started + period - loop.time()))

    await election.run(schedule)
    raise AssertionError("unreachable: the schedule never ends")  # pragma: no cover
