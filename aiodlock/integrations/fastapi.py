"""FastAPI (and Starlette) glue: one lock client per app, a lock held around a handler.

The client opens with the app's lifespan; a handler declares its lock as a dependency named
from the path parameters. Busy past ``timeout`` is 423, a service down or a lease lost under
the handler (cancelled at its next ``await``) 503, both with ``Retry-After`` and a generic
``detail`` (``hold(detail=...)`` chooses another; the exception goes to the log). ``hold()`` is
already ``Depends(..., scope="function")``: use it bare, not inside ``Depends()``; why:
docs/integrations.md. Example::

    app = FastAPI(lifespan=lifespan("redis://127.0.0.1:6379/0", namespace="shop"))

    @app.post("/orders/{order_id}/items")
    async def add_item(
        order_id: int, lease: Annotated[aiodlock.Lease, hold("order:{order_id}", timeout=5)]
    ) -> dict[str, int]:
        ...  # only one request per order runs this, across every worker process
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final

from fastapi import FastAPI, HTTPException, params
from fastapi.routing import APIRoute
from starlette.requests import Request

from .. import Lease, LockClient, LockError, connect
from ._common import DetailHook, LockRecipe, answer_for, check_backend, default_detail

__all__ = ["default_detail", "hold", "lifespan", "lock_client"]

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
    is not one of the route's path parameters is a ``ValueError`` there, before any request, and
    a lock the backend cannot provide (``fair=True`` on ``redlock://``) an ``UnsupportedError``.

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
            check_backend(locks, held_routes(app))
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
            where = f"{request.method} {request.url.path}"
            answer = answer_for(exc, recipe, where)
            if answer is None:
                raise
            raise HTTPException(answer.status, answer.detail, headers=answer.headers()) from exc

    def __repr__(self) -> str:
        return f"hold({self.recipe.template.template!r}, kind={self.recipe.kind!r})"


class _HoldDepends(params.Depends):
    """What :func:`hold` returns: FastAPI's ``Depends(_Hold, scope="function")``, which also
    refuses to be wrapped in another ``Depends()``.

    ``Depends(hold(...))`` would make the marker itself the dependency; FastAPI reads its
    signature when the route is declared, and this one raises a ``TypeError`` that says what
    to write instead (a working wrapper would have FastAPI's default scope, which releases the
    lock only after the response is sent: a loss could no longer change the answer).
    """

    @property
    def __signature__(self) -> Any:
        raise TypeError(self._message())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # reached only by hand
        raise TypeError(self._message())

    def _message(self) -> str:
        return (
            f"Depends({self.dependency!r}): hold() already returns the dependency "
            "(Depends(..., scope='function')); use it bare, as in "
            "`lease: Annotated[aiodlock.Lease, hold(...)]` or `lease: aiodlock.Lease = hold(...)`"
        )


def hold(
    name_template: str,
    *,
    kind: str = "mutex",
    limit: int | None = None,
    retry_after: int = 1,
    detail: DetailHook | None = None,
    **lock_options: Any,
) -> Any:
    """A dependency holding a lock for the handler's whole run; its value is the ``Lease``.

    Use it bare, as a parameter's default or in ``Annotated`` -- it already is the
    ``Depends(...)``, so ``Depends(hold(...))`` is a ``TypeError`` when the route is declared::

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
        detail: ``(exception) -> str``, the ``detail`` of a 423/503 body. By default
            :func:`default_detail`: ``"locked"``, ``"lock lost while handling the request"``,
            ``"lock service unavailable"`` -- never the service's URL or its driver's error,
            which are logged instead (``aiodlock.integrations``, one line: WARNING for a 503,
            INFO for a 423).
        **lock_options: the lock's options (``timeout``, ``ttl``, ``max_hold``, ``reentrant``,
            ``fair``...), checked here as the client checks them. Give web handlers a
            ``timeout``: the client's default may be ``None``, which waits as long as the lock
            is busy.

    Returns:
        ``Depends(...)``, scoped to the handler function (its exit runs before the response
        is sent, so a loss or a late error still changes the answer).

    Raises:
        TypeError, ValueError: a bad template, kind, limit or lock option, with the client's
            message, here rather than on every request.
    """
    recipe = LockRecipe.make(name_template, kind, limit, dict(lock_options), retry_after, detail)
    return _HoldDepends(_Hold(recipe), scope="function")


def check_routes(app: FastAPI) -> None:
    """Refuse, at startup, a :func:`hold` template field that no path parameter fills."""
    problems = []
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        params = set(route.param_convertors)
        for recipe in _recipes(route):
            missing = recipe.template.missing(params)
            if missing:
                problems.append(_missing_message(recipe, missing, route.path))
    if problems:
        raise ValueError("; ".join(problems))


def held_routes(app: FastAPI) -> list[tuple[str, LockRecipe]]:
    """Each ``(route path, recipe)`` of a :func:`hold` in the app."""
    return [
        (route.path, recipe)
        for route in app.routes
        if isinstance(route, APIRoute)
        for recipe in _recipes(route)
    ]


def _recipes(route: APIRoute) -> list[LockRecipe]:
    """The recipes of the route's :func:`hold` dependencies, however deep."""
    found = []
    stack = [route.dependant]
    while stack:
        dependant = stack.pop()
        stack.extend(dependant.dependencies)
        if isinstance(dependant.call, _Hold):
            found.append(dependant.call.recipe)
    return found


def _missing_message(recipe: LockRecipe, missing: list[str], path: str) -> str:
    fields = ", ".join(f"{{{field}}}" for field in missing)
    return (
        f"hold({recipe.template.template!r}) on route {path!r}: {fields} is not a path "
        "parameter of the route"
    )
