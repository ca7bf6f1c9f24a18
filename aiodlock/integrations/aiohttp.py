"""aiohttp glue: one lock client per app, a lock held around a handler.

``setup(app, url)`` opens the client (``app[LOCKS]``) for the app's life; ``hold()`` holds a
lock named from ``request.match_info`` for the handler's whole run and passes it the lease.
The answers (423, 503, a generic ``detail`` unless ``hold(detail=...)`` chooses; the exception
goes to the log) and the startup checks: docs/integrations.md. Example::

    app = web.Application()
    setup(app, "redis://127.0.0.1:6379/0", namespace="shop")

    @hold("order:{order_id}", timeout=5)
    async def add_item(request: web.Request, lease: aiodlock.Lease) -> web.Response:
        return web.json_response({"fencing_token": lease.fencing_token})

    app.router.add_post("/orders/{order_id}/items", add_item)
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar

from aiohttp import web

from .. import Lease, LockClient, LockError, connect
from ._common import DetailHook, LockRecipe, answer_for, check_backend, default_detail

__all__ = ["LOCKS", "default_detail", "hold", "setup"]

R = TypeVar("R", bound=web.StreamResponse)
Handler = Callable[[web.Request], Awaitable[R]]

LOCKS: Final = web.AppKey("aiodlock.locks", LockClient)
"""Where :func:`setup` keeps the app's client: ``request.app[LOCKS]``."""

_RECIPE_ATTRIBUTE: Final = "__aiodlock_hold__"


def setup(app: web.Application, url: str | None = None, **options: Any) -> None:
    """Open one :class:`~aiodlock.LockClient` for ``app`` while it runs, as ``app[LOCKS]``.

    Registers a ``cleanup_ctx``: the client opens at startup (after the contexts registered
    before it, so register this one first if your own contexts need locks) and closes at
    shutdown. At startup it also checks every :func:`hold` route: a template field its path
    lacks is a ``ValueError``, a lock the backend cannot provide an ``UnsupportedError``.

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
            check_backend(locks, held_routes(app))
            app[LOCKS] = locks
            yield

    app.cleanup_ctx.append(locks_context)


def hold(
    name_template: str,
    *,
    kind: str = "mutex",
    limit: int | None = None,
    retry_after: int = 1,
    detail: DetailHook | None = None,
    **lock_options: Any,
) -> Callable[[Callable[[web.Request, Lease], Awaitable[R]]], Handler[R]]:
    """Decorate a handler ``(request, lease)`` to run holding the lock its route names.

    Args:
        name_template: the lock's name, with ``{field}`` placeholders filled from
            ``request.match_info`` (``"order:{order_id}"`` on ``/orders/{order_id}``).
        kind: ``"mutex"``, ``"read"``, ``"write"`` or ``"semaphore"`` (needs ``limit``).
        limit: the semaphore's limit.
        retry_after: the ``Retry-After`` seconds sent with a 423 or a 503.
        detail: ``(exception) -> str``, the ``detail`` of a 423/503 body. By default
            :func:`default_detail`: ``"locked"``, ``"lock lost while handling the request"``,
            ``"lock service unavailable"`` -- never the service's URL or its driver's error,
            which are logged instead (``aiodlock.integrations``, one line: WARNING for a 503,
            INFO for a 423).
        **lock_options: the lock's options (``timeout``, ``ttl``, ``max_hold``, ``fair``...),
            checked here as the client checks them. Give web handlers a ``timeout``: ``None``
            waits as long as the lock is busy.

    Returns:
        A decorator; the decorated handler takes ``request`` only, as aiohttp calls it.

    Raises:
        TypeError, ValueError: a bad template, kind, limit or lock option, with the client's
            message, here rather than on every request.
    """
    recipe = LockRecipe.make(name_template, kind, limit, dict(lock_options), retry_after, detail)

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
                answer = answer_for(exc, recipe, f"{request.method} {request.path}")
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


def held_routes(app: web.Application) -> list[tuple[str, LockRecipe]]:
    """Each ``(route path, recipe)`` of a :func:`hold` handler in the app."""
    held = []
    for route in app.router.routes():
        recipe = getattr(route.handler, _RECIPE_ATTRIBUTE, None)
        if isinstance(recipe, LockRecipe):
            path = route.resource.canonical if route.resource is not None else "?"
            held.append((path, recipe))
    return held


def _missing_message(recipe: LockRecipe, missing: list[str], path: str) -> str:
    fields = ", ".join(f"{{{field}}}" for field in missing)
    return (
        f"hold({recipe.template.template!r}) on route {path!r}: {fields} is not in the route's path"
    )
