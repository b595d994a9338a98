"""The one exception tree: every class in errors.py says when it is raised, no other module
defines an exception a user can meet, the exit codes are stable and documented, and pydantic's
errors become ours in one way."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest
from pydantic import BaseModel, Field, ValidationError, model_validator

from pgoverlay import errors
from pgoverlay.errors import ConfigError, DeliveryError, PgoverlayError, config_error

ROOT = Path(__file__).resolve().parent.parent
ERRORS_PY = ROOT / "pgoverlay" / "errors.py"
# The product's code: what a user runs. Tests keep their own helpers' exceptions.
PRODUCT = ("pgoverlay", "runner", "action", "webhook", "bench", "scripts", "examples")
PRIVATE = "private control flow"
# The codes scripts may already rely on: a class may be added, never renumbered.
STABLE = {
    "PgoverlayError": 1,
    "ConfigError": 2,
    "NotRootError": 3,
    "OverlayUnsupportedError": 4,
    "PoolError": 5,
    "PoolFullError": 6,
    "CommandError": 7,
    "PostgresBinariesError": 8,
    "VersionMismatchError": 9,
    "SeedError": 10,
    "SourceUnreachableError": 11,
    "SeedBusyError": 12,
    "BaseMissingError": 13,
    "BranchError": 14,
    "InvalidNameError": 15,
    "BranchExistsError": 16,
    "BranchMissingError": 17,
    "PortsExhaustedError": 18,
    "BranchStartError": 19,
    "TimeoutExpiredError": 20,
    "MigrationError": 21,
    "LockBusyError": 22,
    "MaskError": 23,
    "DockerError": 24,
    "UnsafePathError": 25,
    "RegistryRowError": 26,
    "BranchOwnedError": 27,
    "NotOwnerError": 28,
    "LimitReachedError": 29,
    "ServiceError": 30,
    "BaseInUseError": 31,
    "DeliveryError": 32,
    "QueueError": 33,
}
EXCEPTION_NAMES = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


def _tree() -> list[type[PgoverlayError]]:
    return [
        value
        for value in vars(errors).values()
        if isinstance(value, type)
        and issubclass(value, PgoverlayError)
        and value.__module__ == errors.__name__
    ]


def _base_name(node: ast.expr) -> str:
    """``Exception`` -> Exception, ``psycopg.Error`` -> Error, ``Base[int]`` -> Base."""
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def exception_classes(source: str) -> list[tuple[int, str, str | None]]:
    """Every class in ``source`` that derives from an exception (a builtin one, a name ending in
    Error or Exception, or one defined earlier in the file): line, name and docstring."""
    found: list[tuple[int, str, str | None]] = []
    known = set(EXCEPTION_NAMES)
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {_base_name(b) for b in node.bases}
        if bases & known or any(b.endswith(("Error", "Exception")) for b in bases):
            known.add(node.name)
            found.append((node.lineno, node.name, ast.get_docstring(node)))
    return found


def strays(source: str) -> list[str]:
    """The exception classes of a module other than errors.py that do not say they are private
    control flow."""
    return [
        f"{line}: {name}"
        for line, name, doc in exception_classes(source)
        if doc is None or PRIVATE not in " ".join(doc.lower().split())
    ]


def test_every_class_in_errors_py_has_a_docstring_saying_when_it_is_raised() -> None:
    tree = ast.parse(ERRORS_PY.read_text())
    classes = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    assert len(classes) > len(STABLE)
    missing = [c.name for c in classes if not (ast.get_docstring(c) or "").strip()]
    assert missing == []
    # ... and at run time, each its own (not inherited from its parent)
    assert [cls.__name__ for cls in _tree() if "__doc__" not in vars(cls) or not cls.__doc__] == []


def test_no_module_outside_errors_py_defines_an_exception_a_user_can_meet() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{stray}"
        for folder in PRODUCT
        if (ROOT / folder).is_dir()
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ERRORS_PY
        for stray in strays(path.read_text())
    ]
    assert found == []


def test_the_source_check_sees_direct_indirect_and_qualified_exception_classes() -> None:
    source = '''
class Plain:
    """Not an exception."""
class Leak(Exception):
    """A GitHub call failed."""
class Deeper(Leak):
    """Still one."""
class Library(psycopg.Error):
    pass
class Quiet(Exception):
    """Private control flow: caught by the loop that raises it, never shown."""
'''
    assert [name for _, name, _ in exception_classes(source)] == [
        "Leak",
        "Deeper",
        "Library",
        "Quiet",
    ]
    assert strays(source) == ["4: Leak", "6: Deeper", "8: Library"]


def test_every_error_is_a_pgoverlay_error_with_an_integer_exit_code() -> None:
    for cls in _tree():
        assert isinstance(cls.exit_code, int) and not isinstance(cls.exit_code, bool), cls
        assert 1 <= cls.exit_code <= 125, cls  # 126 and up mean something else to a shell


def test_exit_codes_already_given_stay_and_each_class_with_its_own_has_a_distinct_one() -> None:
    codes = {cls.__name__: cls.exit_code for cls in _tree()}
    assert {name: codes.get(name) for name in STABLE} == STABLE
    own = [cls.exit_code for cls in _tree() if "exit_code" in vars(cls)]
    assert len(own) == len(set(own))


def test_the_exit_code_table_in_the_docs_lists_every_code() -> None:
    text = (ROOT / "docs" / "engine.md").read_text()
    table = {int(code) for code in re.findall(r"^\| (\d+) \|", text, flags=re.MULTILINE)}
    assert table == {cls.exit_code for cls in _tree()}


class _Request(BaseModel):
    name: str = Field(pattern=r"^[a-z]+$")
    ttl_seconds: int = Field(gt=0)


def test_config_error_names_the_first_problem_counts_the_rest_and_adds_the_fix() -> None:
    with pytest.raises(ValidationError) as caught:
        _Request(name="Bad Name", ttl_seconds=0)
    err = config_error(caught.value, what="cannot ask for branch x:", fix="see --help")
    assert type(err) is ConfigError and err.exit_code == 2
    assert str(err) == (
        "cannot ask for branch x: name: String should match pattern '^[a-z]+$' (and 1 more); "
        "see --help"
    )


def test_config_error_formats_the_place_as_asked_and_keeps_the_input_out() -> None:
    secret = "s3cr3t-token-value"
    with pytest.raises(ValidationError) as caught:
        _Request(name=secret, ttl_seconds=5)
    assert secret in str(caught.value)  # pydantic's own message shows the input
    err = config_error(
        caught.value, what="input", where=lambda loc: f"`{str(loc[0]).replace('_', '-')}`"
    )
    assert str(err) == "input `name`: String should match pattern '^[a-z]+$'"
    assert secret not in str(err)


def test_config_error_says_a_problem_of_the_whole_without_a_place() -> None:
    class Pair(BaseModel):
        low: int
        high: int

        @model_validator(mode="after")
        def _ordered(self) -> Pair:
            if self.low > self.high:
                raise ValueError("low is above high")
            return self

    with pytest.raises(ValidationError) as caught:
        Pair(low=2, high=1)
    assert str(config_error(caught.value, what="cannot ask for a pair:")) == (
        "cannot ask for a pair: low is above high"
    )
    assert str(config_error(caught.value, what="bad setting")) == "bad setting: low is above high"


def test_config_error_can_make_another_error_and_names_a_whole_body_problem() -> None:
    with pytest.raises(ValidationError) as caught:
        _Request.model_validate([])
    err = config_error(
        caught.value,
        what="not a pull_request event as GitHub sends it:",
        where=lambda loc: errors.dotted(loc) or "the body",
        error=DeliveryError,
    )
    assert type(err) is DeliveryError and err.exit_code == 32
    assert str(err).startswith("not a pull_request event as GitHub sends it: the body: ")


def test_config_error_is_the_only_conversion_of_validation_errors_to_config_errors() -> None:
    """A module that catches ValidationError hands it to config_error, or does something else on
    purpose: masking rules list up to five problems in the rules file's terms; the service
    client reads an error body that does not fit as a protocol error; a stored workflow record
    of another release is logged and treated as none."""
    own_wording = {"runner/mask/rules.py", "runner/service/client.py", "action/record.py"}
    for folder in ("pgoverlay", "runner", "action", "webhook"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = f"{path.relative_to(ROOT)}"
            text = path.read_text()
            if "except ValidationError" in text and name not in own_wording:
                assert "config_error(" in text, name


def test_errors_py_imports_no_library() -> None:
    """Every command imports it: it stays free of pydantic, psycopg and the rest."""
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(ERRORS_PY.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert imported <= {"__future__", "collections", "typing"}
