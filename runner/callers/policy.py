"""The pool's policy: which GitHub Actions jobs may use it, read from the admin's YAML file and
asked of a verified :class:`~pgoverlay.runner.callers.oidc.Identity`. Pure but for :func:`load`.

A policy file::

    owners:                       # the accounts whose repositories may use the pool
      - acme                      # by name
      - {name: octo-org, id: 5}   # and id: a re-created account of that name is refused
    repositories:                 # optional: without it, every repository of the owners
      - acme/*                    # every repository of acme
      - {name: octo-org/shop, id: 2002, branches: 3}
    limits:                       # optional; a missing one leaves the pool's setting alone
      total: 40                   # branches of the network's callers in all
      per_repository: 5           # branches of one repository (a repository's `branches` wins)
    forks: false                  # may a fork's pull request get a branch?
    fork_write_tokens: false      # does a private repository send fork PR runs write tokens?
    workflows:                    # optional: job_workflow_ref globs; without it, any workflow
      - "acme/*/.github/workflows/pgoverlay.yml@*"

Names compare as GitHub does, without regard to case; an ``id`` pins the account or repository
(``repository_owner_id``, ``repository_id``): GitHub keeps them through a rename and a
re-created repository of the same name gets another, so a pinned entry refuses the impostor and
says so. Every repository entry must be of a listed owner. A workflow glob matches the whole
``job_workflow_ref`` (``owner/repo/.github/workflows/file.yml@ref``; ``*`` also matches ``/``),
case-sensitively, as GitHub writes it.

**Forks.** The token cannot tell a fork's pull request from a branch's: for ``pull_request``
and its review events the ``repository`` is the base repository, ``head_ref`` a branch name
without its repository, and no claim names the head repository. What tells them apart is how
GitHub hands tokens out:

- a ``pull_request`` (or review) run of a fork gets a read-only ``GITHUB_TOKEN`` and no OIDC
  token (``id-token`` has no read level), except in a private or internal repository whose
  owner turned on "Send write tokens to workflows from pull requests" (off by default). So with
  ``forks: false`` such a run is admitted when the repository is public, or when the policy
  says that setting is off (``fork_write_tokens: false``, the default), and refused otherwise;
- a ``pull_request_target``, ``workflow_run`` or ``issue_comment`` run gets write tokens, OIDC
  included, whoever opened the pull request, and may check the fork's code out: with
  ``forks: false`` it is refused unless the caller of :meth:`Policy.admit` looked the pull
  request up (``from_fork=False``: its head repository is its base, by id).

A caller that knows (the pull request's ``head.repo.id`` from GitHub's API against
``repository_id``) passes ``from_fork`` and the guesses above are not made.

**On the engine's socket** a caller names a repository and proves nothing:
:meth:`Policy.admit_repository` asks only what a name can answer (owners and repositories by
name, and the limits; see docs/policy.md).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from pgoverlay.errors import ConfigError, Location, Problems, config_error, dotted
from pgoverlay.runner import safefs
from pgoverlay.runner.callers.oidc import Identity
from pgoverlay.runner.names import is_github_login

MAX_POLICY_BYTES = 1 << 20
_FIX = (
    "a policy holds owners, and optionally repositories, limits, forks, fork_write_tokens and "
    "workflows (docs/policy.md)"
)

ForkTokens = Literal["write-tokens", "always"]
# The events whose runs a fork's pull request can start, and how such a run gets an OIDC
# token: only where a private repository sends fork runs write tokens, or always.
FORK_EVENTS: dict[str, ForkTokens] = {
    "pull_request": "write-tokens",
    "pull_request_review": "write-tokens",
    "pull_request_review_comment": "write-tokens",
    "pull_request_target": "always",
    "workflow_run": "always",
    "issue_comment": "always",
}
Rule = Literal["owners", "repositories", "workflows", "forks"]


def _scalar_name(item: object) -> bool:
    return isinstance(item, str) or (isinstance(item, int) and not isinstance(item, bool))


def _workflow_glob(pattern: str) -> str:
    if "@" not in pattern or "/" not in pattern.partition("@")[0]:
        raise ValueError(
            f"{pattern!r} cannot match a job_workflow_ref "
            "(owner/repo/.github/workflows/file.yml@ref): end it with @ and the ref, "
            "or @* for any ref"
        )
    return pattern


# A glob of job_workflow_ref values (fnmatch's, case-sensitive).
WorkflowGlob = Annotated[str, AfterValidator(_workflow_glob)]


class Owner(BaseModel):
    """An account whose repositories may use the pool; ``id`` pins it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    id: int | None = Field(default=None, gt=0)

    @field_validator("name")
    @classmethod
    def _login(cls, name: str) -> str:
        if not is_github_login(name):
            raise ValueError(
                f"{name!r} is not a GitHub account name (letters, digits and single hyphens, "
                "at most 39)"
            )
        return name


class Repository(BaseModel):
    """A repository that may use the pool (``owner/name``, or ``owner/*`` for all of the
    owner's); ``id`` pins it; ``branches`` is its own limit (each repository's, for a
    wildcard)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    id: int | None = Field(default=None, gt=0)
    branches: int | None = Field(default=None, ge=1)

    @field_validator("name")
    @classmethod
    def _full_name(cls, name: str) -> str:
        owner, slash, repo = name.partition("/")
        plain = all(c.isascii() and (c.isalnum() or c in "_.-") for c in repo)
        plain = plain and 0 < len(repo) <= 100
        if not slash or not is_github_login(owner) or not (repo == "*" or plain):
            raise ValueError(
                f"{name!r} is not owner/name or owner/* (e.g. acme/shop, acme/*): the only "
                "wildcard is a whole repository name"
            )
        return name

    @property
    def owner(self) -> str:
        return self.name.partition("/")[0]

    @property
    def wildcard(self) -> bool:
        return self.name.endswith("/*")


class Limits(BaseModel):
    """Branch limits for the network's callers; a missing one leaves the pool's setting
    (``PGOVERLAY_MAX_BRANCHES``, ``PGOVERLAY_MAX_BRANCHES_PER_REPOSITORY``) alone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total: int | None = Field(default=None, ge=1)
    per_repository: int | None = Field(default=None, ge=1)


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What the policy says of one identity: ``allowed``, or refused by ``rule`` (the policy's
    key) for ``reason``; the branch limits that hold for it (None: the pool's setting)."""

    allowed: bool
    rule: Rule | None = None
    reason: str = ""
    branch_limit: int | None = None  # branches of this repository
    total_limit: int | None = None


class Policy(BaseModel):
    """The pool's policy file, validated (see the module's docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    owners: list[Owner] = Field(min_length=1)
    repositories: list[Repository] | None = None
    limits: Limits = Limits()
    forks: bool = False
    fork_write_tokens: bool = False
    workflows: list[WorkflowGlob] | None = None

    @field_validator("owners", "repositories", mode="before")
    @classmethod
    def _short_form(cls, value: Any) -> Any:
        """``- acme`` for ``- {name: acme}`` (``- 1234`` too: YAML reads a login of digits as a
        number)."""
        if isinstance(value, list):
            return [{"name": str(item)} if _scalar_name(item) else item for item in value]
        return value

    @field_validator("repositories", "workflows")
    @classmethod
    def _not_empty(cls, value: list[Any] | None) -> list[Any] | None:
        if value is not None and not value:
            raise ValueError(
                "an empty list admits nothing: list entries, or remove the key to admit all"
            )
        return value

    # -- asking it ----------------------------------------------------------------------

    def admit(self, identity: Identity, *, from_fork: bool | None = None) -> Decision:
        """May ``identity``'s job use the pool? ``from_fork``: whether its pull request comes
        from a fork, when the caller found out (None: the token is all there is)."""
        refusal = (
            self._owner_refusal(identity.repository_owner, identity.repository_owner_id)
            or self._repository_refusal(identity.repository, identity.repository_id)
            or self._workflow_refusal(identity)
            or self._fork_refusal(identity, from_fork=from_fork)
        )
        return self._decision(identity.repository, refusal)

    def admit_repository(self, repository: str) -> Decision:
        """May a caller on the engine's socket have a branch for ``repository`` (owner/name,
        as the caller says: a member of the service's group proves no repository)? Only the
        rules a name can be held to: ``owners`` and ``repositories`` by name (an entry's
        ``id`` pins nothing here: no id comes with the name), and the limits. ``workflows``
        and ``forks`` need a token's claims and are not asked."""
        owner = repository.partition("/")[0]
        refusal = self._owner_refusal(owner, None) or self._repository_refusal(repository, None)
        return self._decision(repository, refusal)

    def admit_listener(
        self, *, repository: str, repository_id: int, owner_id: int, from_fork: bool | None
    ) -> Decision:
        """May the webhook listener, with an API token the admin issued, act for
        ``repository`` (which it names, with its id and its owner's, from the signed
        delivery)? ``owners`` and ``repositories`` hold as for a job, by name and id;
        ``workflows`` does not apply (no workflow runs: the listener does the work itself);
        ``forks``, when ``from_fork`` is given (a create: the listener tells from the
        delivery), refuses a fork's pull request unless ``forks: true``; the limits hold."""
        owner = repository.partition("/")[0]
        refusal = self._owner_refusal(owner, owner_id) or self._repository_refusal(
            repository, repository_id
        )
        if refusal is None and from_fork and not self.forks:
            refusal = (
                "forks",
                (
                    f"this pull request of {repository} comes from a fork, and the pool's policy "
                    "does not branch forks (forks: false): no branch for it"
                ),
            )
        return self._decision(repository, refusal)

    def _decision(self, repository: str, refusal: tuple[Rule, str] | None) -> Decision:
        if refusal:
            rule, reason = refusal
            return Decision(allowed=False, rule=rule, reason=reason)
        entry = self._repository_entry(repository)
        own = entry.branches if entry is not None else None
        return Decision(
            allowed=True,
            branch_limit=own if own is not None else self.limits.per_repository,
            total_limit=self.limits.total,
        )

    def _owner_refusal(self, name: str, number: int | None) -> tuple[Rule, str] | None:
        """Why the owner ``name`` (of id ``number``; None: unknown, the name alone is
        asked) is refused, or None."""
        for owner in self.owners:
            if owner.name.lower() != name.lower():
                continue
            if owner.id is not None and number is not None and owner.id != number:
                return "owners", (
                    f"the owner {name} has id {number}, but the policy pins {owner.name} to id "
                    f"{owner.id}: that account was renamed or deleted and another took its "
                    "name; if this is the account you mean, write its id in owners"
                )
            return None
        renamed = next((o for o in self.owners if number is not None and o.id == number), None)
        if renamed is not None:
            return "owners", (
                f"the owner {name} (id {number}) is not in the policy's owners, which list "
                f"that id as {renamed.name}: the account was renamed; write its new name there"
            )
        listed = ", ".join(o.name for o in self.owners)
        return "owners", (
            f"the owner {name} is not one this pool serves (owners: {listed}): add it to "
            "owners in the pool's policy to let its repositories in"
        )

    def _repository_entry(self, repository: str) -> Repository | None:
        """The entry that admits ``repository`` (owner/name) by name: its own, else its
        owner's wildcard (None without one, or without ``repositories``)."""
        wanted = repository.lower()
        owner = wanted.partition("/")[0]
        entries = self.repositories or []
        exact = next((r for r in entries if r.name.lower() == wanted), None)
        return exact or next((r for r in entries if r.wildcard and r.owner.lower() == owner), None)

    def _repository_refusal(self, name: str, number: int | None) -> tuple[Rule, str] | None:
        """Why the repository ``name`` (of id ``number``; None: unknown, the name alone is
        asked) is refused, or None."""
        if self.repositories is None:
            return None
        entry = self._repository_entry(name)
        if entry is not None and number is not None and entry.id not in (None, number):
            return "repositories", (
                f"the repository {name} has id {number}, but the policy pins {entry.name} to "
                f"id {entry.id}: it was deleted and re-created (or another took its name); if "
                "this is the repository you mean, write its id in repositories"
            )
        if entry is not None:
            return None
        renamed = next(
            (r for r in self.repositories if number is not None and r.id == number), None
        )
        if renamed is not None:
            return "repositories", (
                f"the repository {name} (id {number}) is not in the policy's repositories, "
                f"which list that id as {renamed.name}: it was renamed or transferred; write "
                "its new name there"
            )
        owner = name.partition("/")[0]
        return "repositories", (
            f"the repository {name} is not one this pool serves: add it (or "
            f"{owner}/*) to repositories in the pool's policy"
        )

    def _workflow_refusal(self, identity: Identity) -> tuple[Rule, str] | None:
        if self.workflows is None:
            return None
        ref = identity.job_workflow_ref
        if any(fnmatch.fnmatchcase(ref, pattern) for pattern in self.workflows):
            return None
        return "workflows", (
            f"the workflow {ref} matches none of the policy's workflows "
            f"({', '.join(self.workflows)}): run the job from one of them, or add a pattern"
        )

    def _fork_refusal(
        self, identity: Identity, *, from_fork: bool | None
    ) -> tuple[Rule, str] | None:
        tokens = FORK_EVENTS.get(identity.event_name)
        if self.forks or tokens is None or from_fork is False:
            return None
        event = identity.event_name
        if from_fork:
            return "forks", (
                f"this {event} run is of a pull request from a fork, and the pool's policy "
                "does not branch forks (forks: false): no branch for it"
            )
        if tokens == "write-tokens":
            public = identity.repository_visibility == "public"
            if public or not self.fork_write_tokens:
                return None  # a fork's run has no token to show here
            return "forks", (
                f"{identity.repository} sends write tokens to its fork pull requests' runs "
                "(fork_write_tokens: true), so this token may be a fork's, which it cannot "
                "tell; the pool does not branch forks (forks: false). Turn that repository "
                "setting off and set fork_write_tokens: false, or set forks: true"
            )
        return "forks", (
            f"a {event} run gets an OIDC token whether or not its pull request comes from a "
            "fork, and the token cannot tell which; the pool does not branch forks (forks: "
            "false). Run the job on pull_request (a fork's run gets no token there), or set "
            "forks: true"
        )


# -- the file ---------------------------------------------------------------------------------


def load(path: Path) -> Policy:
    """The policy in the admin's file ``path``; ConfigError naming the line and field of the
    first problem and how to fix it."""
    what = f"the pool's policy file {path}"
    raw = safefs.read_regular(path, limit=MAX_POLICY_BYTES, what=what)
    return parse(raw, name=str(path))


def parse(raw: bytes, *, name: str) -> Policy:
    import yaml  # read once, at start: the engine's other commands do not need it

    what = f"the pool's policy file {name}"
    try:
        tree = yaml.compose(raw.decode("utf-8"), Loader=yaml.SafeLoader)
        data = yaml.safe_load(raw)
    except UnicodeDecodeError:
        raise ConfigError(f"{what} is not UTF-8 text") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "not YAML"
        raise ConfigError(f"{what} is not valid YAML{line}: {problem}") from None
    if tree is not None:
        _refuse_duplicate_keys(tree, what=what)
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must be a mapping with owners: and the other keys; {_FIX}")

    def where(loc: Location) -> str:
        line = _line_of(tree, loc)
        return f"at line {line} ({dotted(loc)})" if loc else ""

    try:
        policy = Policy.model_validate(data)
    except ValidationError as err:
        raise config_error(err, what=what, where=where, fix=_FIX) from None
    problems = _cross_problems(policy)
    if problems:
        raise config_error(Problems(problems), what=what, where=where, fix=_FIX)
    return policy


def _cross_problems(policy: Policy) -> list[tuple[Location, str]]:
    """What the fields' own checks cannot see: entries against each other."""
    owners = {o.name.lower() for o in policy.owners}
    found: list[tuple[Location, str]] = []
    seen: dict[str, int] = {}
    for index, owner in enumerate(policy.owners):
        if owner.name.lower() in seen:
            found.append((("owners", index), f"{owner.name} is listed twice"))
        seen[owner.name.lower()] = index
    names: dict[str, int] = {}
    for index, repo in enumerate(policy.repositories or []):
        place: Location = ("repositories", index)
        if repo.owner.lower() not in owners:
            found.append(
                (place, f"{repo.name} is not of an owner listed in owners: add {repo.owner} there")
            )
        if repo.wildcard and repo.id is not None:
            found.append(((*place, "id"), f"{repo.name} names many repositories: it takes no id"))
        if repo.name.lower() in names:
            found.append((place, f"{repo.name} is listed twice"))
        names[repo.name.lower()] = index
    return found


def _refuse_duplicate_keys(node: Any, *, what: str) -> None:
    """YAML takes the last of two equal keys silently; a policy says what it means once."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        keys: set[str] = set()
        for key, value in node.value:
            if key.value in keys:
                raise ConfigError(
                    f"{what} at line {key.start_mark.line + 1}: the key {key.value!r} appears "
                    "twice in one mapping; keep one"
                )
            keys.add(key.value)
            _refuse_duplicate_keys(value, what=what)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(item, what=what)


def _line_of(tree: Any, loc: Location) -> int:
    """The line (1-based) of the YAML node at ``loc``, or of the deepest one on its way."""
    import yaml

    node = tree
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            found = next(((k, v) for k, v in node.value if k.value == part), None)
            if found is None:
                break
            node = found[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
        else:
            break
    return int(node.start_mark.line) + 1 if node is not None else 1
