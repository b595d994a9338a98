"""What the engine service accepts: one ``Shape`` (a frozen record class, see ``shape``) per
request, shared by the service and its callers. The answers are in ``views``.

In the service, FastAPI reads a caller's JSON into each request's dataclass twin with pydantic
(types, and no unknown fields), and the request made from it then checks its values in
``__post_init__``; a caller that builds one gets the same checks, as a ``RequestError``, before
anything is sent. Neither pydantic models nor dataclasses: root's CLI builds a request for
every create, and importing either would cost it more than the engine's own work.

Nothing here names a filesystem path, a command or a setting: a caller chooses a branch name,
a base among the seeded ones, a runtime among those of ``runtime.table``, a TTL and whose
pull request it is for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, ClassVar

from pgoverlay.errors import RequestError
from pgoverlay.github.grammar import LOGIN_MAX, LOGIN_RE, REPOSITORY_MAX, REPOSITORY_RE, is_login
from pgoverlay.runner.names import NAME_RE
from pgoverlay.runner.runtime import table as runtimes
from pgoverlay.runner.service import shape
from pgoverlay.runner.service.shape import Shape

MAX_RECORD_BYTES = 256 * 1024
MAX_TTL_SECONDS = 366 * 86400


def _documented(schema: dict[str, Any], cls: type[Any]) -> None:
    """Writes a request's checks (its ``_checks``) into its JSON schema, so the service's
    OpenAPI document states what ``__post_init__`` enforces. A check may be a function: it
    is asked when the schema is made (the runtimes are those of the table then)."""
    for field, checks in getattr(cls, "_checks", {}).items():
        prop = schema["properties"][field]
        typed = [option for option in prop.get("anyOf", [prop]) if option.get("type") != "null"]
        typed[0].update(checks() if callable(checks) else checks)


def _runtimes() -> dict[str, Any]:
    return {"enum": list(runtimes.names())}


# pydantic's configuration of these requests' twins, where the service reads them: a field a
# request does not have is refused, not ignored.
_STRICT: dict[str, Any] = {"extra": "forbid", "json_schema_extra": _documented}
_NAME = {"pattern": NAME_RE.pattern, "maxLength": 63}
_REPOSITORY = {"pattern": REPOSITORY_RE.pattern, "maxLength": REPOSITORY_MAX}


EXCERPT_CHARS = 40


def excerpt(value: object) -> str:
    """``value`` as a refusal quotes it: its repr, cut to ``EXCERPT_CHARS`` characters with its
    length said. An answer never echoes a caller's whole input (the service's 422s included)."""
    text = repr(value)
    if len(text) <= EXCERPT_CHARS:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} as text"
    return f"{text[:EXCERPT_CHARS]}... ({size})"


def _name(field: str, value: str) -> None:
    if not NAME_RE.match(value):
        raise RequestError(
            f"{field}: {excerpt(value)} is not a name: use 1-63 lowercase letters, digits and "
            "dashes, starting with a letter or digit (e.g. pr-123)"
        )


def _repository(value: str | None) -> None:
    if value is not None and not REPOSITORY_RE.match(value):
        raise RequestError(f"repository: {excerpt(value)} is not OWNER/NAME (e.g. acme/shop)")


def _within(field: str, value: float, *, low: float, high: float, low_open: bool = False) -> None:
    if value < low or (low_open and value == low) or value > high:
        above = f"above {low:g}" if low_open else f"at least {low:g}"
        raise RequestError(
            f"{field}: {value:g} is out of range: it must be {above}, at most {high:g}"
        )


class CreateRequest(Shape):
    """Create a branch ``name`` of ``base`` (the only base when not given), destroyed by gc
    after ``ttl_seconds`` (at most 366 days), for ``repository``'s pull request ``pr``, and
    suspended after ``suspend_after_seconds`` with no connection (0: never; not given: the
    pool's ``suspend_after``). Every caller but root must name the ``repository``: the
    service's limits count it."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    _checks: ClassVar[dict[str, dict[str, Any] | Callable[[], dict[str, Any]]]] = {
        "name": _NAME,
        "base": _NAME,
        "ttl_seconds": {"exclusiveMinimum": 0, "maximum": MAX_TTL_SECONDS},
        "runtime": _runtimes,
        "repository": _REPOSITORY,
        "pr": {"exclusiveMinimum": 0, "maximum": 2**31 - 1},
        "suspend_after_seconds": {"minimum": 0, "maximum": MAX_TTL_SECONDS},
    }

    name: str
    base: str | None = None
    ttl_seconds: int | None = None
    runtime: str | None = None  # a name in runtime.table
    repository: str | None = None
    pr: int | None = None
    suspend_after_seconds: int | None = None

    def __post_init__(self) -> None:
        _name("name", self.name)
        if self.base is not None:
            _name("base", self.base)
        if self.ttl_seconds is not None:
            _within("ttl_seconds", self.ttl_seconds, low=0, high=MAX_TTL_SECONDS, low_open=True)
        if self.runtime is not None and self.runtime not in runtimes.names():
            raise RequestError(
                f"runtime: {excerpt(self.runtime)} is not one of {', '.join(runtimes.names())}"
            )
        _repository(self.repository)
        if self.pr is not None:
            _within("pr", self.pr, low=0, high=2**31 - 1, low_open=True)
        if self.suspend_after_seconds is not None:
            _within(
                "suspend_after_seconds", self.suspend_after_seconds, low=0, high=MAX_TTL_SECONDS
            )


class OwnerRequest(Shape):
    """Reset and destroy: with ``repository``, refused when the branch is another's."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    _checks: ClassVar[dict[str, dict[str, Any]]] = {"repository": _REPOSITORY}

    repository: str | None = None

    def __post_init__(self) -> None:
        _repository(self.repository)


class RecordRequest(Shape):
    """A note the branch's owner keeps with it: JSON text of at most ``MAX_RECORD_BYTES``
    bytes, which the engine stores and hands back but never reads (the PR workflow keeps what
    it last did there). With ``repository``, refused when the branch is another's."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    _checks: ClassVar[dict[str, dict[str, Any]]] = {
        "repository": _REPOSITORY,
        "data": {"maxLength": MAX_RECORD_BYTES},
    }

    repository: str | None = None
    data: str

    def __post_init__(self) -> None:
        _repository(self.repository)
        size = len(self.data.encode())
        if size > MAX_RECORD_BYTES:
            raise RequestError(
                f"data: the record is {size} bytes; at most {MAX_RECORD_BYTES} are kept"
            )
        try:
            json.loads(self.data)
        except ValueError:
            raise RequestError("data: the record is not JSON text") from None


class TraceRequest(Shape):
    """Open a trace of a branch (replacing one left open), sampling pg_locks every
    ``interval`` seconds (0.01 to 0.1) and ending itself after ``max_seconds`` (at most 48
    hours). With ``repository``, refused when the branch is another's."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    _checks: ClassVar[dict[str, dict[str, Any]]] = {
        "repository": _REPOSITORY,
        "interval": {"minimum": 0.01, "maximum": 0.1},
        "max_seconds": {"exclusiveMinimum": 0, "maximum": 48 * 3600},
    }

    repository: str | None = None
    interval: float = 0.05
    max_seconds: float = 6 * 3600

    def __post_init__(self) -> None:
        _repository(self.repository)
        _within("interval", self.interval, low=0.01, high=0.1)
        _within("max_seconds", self.max_seconds, low=0, high=48 * 3600, low_open=True)


# A GitHub login (1-39 letters, digits and single hyphens), as the front door vouches for one.
LOGIN_PATTERN = LOGIN_RE.pattern
_VOUCHED = re.compile("^github:" + LOGIN_PATTERN[1:])


class GrantRequest(Shape):
    """A credential in a branch: for the person with GitHub ``login``, or (``app``, with no
    login) for the pull request's preview app; read-write unless ``read_only``; valid for
    ``ttl`` seconds (the pool's default when not given; the pool caps it). With ``repository``,
    refused when the branch is another's. ``vouched_by`` (``github:LOGIN``) is set by the front
    door alone, once it has verified the person: for that login only. The app's credential,
    asked for again, is renewed (same password) unless ``rotate`` asks for a new password."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    _checks: ClassVar[dict[str, dict[str, Any]]] = {
        "login": {"pattern": LOGIN_PATTERN, "maxLength": LOGIN_MAX},
        "ttl": {"exclusiveMinimum": 0, "maximum": MAX_TTL_SECONDS},
        "repository": _REPOSITORY,
        "vouched_by": {"pattern": _VOUCHED.pattern, "maxLength": len("github:") + LOGIN_MAX},
    }

    login: str | None = None
    read_only: bool = False
    ttl: int | None = None
    repository: str | None = None
    app: bool = False
    vouched_by: str | None = None
    rotate: bool = False

    def __post_init__(self) -> None:
        if self.rotate and not self.app:
            raise RequestError(
                "rotate: only the app's credential is renewed when asked again; a person's gets "
                "a new password at each grant (ask without rotate)"
            )
        if self.app and self.login is not None:
            raise RequestError("login: an app credential names no login (its role is the app's)")
        if not self.app and self.login is None:
            raise RequestError("login: name the GitHub login to grant to (or ask for app: true)")
        if self.login is not None and not is_login(self.login):
            raise RequestError(
                f"login: {excerpt(self.login)} is not a GitHub login: 1-39 letters, digits and "
                "single hyphens, not first or last (e.g. octo-cat)"
            )
        if self.ttl is not None:
            _within("ttl", self.ttl, low=0, high=MAX_TTL_SECONDS, low_open=True)
        _repository(self.repository)
        if self.vouched_by is not None:
            if not _VOUCHED.match(self.vouched_by) or len(self.vouched_by) > 7 + LOGIN_MAX:
                raise RequestError(f"vouched_by: {excerpt(self.vouched_by)} is not github:LOGIN")
            if self.login is None or self.vouched_by.lower() != f"github:{self.login.lower()}":
                raise RequestError(
                    "vouched_by: the front door vouches for the person it grants to: "
                    "github:LOGIN of the request's own login"
                )


class CredentialCheck(Shape):
    """The front door asks whether an API token a caller sent (``pgo_...``, see ``tokens``) is
    good for acting for ``repository``: the door never reads the token store itself."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _STRICT
    _checks: ClassVar[dict[str, dict[str, Any]]] = {
        "secret": {"maxLength": 128},
        "repository": _REPOSITORY,
    }

    secret: str = shape.field(repr=False)
    repository: str

    def __post_init__(self) -> None:
        if len(self.secret) > 128:
            raise RequestError("secret: longer than an API token is")
        _repository(self.repository)
