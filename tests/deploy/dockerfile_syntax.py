"""A small Dockerfile reader for the tests (no Docker engine on CI machines).

It follows the Dockerfile reference where our files need it: parser directives, line
continuations (comment lines inside a continuation are dropped, as BuildKit does), known
instructions only, exec-form JSON for CMD/ENTRYPOINT/SHELL/HEALTHCHECK CMD, nothing but ARG
before the first FROM, and `${VAR}` substitution of global ARG defaults in FROM.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

INSTRUCTIONS = frozenset(
    "ADD ARG CMD COPY ENTRYPOINT ENV EXPOSE FROM HEALTHCHECK LABEL MAINTAINER ONBUILD RUN SHELL STOPSIGNAL USER "
    "VOLUME WORKDIR".split()
)
EXEC_FORM = frozenset({"CMD", "ENTRYPOINT", "SHELL"})
_DIRECTIVE = re.compile(r"#\s*([a-zA-Z]+)\s*=\s*(\S+)\s*$")
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


class DockerfileError(ValueError):
    """The text is not a Dockerfile this reader accepts."""


@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str
    line: int  # 1-based line where the instruction starts

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction, or None for shell form."""
        text = _strip_healthcheck_options(self.value) if self.keyword == "HEALTHCHECK" else self.value
        if not text.lstrip().startswith("["):
            return None
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as error:
            raise DockerfileError(f"line {self.line}: {self.keyword} exec form is not JSON: {error}") from None
        if not (isinstance(parsed, list) and all(isinstance(item, str) for item in parsed)):
            raise DockerfileError(f"line {self.line}: {self.keyword} exec form must be an array of strings")
        return parsed


def _strip_healthcheck_options(text: str) -> str:
    words = text.split()
    while words and words[0].startswith("--"):
        words.pop(0)
    if not words or words[0] not in ("CMD", "NONE"):
        raise DockerfileError("HEALTHCHECK needs CMD or NONE after its options")
    return text[text.index(words[0]) + len(words[0]):].strip()


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines = text.splitlines()
    start = 0
    while start < len(lines) and _DIRECTIVE.match(lines[start]):  # parser directives head the file
        start += 1
    logical, buffer, first = [], [], 0
    for number, raw in enumerate(lines[start:], start=start + 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buffer):
            continue
        if not buffer:
            first = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1].strip())
            continue
        buffer.append(stripped)
        logical.append((first, " ".join(part for part in buffer if part)))
        buffer = []
    if buffer:
        raise DockerfileError(f"line {first}: continuation runs past the end of the file")
    return logical


def parse(text: str) -> list[Instruction]:
    instructions = []
    for number, line in _logical_lines(text):
        keyword, _, value = line.partition(" ")
        keyword = keyword.upper()
        if keyword not in INSTRUCTIONS:
            raise DockerfileError(f"line {number}: unknown instruction {keyword}")
        if not value.strip():
            raise DockerfileError(f"line {number}: {keyword} has no arguments")
        instruction = Instruction(keyword, value.strip(), number)
        if keyword in EXEC_FORM or keyword == "HEALTHCHECK" and not value.strip().upper().endswith("NONE"):
            instruction.exec_form()  # validates JSON when the exec form is used
        instructions.append(instruction)
    _check_order(instructions)
    return instructions


def _check_order(instructions: list[Instruction]) -> None:
    for instruction in instructions:
        if instruction.keyword == "FROM":
            return
        if instruction.keyword != "ARG":
            raise DockerfileError(f"line {instruction.line}: {instruction.keyword} before the first FROM")
    raise DockerfileError("no FROM instruction")


def global_args(instructions: list[Instruction]) -> dict[str, str]:
    """Defaults of the ARGs declared before the first FROM (the only ones FROM can use)."""
    args = {}
    for instruction in instructions:
        if instruction.keyword == "FROM":
            break
        name, _, default = instruction.value.partition("=")
        args[name.strip()] = default.strip().strip('"')
    return args


def base_images(instructions: list[Instruction]) -> list[str]:
    """Image of every FROM, with global ARG defaults substituted and any `AS name` dropped."""
    args = global_args(instructions)

    def substitute(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in args or not args[name]:
            raise DockerfileError(f"FROM uses ${name}, which has no default")
        return args[name]

    images = []
    for instruction in find(instructions, "FROM"):
        words = [word for word in instruction.value.split() if not word.startswith("--")]  # --platform=...
        images.append(_VARIABLE.sub(substitute, words[0]))
    return images


def find(instructions: list[Instruction], keyword: str) -> list[Instruction]:
    return [instruction for instruction in instructions if instruction.keyword == keyword]
