"""MkDocs hook: the command-line reference, generated at build time.

The page ``reference/cli.md`` holds the marker ``<!-- cli-reference -->``;
this hook replaces it with one section per command of the ``raylog`` click
group (:mod:`raylog.tools.cli`), walked recursively: the command's help text,
its usage, its arguments and options with their help and defaults. The
``faults`` command hands its arguments to the fault runner's argparse parser
(:func:`raylog.testing.runner.add_arguments`), whose options are listed the
same way. Nothing is pasted: a new option shows up at the next build.
"""

from __future__ import annotations

import argparse
import inspect

import click

MARKER = "<!-- cli-reference -->"
PAGE = "reference/cli.md"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} has lost its marker {MARKER!r}")
    return markdown.replace(MARKER, render())


def render() -> str:
    from raylog.tools.cli import cli

    root = click.Context(cli, info_name="raylog")
    sections = [_section(cli, root, level=2)]
    for path, command, ctx in _walk(cli, root):
        sections.append(_section(command, ctx, level=3 if len(path) == 1 else 4))
    return "\n\n".join(sections) + "\n"


def _walk(group: click.Group, ctx: click.Context, path: tuple = ()):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub = click.Context(command, info_name=name, parent=ctx)
        yield path + (name,), command, sub
        if isinstance(command, click.Group):
            yield from _walk(command, sub, path + (name,))


def _escape(text: str) -> str:
    """Text for a Markdown table cell (no raw HTML, no cell breaks)."""
    return _html(text).replace("|", "\\|").replace("\n", " ")


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def _section(command: click.Command, ctx: click.Context, level: int) -> str:
    title = ctx.command_path
    out = [f"{'#' * level} `{title}`", ""]
    help_text = inspect.cleandoc(command.help or "")
    if help_text:
        out += [_paragraphs(help_text), ""]
    usage = " ".join(command.collect_usage_pieces(ctx))
    out += [f"Usage: `{title} {usage}`".rstrip(), ""]
    if isinstance(command, click.Group):
        rows = [(f"`{name}`", _escape(command.get_command(ctx, name).get_short_help_str(limit=200)))
                for name in command.list_commands(ctx)]
        out += _table(("command", "what it does"), rows)
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
        if isinstance(param, click.Argument):
            rows.append((f"`{param.make_metavar(ctx)}`", "argument" + (" (optional)" if not param.required else "")))
        elif record is not None and record[0] != "--help":
            rows.append((f"`{_escape(record[0])}`", _escape(record[1])))
    if rows:
        out += [""] + _table(("argument or option", "meaning"), rows)
    if ctx.command_path == "raylog faults":
        out += ["", _faults_options()]
    return "\n".join(out).rstrip()


def _paragraphs(text: str) -> str:
    """Click help text as Markdown paragraphs (click's ``\\b`` markers dropped)."""
    blocks = [b.replace("\b\n", "").strip() for b in text.split("\n\n")]
    return "\n\n".join(_html(" ".join(b.split())) for b in blocks if b)


def _table(headers: tuple, rows: list) -> list[str]:
    if not rows:
        return []
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _faults_options() -> str:
    from raylog.testing.runner import add_arguments

    parser = argparse.ArgumentParser(prog="raylog faults", add_help=False)
    add_arguments(parser)
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        names = ", ".join(action.option_strings) or action.dest
        if action.metavar or action.nargs != 0:
            names += " " + (action.metavar or action.dest.upper()) if action.option_strings else ""
        help_text = (action.help or "").replace("%(default)s", str(action.default))
        if action.default not in (None, argparse.SUPPRESS, False) and "default" not in help_text:
            help_text += f" (default: {action.default})"
        rows.append((f"`{_escape(names)}`", _escape(help_text)))
    return "\n".join(["The fault runner's options:", ""] + _table(("option", "meaning"), rows))
