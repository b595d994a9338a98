"""One reader of typed values (``runner/values.py``): a runner setting, an Action input and the
listener's per-repository setting read a flag, a number and a choice alike, and word a
problem alike; what counts as true is written once."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from pgoverlay.action.request import PrRequest, read_inputs
from pgoverlay.errors import ConfigError, SettingError
from pgoverlay.runner import values
from pgoverlay.runner.settings import Settings
from pgoverlay.webhook.settings import RepoSettings

ROOT = Path(__file__).resolve().parent.parent
FLAG_PROBLEM = "should be true or false (also accepted: 1/0, yes/no, on/off)"


def _flag_three_ways(text: str) -> tuple[object, object, object]:
    """``text`` as a runner setting's flag, an Action input's and a listener setting's."""
    return (
        Settings(branch_superuser=text).branch_superuser,
        read_inputs({"INPUT_COMMENT": text}).comment,
        RepoSettings.model_validate({"comment": text}).request().comment,
    )


@pytest.mark.parametrize(
    ("text", "meant"), [(" Yes ", True), ("ON", True), ("t", True), ("0", False), ("Off", False)]
)
def test_a_flag_reads_alike_as_a_setting_an_input_and_a_listeners_setting(
    text: str, meant: bool
) -> None:
    assert _flag_three_ways(text) == (meant, meant, meant)


def test_a_flag_that_is_neither_is_refused_alike_saying_what_is_accepted() -> None:
    with pytest.raises(SettingError) as setting:
        Settings(branch_superuser="maybe")
    with pytest.raises(ConfigError) as given:
        read_inputs({"INPUT_COMMENT": "maybe"})
    with pytest.raises(ValidationError) as listener:
        RepoSettings.model_validate({"comment": "maybe"})
    assert str(setting.value) == f"bad setting PGOVERLAY_BRANCH_SUPERUSER: {FLAG_PROBLEM}"
    assert str(given.value) == f"input `comment`: {FLAG_PROBLEM}"
    assert listener.value.errors()[0]["msg"] == FLAG_PROBLEM


def test_a_choice_reads_alike_in_any_case_as_a_setting_does() -> None:
    assert Settings(access_write_permission=" Admin ").page.write_permission == "admin"
    shouted: Any = "ALL"
    assert PrRequest(migrations_select=shouted).migrations_select == "all"
    listener = RepoSettings.model_validate({"migrations_select": "All"})
    assert listener.request().migrations_select == "all"
    with pytest.raises(ConfigError, match="^input `migrations-select`: should be one of changed"):
        read_inputs({"INPUT_MIGRATIONS_SELECT": "some"})


def test_what_counts_as_true_is_what_pydantic_reads_for_the_listeners_own_flags() -> None:
    """The listener's own settings (its ``drafts``) are pydantic's to read: its words are ours."""
    as_flag = TypeAdapter(bool)
    for word in values.TRUE | values.FALSE:
        assert as_flag.validate_python(word) is (word in values.TRUE)
    for word in ("maybe", "always", "2"):
        with pytest.raises(ValidationError):
            as_flag.validate_python(word)
        assert values.flag(word) is None


def _flag_words(tree: ast.AST) -> list[int]:
    """Lines with a literal collection of the words for true or false (two or more of them)."""
    words = values.TRUE | values.FALSE
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Set | ast.Tuple | ast.List)
        and sum(isinstance(e, ast.Constant) and e.value in words - {"0", "1"} for e in node.elts)
        >= 2
    ]


def test_the_words_for_true_and_false_are_written_in_one_module() -> None:
    """A second list of them drifts from the first (``runner/settings.py`` and
    ``action/request.py`` each had one): read a flag with ``values.flag`` or ``values.read``."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in ("runner", "action", "webhook", "pgoverlay")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ROOT / "runner" / "values.py"
        for line in _flag_words(ast.parse(path.read_text()))
    ]
    assert found == []


def test_the_rule_finds_a_second_list_of_the_words() -> None:
    assert _flag_words(ast.parse('ok = x in ("on", "true", "yes")')) == [1]
    assert _flag_words(ast.parse('ok = x in ("running", "yes")')) == []
