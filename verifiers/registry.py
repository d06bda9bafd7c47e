"""Lazy registries: names mapped to objects that live in modules imported on first use.

Every pluggable kind of thing (artifact formats, runtimes, report writers, source frameworks,
export routes) is one of these: an entry is a name and a "package.module:attribute" path (or a
module path, for the module itself), so listing the names costs nothing and a command imports only the modules it uses. A registered
object may also be given directly. A registry with a `plugins` group also holds what installed
distributions declare under that entry-point group (`[project.entry-points."exportgate.runtimes"]`
in a plug-in's pyproject.toml), read the first time a name is not found or the names are listed.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from verifiers.errors import BadInput

T = TypeVar("T")


class LazyRegistry(Mapping[str, T], Generic[T]):
    """`kind` names the entries in errors ("runtime", "format"); with `instantiate`, an entry is a
    class and the registry holds one instance of it."""

    def __init__(self, kind: str, entries: dict[str, str], instantiate: bool = False, plugins: str | None = None):
        self.kind = kind
        self._where: dict[str, str | Any] = dict(entries)
        self._loaded: dict[str, T] = {}
        self._instantiate = instantiate
        self._plugins = plugins

    def _read_plugins(self) -> None:
        if self._plugins is None:
            return
        from importlib.metadata import entry_points

        for entry in entry_points(group=self._plugins):
            self._where.setdefault(entry.name, entry.value)
        self._plugins = None

    def register(self, name: str, where: str | Any) -> None:
        """Add or replace an entry: a "module:attribute" path, or the object itself."""
        self._where[name] = where
        self._loaded.pop(name, None)

    def unregister(self, name: str) -> None:
        self._where.pop(name, None)
        self._loaded.pop(name, None)

    def __getitem__(self, name: str) -> T:
        if name not in self._loaded:
            if name not in self._where:
                self._read_plugins()
            if name not in self._where:
                raise KeyError(name)
            where = self._where[name]
            if isinstance(where, str):  # "package.module:attribute", or "package.module" for the module itself
                module, _, attribute = where.partition(":")
                where = importlib.import_module(module)
                where = getattr(where, attribute) if attribute else where
            self._loaded[name] = where() if self._instantiate and isinstance(where, type) else where
        return self._loaded[name]

    def get_or_fail(self, name: str, option: str) -> T:
        """The entry, or a one-line BadInput naming the option and the known names."""
        if name not in self:
            raise BadInput(f"{option} {name}: unknown {self.kind} (known: {', '.join(self)})")
        return self[name]

    def __iter__(self) -> Iterator[str]:
        self._read_plugins()
        return iter(list(self._where))

    def __len__(self) -> int:
        self._read_plugins()
        return len(self._where)

    def __contains__(self, name: object) -> bool:
        if name not in self._where:
            self._read_plugins()
        return name in self._where
