"""A tiny name -> function registry, used for attribution methods, advantage estimators and losses.

Every entry of one registry shares one signature, so callers never special-case a name.
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

from oarctl.errors import OarError

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def decorator(function: F) -> F:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = function
            return function

        return decorator

    def get(self, name: str) -> F:
        if name not in self._entries:
            raise OarError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(self.names())}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries
