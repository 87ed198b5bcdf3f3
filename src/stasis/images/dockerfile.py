"""The common subset of the Dockerfile format, as build steps (see :mod:`stasis.sdk.image`).

FROM, RUN, COPY and ADD of local files, ENV, ARG, WORKDIR, USER, CMD and ENTRYPOINT; line continuations,
comments, the exec (JSON) and shell forms, ``$VAR``/``${VAR}``/``${VAR:-default}`` from ARG and ENV.
Anything else is an error that names the instruction and its line.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidRequest

SUPPORTED = ("FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "CMD", "ENTRYPOINT")
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::-([^}]*))?\}|(\w+))")


@dataclass(frozen=True)
class Step:
    """One instruction that makes a layer or changes the config."""

    kind: str  # run | copy | env | workdir | user | cmd | entrypoint
    args: tuple[str, ...]
    line: int = 0
    options: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        return f"{self.kind.upper()} {' '.join(self.args)}"[:200]


@dataclass
class Dockerfile:
    base: str
    steps: list[Step] = field(default_factory=list)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines, current, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if not current:
            start = number
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append((start, current))
        current = ""
    if current:
        lines.append((start, current))
    return lines


def _substitute(text: str, variables: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        return variables.get(name, match.group(2) or "")

    return VARIABLE.sub(replace, text)


def _command(rest: str) -> tuple[str, ...]:
    """The exec form (a JSON list) as it is; the shell form as one string for /bin/sh -c."""
    if rest.startswith("["):
        try:
            parsed = json.loads(rest)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed):
            return ("exec", *parsed)
    return ("shell", rest)


def _pairs(rest: str, line: int) -> dict[str, str]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # ENV KEY value with spaces
        return {words[0]: " ".join(words[1:])}
    pairs = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise InvalidRequest(f"Dockerfile line {line}: expected KEY=VALUE, got {word!r}")
        pairs[key] = value
    return pairs


def parse(text: str, build_args: dict[str, str] | None = None) -> Dockerfile:
    variables: dict[str, str] = {}
    given = dict(build_args or {})
    result: Dockerfile | None = None
    for line, content in _logical_lines(text):
        instruction, _, rest = content.partition(" ")
        instruction, rest = instruction.upper(), rest.strip()
        if instruction not in SUPPORTED:
            raise InvalidRequest(
                f"Dockerfile line {line}: {instruction} is not supported; stasis builds {', '.join(SUPPORTED)}"
            )
        if instruction == "ARG":
            name, _, default = rest.partition("=")
            variables[name.strip()] = given.get(name.strip(), default.strip().strip('"'))
            continue
        if instruction == "FROM":
            if result is not None:
                raise InvalidRequest(f"Dockerfile line {line}: multi-stage builds (a second FROM) are not supported")
            words = _substitute(rest, variables).split()
            if not words or (len(words) > 1 and words[1].upper() != "AS"):
                raise InvalidRequest(f"Dockerfile line {line}: FROM takes one image (an imported or built image)")
            result = Dockerfile(base=words[0])
            continue
        if result is None:
            raise InvalidRequest(f"Dockerfile line {line}: {instruction} before FROM")
        if instruction in ("RUN", "CMD", "ENTRYPOINT"):
            body = rest if instruction != "RUN" else _substitute(rest, variables)
            result.steps.append(Step(instruction.lower(), _command(body), line))
        elif instruction in ("COPY", "ADD"):
            words, options = shlex.split(_substitute(rest, variables)), []
            while words and words[0].startswith("--"):
                key, _, value = words.pop(0)[2:].partition("=")
                if key != "chown":
                    raise InvalidRequest(f"Dockerfile line {line}: {instruction} --{key} is not supported")
                options.append((key, value))
            if len(words) < 2:
                raise InvalidRequest(f"Dockerfile line {line}: {instruction} needs a source and a destination")
            if any("://" in w for w in words[:-1]):
                raise InvalidRequest(f"Dockerfile line {line}: {instruction} of a URL is not supported: copy files")
            result.steps.append(Step("copy", tuple(words), line, tuple(options)))
        elif instruction == "ENV":
            pairs = {k: _substitute(v, variables) for k, v in _pairs(rest, line).items()}
            variables.update(pairs)
            result.steps.append(Step("env", tuple(f"{k}={v}" for k, v in pairs.items()), line))
        else:  # WORKDIR, USER
            result.steps.append(Step(instruction.lower(), (_substitute(rest, variables),), line))
    if result is None:
        raise InvalidRequest("the Dockerfile has no FROM")
    return result


def read(path: Path, build_args: dict[str, str] | None = None) -> Dockerfile:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidRequest(f"cannot read the Dockerfile {path}: {exc.strerror}") from exc
    return parse(text, build_args)
