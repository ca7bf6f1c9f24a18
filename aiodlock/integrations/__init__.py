"""Glue for web frameworks: one lock client per app, a lock held around a handler.

- :mod:`aiodlock.integrations.fastapi` — ``lifespan()`` and the ``hold()`` dependency
  (``pip install 'aiodlock[fastapi]'``);
- :mod:`aiodlock.integrations.aiohttp` — ``setup(app)`` and the ``hold()`` handler decorator
  (``pip install 'aiodlock[aiohttp]'``).

Each module imports its framework; this package and ``import aiodlock`` import neither. Both
answer alike when the lock cannot be had or kept (docs/integrations.md): ``LockTimeoutError``
(busy past ``timeout``) is 423 with ``Retry-After``; ``LockLostError`` (the lease was lost:
the handler was cancelled) and ``BackendError`` (the lock service is down) are 503 with
``Retry-After``. The bodies are generic ("locked", "lock service unavailable") and the error
goes to the log; ``hold(detail=...)`` chooses the words.
"""

__all__: list[str] = []
