"""aiohttp glue: one lock client per app, a lock held around a handler.

``setup(app, url)`` registers a ``cleanup_ctx`` that opens the client when the app starts and
closes it when the app stops; the client is ``app[LOCKS]`` (a typed ``web.AppKey``). The
``hold()`` decorator holds a lock, named from ``request.match_info``, for the handler's whole
run and passes it the lease::

    from aiohttp import web

    import aiodlock
    from aiodlock.integrations.aiohttp import LOCKS, hold, setup

    app = web.Application()
    setup(app, "redis://127.0.0.1:6379/0", namespace="shop")

    @hold("order:{order_id}", timeout=5)
    async def add_item(request: web.Request, lease: aiodlock.Lease) -> web.Response:
        ...  # only one request per order runs this, across every process
        return web.json_response({"fencing_token": lease.fencing_token})

    app.router.add_post("/orders/{order_id}/items", add_item)

The answers are those of the FastAPI integration: busy past ``timeout`` → **423 Locked** with
``Retry-After``; the lock service down → **503** with ``Retry-After``; the lease lost while
the handler runs → the handler is **cancelled** at its next ``await`` (the lock is held with
``async with`` in the request's task) and the client gets **503**. Each is a small JSON body
``{"detail": ...}``. A route whose template names a field that is not in its path is refused
when the app starts (``ValueError``), never locked under the literal text.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar

from aiohttp import web

from .. import Lease, LockClient, LockError, connect
from ._common import LockRecipe, answer_for

__all__ = ["LOCKS", "hold", "setup"]

R = TypeVar("R", bound=web.StreamResponse)
Handler = Callable[[web.Request], Awaitable[R]]

LOCKS: Final = web.AppKey("aiodlock.locks", LockClient)
"""Where :func:`setup` keeps the app's client: ``request.app[LOCKS]``."""

_RECIPE_ATTRIBUTE: Final = "__aiodlock_hold__"


def setup(app: web.Application, url: str | None = None, **options: Any) -> None:
    """Open one :class:`~aiodlock.LockClient` for ``app`` while it runs, as ``app[LOCKS]``.

    Registers a ``cleanup_ctx``: the client opens at startup (after the contexts registered
    before it, so register this one first if your own contexts need locks) and closes at
    shutdown. At startup it also checks the templates of every :func:`hold` route.

    Args:
        url: as for :func:`aiodlock.connect` (``memory://`` when omitted).
        **options: :func:`aiodlock.connect` options (``namespace``, ``ttl``, ``timeout``...).

    Raises:
        ValueError, TypeError: a bad URL or option, at once (not at startup).
    """
    connect(url, **options)  # a bad URL or option fails here, when the app is built

    async def locks_context(app: web.Application) -> AsyncIterator[None]:
        check_routes(app)
        async with connect(url, **options) as locks:
            app[LOCKS] = locks
            yield

    app.cleanup_ctx.append(locks_context)


def hold(
    name_template: str,
    *,
    kind: str = "mutex",
    limit: int | None = None,
    retry_after: int = 1,
    **lock_options: Any,
) -> Callable[[Callable[[web.Request, Lease], Awaitable[R]]], Handler[R]]:
    """Decorate a handler ``(request, lease)`` to run holding the lock its route names.

    Args:
        name_template: the lock's name, with ``{field}`` placeholders filled from
            ``request.match_info`` (``"order:{order_id}"`` on ``/orders/{order_id}``).
        kind: ``"mutex"``, ``"read"``, ``"write"`` or ``"semaphore"`` (needs ``limit``).
        limit: the semaphore's limit.
        retry_after: the ``Retry-After`` seconds sent with a 423 or a 503.
        **lock_options: the lock's options (``timeout``, ``ttl``, ``max_hold``, ``fair``...).
            Give web handlers a ``timeout``: ``None`` waits as long as the lock is busy.

    Returns:
        A decorator; the decorated handler takes ``request`` only, as aiohttp calls it.
    """
    recipe = LockRecipe.make(name_template, kind, limit, dict(lock_options), retry_after)

    def decorate(handler: Callable[[web.Request, Lease], Awaitable[R]]) -> Handler[R]:
        @functools.wraps(handler)
        async def held(request: web.Request) -> R | web.Response:
            missing = recipe.template.missing(request.match_info)
            if missing:  # only reachable without setup(), which checks routes at startup
                raise RuntimeError(_missing_message(recipe, missing, request.path))
            name = recipe.template.format(request.match_info, source="the path's match_info")
            lock = recipe.lock(request.app[LOCKS], name)
            try:
                async with lock as lease:
                    return await handler(request, lease)
            except LockError as exc:
                answer = answer_for(exc, recipe.retry_after)
                if answer is None:
                    raise
                return web.json_response(
                    {"detail": answer.detail}, status=answer.status, headers=answer.headers()
                )

        setattr(held, _RECIPE_ATTRIBUTE, recipe)
        return held  # type: ignore[return-value]  # R or the error answer: both responses

    return decorate


def check_routes(app: web.Application) -> None:
    """Refuse a :func:`hold` template field that the route's path does not provide."""
    problems = []
    for route in app.router.routes():
        recipe = getattr(route.handler, _RECIPE_ATTRIBUTE, None)
        if not isinstance(recipe, LockRecipe) or route.resource is None:
            continue
        info = route.resource.get_info()
        pattern = info.get("pattern")
        params = set(pattern.groupindex) if pattern is not None else set()
        missing = recipe.template.missing(params)
        if missing:
            problems.append(_missing_message(recipe, missing, route.resource.canonical))
    if problems:
        raise ValueError("; ".join(problems))


def _missing_message(recipe: LockRecipe, missing: list[str], path: str) -> str:
    fields = ", ".join(f"{{{field}}}" for field in missing)
    return (
        f"hold({recipe.template.template!r}) on route {path!r}: {fields} is not in the route's path"
    )
