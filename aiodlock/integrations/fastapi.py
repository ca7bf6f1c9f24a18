"""FastAPI (and Starlette) glue: one lock client per app, a lock held around a handler.

Open the client with the app's lifespan, and declare the lock a handler needs as a
dependency; its name is made from the path parameters::

    from typing import Annotated

    from fastapi import FastAPI

    import aiodlock
    from aiodlock.integrations.fastapi import hold, lifespan

    app = FastAPI(lifespan=lifespan("redis://127.0.0.1:6379/0", namespace="shop"))

    @app.post("/orders/{order_id}/items")
    async def add_item(
        order_id: int, lease: Annotated[aiodlock.Lease, hold("order:{order_id}", timeout=5)]
    ) -> dict[str, int]:
        ...  # only one request per order runs this, across every worker process

What the client gets when the lock cannot be had or kept:

* busy past ``timeout`` (:class:`~aiodlock.LockTimeoutError`) → **423 Locked** with
  ``Retry-After``;
* the lock service is down (:class:`~aiodlock.BackendError`) → **503** with ``Retry-After``;
* the lease is lost while the handler runs → the handler is **cancelled** at its next
  ``await`` (as inside ``async with lock:``) and the client gets **503** with
  ``Retry-After``. A handler that finishes although its lease was lost under it also gets
  503: part of it ran unprotected.

How the loss reaches the handler: the dependency holds the lock with ``async with`` in the
request's task, so the core's loss guard cancels that task; FastAPI unwinds the handler and
throws the ``CancelledError`` into the dependency, whose ``async with`` turns it into
:class:`~aiodlock.LockLostError`, answered as 503. This needs the dependency to end *before*
the response is sent, which is why :func:`hold` returns ``Depends(..., scope="function")``
(FastAPI 0.121 or later); a cancellation from outside (the client went away, the server is
stopping) stays a cancellation.

See ``docs/integrations.md`` for the whole story.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final

from fastapi import Depends, FastAPI, HTTPException
from fastapi.routing import APIRoute
from starlette.requests import Request

from .. import Lease, LockClient, LockError, connect
from ._common import LockRecipe, answer_for

__all__ = ["hold", "lifespan", "lock_client"]

STATE_NAME: Final = "locks"
"""The client lives on ``app.state.locks`` (and on ``request.state.locks``, via lifespan state)."""

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[Any]]


def lifespan(
    url: str | None = None, *, inner: Lifespan | None = None, **options: Any
) -> Callable[[FastAPI], AbstractAsyncContextManager[Mapping[str, Any]]]:
    """A lifespan that opens one :class:`~aiodlock.LockClient` for the app, on ``app.state.locks``.

    ``FastAPI(lifespan=lifespan(url, namespace="shop"))``. The app's own lifespan runs
    *inside* it, with the client already open (and closed after it)::

        @asynccontextmanager
        async def my_lifespan(app: FastAPI) -> AsyncIterator[None]:
            await warm_cache(app.state.locks)
            yield

        app = FastAPI(lifespan=lifespan(url, inner=my_lifespan))

    Or call it from inside your own lifespan: ``async with lifespan(url)(app): yield``.

    At startup it also checks every route that uses :func:`hold`: a name template field that
    is not one of the route's path parameters is a ``ValueError`` there, before any request.

    Args:
        url: as for :func:`aiodlock.connect` (``memory://`` when omitted).
        inner: the app's own lifespan, run inside this one. Whatever it yields (lifespan
            state, a mapping) is passed on, with ``locks`` added.
        **options: :func:`aiodlock.connect` options (``namespace``, ``ttl``, ``timeout``...).
    """
    # Fail on a bad URL or option when the app is built, not when it starts.
    connect(url, **options)

    @asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[Mapping[str, Any]]:
        check_routes(app)
        async with connect(url, **options) as locks:
            setattr(app.state, STATE_NAME, locks)
            try:
                if inner is None:
                    yield {STATE_NAME: locks}
                else:
                    async with inner(app) as state:
                        yield {**(state or {}), STATE_NAME: locks}
            finally:
                delattr(app.state, STATE_NAME)

    return run


def lock_client(request: Request) -> LockClient:
    """The app's client (opened by :func:`lifespan`); a clear error if there is none."""
    client = getattr(request.app.state, STATE_NAME, None)
    if not isinstance(client, LockClient):
        raise RuntimeError(
            "no aiodlock client on app.state.locks: build the app with "
            "FastAPI(lifespan=aiodlock.integrations.fastapi.lifespan(url))"
        )
    return client


class _Hold:
    """The dependency :func:`hold` returns (inside ``Depends``)."""

    __slots__ = ("recipe",)

    def __init__(self, recipe: LockRecipe) -> None:
        self.recipe = recipe

    async def __call__(self, request: Request) -> AsyncIterator[Lease]:
        recipe = self.recipe
        missing = recipe.template.missing(request.path_params)
        if missing:
            # Only reachable without lifespan(), which refuses such a route at startup.
            raise RuntimeError(_missing_message(recipe, missing, request.scope.get("path", "?")))
        name = recipe.template.format(request.path_params, source="the path parameters")
        lock = recipe.lock(lock_client(request), name)
        try:
            async with lock as lease:
                yield lease
        except LockError as exc:
            answer = answer_for(exc, recipe.retry_after)
            if answer is None:
                raise
            raise HTTPException(answer.status, answer.detail, headers=answer.headers()) from exc

    def __repr__(self) -> str:
        return f"hold({self.recipe.template.template!r}, kind={self.recipe.kind!r})"


def hold(
    name_template: str,
    *,
    kind: str = "mutex",
    limit: int | None = None,
    retry_after: int = 1,
    **lock_options: Any,
) -> Any:
    """A dependency holding a lock for the handler's whole run; its value is the ``Lease``.

    Use it as a parameter's default or in ``Annotated``::

        @app.put("/catalog/{shop}")
        async def rebuild(
            shop: str, lease: Annotated[aiodlock.Lease, hold("catalog:{shop}", kind="write")]
        ) -> None: ...

    Args:
        name_template: the lock's name, with ``{field}`` placeholders filled from the route's
            path parameters (after FastAPI converted them: ``{order_id}`` of an ``int``
            parameter gives ``"order:42"``). A field that is not a path parameter of the route
            is a ``ValueError`` when :func:`lifespan` starts the app (a ``RuntimeError`` on
            the request if the app was started without it) — never a lock on the literal
            text.
        kind: ``"mutex"`` (``locks.lock``), ``"read"``, ``"write"`` or ``"semaphore"``
            (needs ``limit``).
        limit: the semaphore's limit.
        retry_after: the ``Retry-After`` seconds sent with a 423 or a 503.
        **lock_options: the lock's options (``timeout``, ``ttl``, ``max_hold``, ``reentrant``,
            ``fair``...). Give web handlers a ``timeout``: the client's default may be
            ``None``, which waits as long as the lock is busy.

    Returns:
        ``Depends(...)``, scoped to the handler function (its exit runs before the response
        is sent, so a loss or a late error still changes the answer).
    """
    recipe = LockRecipe.make(name_template, kind, limit, dict(lock_options), retry_after)
    return Depends(_Hold(recipe), scope="function")


def check_routes(app: FastAPI) -> None:
    """Refuse, at startup, a :func:`hold` template field that no path parameter fills."""
    problems = []
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        params = set(route.param_convertors)
        stack = [route.dependant]
        while stack:
            dependant = stack.pop()
            stack.extend(dependant.dependencies)
            call = dependant.call
            if isinstance(call, _Hold):
                missing = call.recipe.template.missing(params)
                if missing:
                    problems.append(_missing_message(call.recipe, missing, route.path))
    if problems:
        raise ValueError("; ".join(problems))


def _missing_message(recipe: LockRecipe, missing: list[str], path: str) -> str:
    fields = ", ".join(f"{{{field}}}" for field in missing)
    return (
        f"hold({recipe.template.template!r}) on route {path!r}: {fields} is not a path "
        "parameter of the route"
    )
