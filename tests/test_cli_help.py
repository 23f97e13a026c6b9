"""--help and --version: every option and argument of every command says what it does; the version is a flag
and a subcommand."""

from __future__ import annotations

import typer

from onnxfuse import __version__
from onnxfuse.cli import app


def _commands(cmd, path=("onnxfuse",)):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_option_and_argument_has_help():
    missing = []
    seen = 0
    for path, cmd in _commands(typer.main.get_command(app)):
        for p in cmd.params:
            seen += 1
            if not (getattr(p, "help", None) or "").strip():
                missing.append(f"{' '.join(path)} {p.opts[0] if p.opts else p.name}")
    assert seen > 60  # the walk reached every command's options
    assert missing == []


def test_no_help_names_a_flag_that_does_not_exist():
    for path, cmd in _commands(typer.main.get_command(app)):
        flags = {o for p in cmd.params for o in p.opts if o.startswith("--")}
        for p in cmd.params:
            for word in (getattr(p, "help", None) or "").replace(",", " ").replace(")", " ").split():
                if word.startswith("--") and len(word) > 2:
                    assert word.rstrip(".;:") in flags, f"{' '.join(path)} {p.opts[0]}: help names {word}"


def test_version_flag_and_subcommand(cli):
    for argv in (["--version"], ["version"]):
        code, stdout, stderr = cli(*argv)
        assert (code, stdout, stderr) == (0, f"onnxfuse {__version__}\n", "")
