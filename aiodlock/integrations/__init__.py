"""Glue for web frameworks: one lock client per app, a lock held around a handler.

- :mod:`aiodlock.integrations.fastapi` — ``lifespan()`` and the ``hold()`` dependency
  (``pip install 'aiodlock[fastapi]'``);
- :mod:`aiodlock.integrations.aiohttp` — ``setup(app)`` and the ``hold()`` handler decorator
  (``pip install 'aiodlock[aiohttp]'``).

Each module imports its framework; this package and ``import aiodlock`` import neither. Both
answer the same way when the lock cannot be had or kept (see ``docs/integrations.md``):

=================================  ======  =================================================
``LockTimeoutError``               423     busy past ``timeout``; ``Retry-After`` says when
                                           to try again
``LockLostError``                  503     the lease was lost: the handler was cancelled
``BackendError``                   503     the lock service is down; ``Retry-After``
=================================  ======  =================================================
"""

__all__: list[str] = []
