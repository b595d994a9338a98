"""Every runtime, by name: the one list of them. A name leads to its class (a ``Runtime``),
which makes a base's runtime, checks that it can run a major version, gives a seed its
programs and removes what it leaves behind. Every other list of runtimes (the settings, the
service's requests, the Action's inputs, the registry's rows, the command line's choices) is
read from here when it is checked, so a runtime added here is accepted everywhere at once.

``auto`` is not a runtime: a setting, a create or an input may say it, and ``choose`` then
picks one. An unknown name raises, naming the known ones; nothing falls back to another.

Each row imports its module only when it is used: settings and the command line's help read
the names, and the Docker runtime's module costs them more than the rest of their start-up.
"""

from __future__ import annotations

from collections.abc import Callable

from pgoverlay.errors import ConfigError
from pgoverlay.runner.runtime import Runtime

AUTO = "auto"


def _local() -> type[Runtime]:
    from pgoverlay.runner.runtime.local import LocalRuntime

    return LocalRuntime


def _docker() -> type[Runtime]:
    from pgoverlay.runner.runtime.docker import DockerRuntime

    return DockerRuntime


# name -> its class, imported when asked for
RUNTIMES: dict[str, Callable[[], type[Runtime]]] = {"local": _local, "docker": _docker}


def names() -> tuple[str, ...]:
    """The runtimes a branch may run on."""
    return tuple(RUNTIMES)


def choices() -> tuple[str, ...]:
    """What a setting, a create or an input may ask for: ``auto`` or a runtime."""
    return (AUTO, *RUNTIMES)


def problem(name: object, *, auto: bool = False) -> str | None:
    """What is wrong with runtime ``name`` (with ``auto``, ``auto`` is right too), or None."""
    known = choices() if auto else names()
    if isinstance(name, str) and name in known:
        return None
    return f"unknown runtime {str(name)[:40]!r}: use one of {', '.join(known)}"


def get(name: str) -> type[Runtime]:
    """The class of runtime ``name``; a ConfigError names the known ones."""
    row = RUNTIMES.get(name)
    if row is None:
        raise ConfigError(problem(name) or "")
    return row()


def rows() -> list[tuple[str, type[Runtime]]]:
    """Every runtime's name and class: for what acts on all of them (gc, pool rm)."""
    return [(name, row()) for name, row in RUNTIMES.items()]
