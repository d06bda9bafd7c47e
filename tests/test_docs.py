"""The documentation stays true to the CLI: every `exportgate` command it shows, and every one the
CI examples run (examples/ci: their steps' shell lines), parses with the real parser (nothing is
run), and every relative link leads to a file of the repository."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
PIPELINES = sorted((REPO / "examples" / "ci").glob("*.yml"))
SHELL_KEYS = {"run", "script", "before_script", "after_script"}  # GitHub steps' and GitLab jobs' shell lines

FENCE = re.compile(r"^\s*(```|~~~)")
SEPARATORS = {"&&", "||", ";"}  # a chain: each part is a command of its own
SHELL = re.compile(r"[()<>|&]+")  # a pipe, a redirection, a subshell: not a plain command
PRINT_AND_EXIT = {"--help", "--version"}


@dataclass(frozen=True)
class Command:
    where: str  # file:line of the command's first line
    line: str  # the command as written (continuations joined)
    words: tuple[str, ...] | None  # the words after `exportgate`; None when shlex cannot split it
    error: str = ""


def _code_lines(text: str):
    """(line number, line) of every line in a code block: fenced, indented by 4 spaces after a blank
    line (not a list item's continuation), or starting with `$ exportgate`."""
    fenced = indented = False
    previous_blank = True
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            previous_blank = False
            continue
        blank = not line.strip()
        if fenced:
            yield number, line
        elif line.startswith("    ") and (indented or previous_blank):
            indented = True
            yield number, line
        elif line.lstrip().startswith("$ exportgate"):
            yield number, line
        elif not blank:
            indented = False
        previous_blank = blank


def _logical_lines(text: str):
    """Code lines with backslash continuations joined: (line number of the first, line)."""
    start, parts = None, []
    last = None
    for number, line in _code_lines(text):
        if parts and number != last + 1:  # a continuation cut short by the block's end
            yield start, " ".join(parts)
            parts = []
        last = number
        if not parts:
            start = number
        stripped = line.strip()
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        parts.append(stripped)
        yield start, " ".join(parts)
        parts = []
    if parts:
        yield start, " ".join(parts)


def _split(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    words = list(lexer)
    for i, word in enumerate(words):  # a comment starts at a word beginning with #
        if word.startswith("#"):
            return words[:i]
    return words


def _is_exportgate(word: str) -> bool:
    return word == "exportgate" or word.endswith("/exportgate")


def _shell_lines(path: Path):
    """(line number, shell line) of every step a CI example runs: the strings under its run and
    script keys, each numbered where it stands in the file."""
    import yaml

    text = path.read_text(encoding="utf-8")

    def walk(node, shell=False):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, shell or key in SHELL_KEYS)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item, shell)
        elif shell and isinstance(node, str):
            yield from node.splitlines()

    for line in walk(yaml.safe_load(text)):
        number = next((n for n, written in enumerate(text.splitlines(), 1) if line.strip() in written), 0)
        yield number, line


def _commands_in(path: Path):
    rel = path.relative_to(REPO).as_posix()
    lines = _shell_lines(path) if path.suffix == ".yml" else _logical_lines(path.read_text(encoding="utf-8"))
    for number, line in lines:
        line = line.removeprefix("$ ").strip()
        if "exportgate" not in line:
            continue
        where = f"{rel}:{number}"
        try:
            words = _split(line)
        except ValueError as error:  # an unclosed quote: a broken line in the docs
            if re.match(r"(\S*/)?exportgate\s", line):
                yield Command(where, line, None, str(error))
            continue
        segment: list[str] = []
        for word in [*words, ";"]:
            if word not in SEPARATORS:
                segment.append(word)
                continue
            # skip environment assignments before the program (FOO=1 exportgate ...)
            while segment and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", segment[0]):
                segment.pop(0)
            if segment and _is_exportgate(segment[0]) and not any(SHELL.fullmatch(w) for w in segment) \
                    and not PRINT_AND_EXIT & set(segment):
                yield Command(where, line, tuple(segment[1:]))
            segment = []


def _all_commands() -> list[Command]:
    commands = []
    for path in [*PAGES, *PIPELINES]:
        commands += list(_commands_in(path))
    return commands


COMMANDS = _all_commands()


def _group():
    import typer.main

    from exporter.cli import app

    return typer.main.get_command(app)


def test_the_docs_show_commands_to_check():
    assert len(COMMANDS) >= 10, [c.where for c in COMMANDS]
    assert {c.where.split(":")[0] for c in COMMANDS} >= {p.relative_to(REPO).as_posix() for p in PIPELINES}


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_every_documented_command_parses(command: Command):
    assert command.words is not None, f"{command.where}: shlex cannot split {command.line!r}: {command.error}"
    group = _group()
    global_options = {flag for param in group.params for flag in [*param.opts, *param.secondary_opts]}
    words = list(command.words)
    while words and words[0] in global_options:  # `exportgate --verbose export ...`
        words.pop(0)
    assert words, f"{command.where}: no command in {command.line!r}"
    cmd_name, *args = words
    assert cmd_name in group.commands, (
        f"{command.where}: no command {cmd_name!r} (there are {', '.join(group.commands)}): {command.line}"
    )
    try:
        group.commands[cmd_name].make_context(cmd_name, args)
    except click.ClickException as error:
        pytest.fail(f"{command.where}: {command.line}\n{error.format_message()}")


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)


def _prose(text: str) -> str:
    """The page without its fenced code blocks and code spans (links there are not links)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else line)
    return CODE_SPAN.sub("code", "\n".join(lines))


def _links():
    for path in PAGES:
        text = _prose(path.read_text(encoding="utf-8"))
        for match in [*LINK.finditer(text), *REFERENCE.finditer(text)]:
            target = match.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
                continue  # http(s), mailto: not files; an anchor of the page itself
            line = text.count("\n", 0, match.start()) + 1
            yield f"{path.relative_to(REPO).as_posix()}:{line}", path, target


LINKS = list(_links())


@pytest.mark.parametrize(("where", "page", "target"), LINKS, ids=[f"{w} {t}" for w, _, t in LINKS])
def test_every_relative_link_leads_to_a_file(where: str, page: Path, target: str):
    resolved = (page.parent / target.split("#", 1)[0]).resolve()
    assert resolved.is_relative_to(REPO), f"{where}: {target} leads out of the repository"
    assert resolved.exists(), f"{where}: {target} does not exist ({resolved.relative_to(REPO)})"


def test_the_cli_reference_is_the_one_the_declarations_make():
    from exporter.options import reference_markdown

    written = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert written == reference_markdown(), "docs/cli.md is stale: run `python -m exporter.options > docs/cli.md`"


def test_the_cli_reference_names_every_flag_the_cli_takes():
    written = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    group = _group()
    for name, command in group.commands.items():
        section = written.split(f"## exportgate {name}\n", 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            for flag in [*param.opts, *param.secondary_opts]:
                if flag.startswith("-") and flag != "--help":
                    assert f"`{flag}`" in section, f"docs/cli.md: `exportgate {name}` misses {flag}"
