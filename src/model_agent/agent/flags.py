"""The flags of ``model-agent run``, read off the Settings model, and the README's table of them.

Role: :class:`~model_agent.agent.settings.Settings` is the one definition of every flag (a field with a
:class:`~model_agent.agent.settings.Flag`). This module turns those fields into what ``cli/run.py`` builds the
command's options from (:func:`run_flags`) and into the markdown table README.md carries between two marker
comments (:func:`markdown_table`, :func:`replace_table`). A unit test fails when README.md's table differs;
``python -m model_agent.agent.flags --write README.md`` rewrites it. OME's flags that are accepted and ignored
(``agent/ignored_flags.py``) say so in their help and in the table.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic_settings import NoDecode

from model_agent.agent.ignored_flags import IGNORED
from model_agent.agent.settings import Settings, flag_name, flag_of

TABLE_START = (
    "<!-- flags table: generated from the Settings fields (src/model_agent/agent/settings.py) by "
    "`python -m model_agent.agent.flags --write README.md`; edit those, not this table -->"
)
TABLE_END = "<!-- end of the generated flags table -->"
REGENERATE = "python -m model_agent.agent.flags --write README.md"


@dataclass(frozen=True)
class RunFlag:
    """One flag of ``model-agent run`` as the command and the docs need it."""

    field: str  # the Settings field
    option: str  # "--download-timeout"
    value_type: Any  # what one use of the flag gives: int, float, str, bool, Path, list[str], list[Path]
    key: str  # the keyword Settings takes the value under (its alias, e.g. NODE_NAME, else the field)
    env: str  # the environment variable read when the flag is not given
    default: str  # the default in words
    default_is_value: bool  # the default is the field's value (shown as code), not words
    help: str  # the --help text
    meaning: str  # the README's text
    env_wins: bool  # the environment variable beats the flag (NODE_NAME, as in OME)
    repeatable: bool


def _without_none(annotation: Any) -> Any:
    """``Path | None`` -> ``Path``: an unset flag is None anyway."""
    if get_origin(annotation) in (Union, types.UnionType):
        kept = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(kept) == 1:
            return kept[0]
    return annotation


def _words(value: object) -> str:
    """A field's default as the docs say it; "" when the value says nothing (None, an empty string)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list) and not value:
        return "none"
    return str(value)


def run_flags() -> list[RunFlag]:
    """Every flag, in the order of the Settings fields."""
    found: list[RunFlag] = []
    for field, info in Settings.model_fields.items():
        flag = flag_of(field)
        if flag is None:
            continue
        value_type = _without_none(info.annotation)
        env = info.validation_alias if isinstance(info.validation_alias, str) else f"MODEL_AGENT_{field.upper()}"
        default = flag.default or _words(info.get_default(call_default_factory=True))
        if not default:
            raise ValueError(f"the Flag of Settings.{field} needs default= (its value says nothing)")
        option = flag_name(field)
        help_text = f"{flag.help} Default: {default}. Environment: {env}."
        meaning = flag.help.rstrip(".") + (f"; {flag.more}" if flag.more else "") + "."
        instead = IGNORED.get(field)
        if instead is not None:
            help_text = (
                f"{flag.help} Accepted for OME compatibility and ignored (a warning is logged when set). "
                f"Default: {default}. Environment: {env}."
            )
            meaning += f" Accepted for OME compatibility and ignored; a warning is logged when it is set: {instead}."
        found.append(
            RunFlag(
                field=field,
                option=option,
                value_type=value_type,
                key=env if env == info.validation_alias else field,
                env=env,
                default=default,
                default_is_value=not flag.default,
                help=help_text,
                meaning=meaning,
                env_wins=flag.env_wins,
                repeatable=get_origin(value_type) is list,
            )
        )
    return found


def _cell(text: str) -> str:
    """Text for a table cell: ``|`` escaped, and ``<...>`` outside code spans not taken for HTML."""
    pieces = text.replace("|", "\\|").split("`")
    for index in range(0, len(pieces), 2):  # the even pieces lie outside backticks
        pieces[index] = pieces[index].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(pieces)


def markdown_table() -> str:
    """The README's flags table: flag, environment variable, default, meaning; one row per flag."""
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for flag in run_flags():
        option = f"`{flag.option}`"
        if flag.value_type is bool:
            option += f" / `--no-{flag.option[2:]}`"
        env = f"`{flag.env}`"
        if flag.repeatable:
            text_list = NoDecode in Settings.model_fields[flag.field].metadata
            env += " (comma-separated or JSON)" if text_list else " (a JSON list)"
        default = f"`{flag.default}`" if flag.default_is_value else flag.default
        rows.append(f"| {option} | {env} | {_cell(default)} | {_cell(flag.meaning)} |")
    return "\n".join(rows) + "\n"


def replace_table(document: str) -> str:
    """``document`` with the text between the two marker lines replaced by :func:`markdown_table`."""
    start = document.find(TABLE_START)
    end = document.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"no generated flags table: the markers {TABLE_START!r} and {TABLE_END!r} are missing")
    body_start = start + len(TABLE_START) + 1
    return document[:body_start] + markdown_table() + document[end:]


def main(argv: list[str]) -> int:
    """``--write FILE``: regenerate FILE's table in place; otherwise print the table."""
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        path.write_text(replace_table(path.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    if argv:
        print(f"usage: {REGENERATE}  (or no arguments: print the table)", file=sys.stderr)
        return 2
    sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
