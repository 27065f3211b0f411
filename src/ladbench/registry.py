"""A registry of named entries (the methods, the prompt variants): each entry is added once,
by the package or by a plugin at import (``ladbench.plugins``), and looked up by name with a
one-line error that lists what is known."""

from __future__ import annotations

from typing import Iterable, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(dict[str, T]):
    """A ``dict`` of entries by name that refuses a second entry of a name and answers an
    unknown name with the names it knows (in the order they were added)."""

    def __init__(self, kind: str, entries: Iterable[tuple[str, T]] | dict[str, T] = ()) -> None:
        super().__init__(entries)
        self.kind = kind

    def register(self, name: str, entry: T) -> T:
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self[name] = entry
        return entry

    def lookup(self, name: str) -> T:
        try:
            return self[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self)}") from None
