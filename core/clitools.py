"""What both CLIs (kogprobe, kogtune) share in how they talk to a person: help with every default shown,
a mistyped option answered with the usage of the subcommand it was given to, and output on stdout that a
pipe receives whole (no 80-column cut, no wrapping) when stdout is not a terminal.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help already says what the default is
    (options whose default is None describe it in words: "default: derived from the device")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default is argparse.SUPPRESS:
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            shown = "off" if action.default is False else "%(default)s"
            return f"{text} (default: {shown})"
        return text


def add_subparser(sub, name: str, **kw: Any) -> argparse.ArgumentParser:
    """sub.add_parser with the shared help formatter."""
    kw.setdefault("formatter_class", HelpFormatter)
    return sub.add_parser(name, **kw)


def _chosen_subparser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    for action in parser._actions:   # argparse keeps no public map from command to subparser
        if isinstance(action, argparse._SubParsersAction):
            cmd = getattr(args, action.dest, None)
            if cmd is not None and cmd in action.choices:
                return action.choices[cmd]
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """parser.parse_args, except that an option no parser knows is reported by the subcommand it followed
    (`kogprobe runs --jsn` prints the usage of `kogprobe runs`, not the top-level one). Exits 2 like
    argparse."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        _chosen_subparser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def stdout_console(**kw: Any):
    """A rich Console for stdout. On a terminal: as rich sizes it. Elsewhere (a pipe, a file): no width
    limit, so tables and paths come out whole instead of cut to 80 columns, and no colour codes."""
    from rich.console import Console
    if not sys.stdout.isatty():
        kw.setdefault("width", 100_000)
        kw.setdefault("no_color", True)
        kw.setdefault("soft_wrap", True)
    return Console(**kw)


def plain_table(title: str | None, columns: list[str], rows: list[list[Any]]):
    """A rich Table that reads well on a terminal and as plain text in a pipe (no box lines there)."""
    from rich import box
    from rich.table import Table
    tty = sys.stdout.isatty()
    t = Table(title=title, box=box.SIMPLE_HEAD if tty else None, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold" if tty else "ignore", no_wrap=not tty)
    for r in rows:
        t.add_row(*(str(x) for x in r))
    return t
