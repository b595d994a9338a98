"""Command spellings kept for one release after a rename: the old command line is rewritten to
the new one before it is parsed, and one line on stderr names the new spelling.

`pgoverlay seed` took `list`, `rm` and `warm` where the base's name goes (so no base could be
called that) and its help mixed the flags of four commands; they are `pgoverlay base seed`,
`base list`, `base rm` and `base warm` now. This module and its call in ``cli.main`` go in the
release after the one that renamed them.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgoverlay.cli.common import err

# The old command (a key of ``cli.RENAMED``), and the words that named its subcommands where
# the base's name goes.
OLD = "seed"
_SUBCOMMANDS = ("list", "rm", "warm")
# The old command's options that take a value as the next word (``--from DSN``).
_VALUED = frozenset(
    {"--count", "--from", "--password-file", "--via", "--mask", "--scale", "--runtime", "--version"}
)


def rewrite(argv: Sequence[str]) -> list[str]:
    """``argv`` in the new spelling (unchanged when it uses no old one), saying so on stderr."""
    at = next((i for i, word in enumerate(argv) if not word.startswith("-")), None)
    if at is None or argv[at] != OLD:
        return list(argv)
    rest = list(argv[at + 1 :])
    name = _first_positional(rest)
    # As before: `seed list --from DSN` seeds a base called `list`.
    seeding = any(w in ("--from", "--demo") or w.startswith("--from=") for w in rest)
    if name is not None and rest[name] in _SUBCOMMANDS and not seeding:
        command = rest.pop(name)
        old, new = f"seed {command}", f"base {command}"
        rewritten = ["base", command, *rest]
    else:
        old, new = "seed NAME", "base seed NAME"
        rewritten = ["base", "seed", *rest]
    err.line(
        f"warning: `pgoverlay {old}` is deprecated and goes in the next release: "
        f"use `pgoverlay {new}`"
    )
    return [*argv[:at], *rewritten]


def _first_positional(args: Sequence[str]) -> int | None:
    """The index of the first word of ``args`` that is neither an option nor an option's
    value."""
    skip = False
    for i, word in enumerate(args):
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = word in _VALUED
        else:
            return i
    return None
