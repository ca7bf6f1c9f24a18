"""Where an SQL backend is in its life (new, open, closing, closed), shared by its parts."""

from __future__ import annotations

from .. import BackendError

__all__ = ["Life"]


class Life:
    """The backend's state; every part (pool, janitor, engine) reads the same one.

    Example::

        life = Life("mysql", "mysql://app@db/shop")
        life.state = "open"
        life.require_open()  # raises BackendError unless open
    """

    __slots__ = ("name", "state", "where")

    def __init__(self, name: str, where: str) -> None:
        self.name = name
        self.where = where
        self.state = "new"

    @property
    def open(self) -> bool:
        """True between ``open()`` and ``aclose()``."""
        return self.state == "open"

    def require_open(self) -> None:
        """Raise :class:`BackendError` unless the backend is open."""
        if self.state != "open":
            raise BackendError(f"the {self.name} backend for {self.where} is {self.state}")
