"""The README's tour, and the docs' pages, do not drift from the code: every SDK call they show exists, and every
`stasis` command and option in their console blocks is a real one (the commands' own parser says so)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest
import typer.main

import stasis
from stasis.cli import app

pytestmark = pytest.mark.fast

ROOT = Path(__file__).parents[1]
README = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
BLOCK = re.compile(r"```(python|console)\n(.*?)```", re.DOTALL)
SDK_CLASSES = {
    name: getattr(stasis, name) for name in ("Sandbox", "Image", "Template", "Pool", "AsyncSandbox", "Secret")
}


def blocks(kind: str) -> list[str]:
    return [body for language, body in BLOCK.findall(README) if language == kind]


def test_every_sdk_call_in_the_tour_exists() -> None:
    missing = []
    for body in blocks("python"):
        if "from stasis" not in body:
            continue  # a block about another package (E2B's SDK, a framework)
        tree = ast.parse(body.replace(": ...", ": pass"))
        of: dict[str, type] = {}  # variables bound to an SDK object, by the class that made them
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                made = _class_of(node.value.func)
                for target in node.targets:
                    for name in [t.id for t in ast.walk(target) if isinstance(t, ast.Name)]:
                        if made is not None:
                            of[name] = made
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                cls = SDK_CLASSES.get(node.value.id) or of.get(node.value.id)
                if cls is not None and not hasattr(cls, node.attr):
                    missing.append(f"{node.value.id}.{node.attr}")
    assert missing == []


def _class_of(func: ast.expr) -> type | None:
    """The SDK class whose call (Sandbox.create, Sandbox.connect...) made a value."""
    while isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id in SDK_CLASSES:
            return SDK_CLASSES[func.value.id]
        func = func.value
    return None


def test_every_stasis_command_and_option_in_the_readme_is_real() -> None:
    root = typer.main.get_command(app)
    wrong = []
    for body in blocks("console"):
        for line in body.splitlines():
            for command in re.findall(r"(?:^\$ |\s{2,})(stasis [^#]*?)(?=\s{2,}stasis |\s+#|$)", line):
                problem = _check(root, command.split())
                if problem:
                    wrong.append(f"{command.strip()}: {problem}")
    assert wrong == []


def _check(root: click.Command, words: list[str]) -> str | None:
    command, ctx_words = root, words[1:]
    while hasattr(command, "get_command") and ctx_words:  # a group (typer's own, not click.Group)
        sub = command.get_command(click.Context(command), ctx_words[0].split("|")[0])
        if sub is None:
            if ctx_words[0].startswith(("-", "[")):
                break  # options of the group itself
            return f"no command {ctx_words[0]!r} under {command.name!r}"
        command, ctx_words = sub, ctx_words[1:]
    options = {opt for param in command.params for opt in [*param.opts, *param.secondary_opts]}
    interspersed = command.context_settings.get("allow_interspersed_args", True)
    for word in ctx_words:
        if word == "--" or (not interspersed and not word.startswith(("-", "["))):
            break  # the command's own argv (stasis run NAME CMD...): not ours to check
        for option in re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", word):
            if option not in options and option not in ("--", "-"):
                return f"{command.name} has no option {option}"
    return None
