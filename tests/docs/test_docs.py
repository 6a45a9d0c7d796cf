"""The documentation names only what exists: make targets and variables, `dflash-trt` commands and flags,
Triton repository parameters, Helm values, and relative links.

The docs are read conservatively: only code (fenced blocks and inline spans) is checked for names, so prose
stays free. A flag that follows `dflash-trt <command>` on the same command line must be an option of that
command; any other `--flag` in code must be an option of some command line of the project (the argparse
parsers under dflash_trt/, read from their `add_argument` calls) or of a known outside tool.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

# Flags of outside tools that the docs show in their own command lines (tritonserver, trtexec, helm, docker,
# pip, pytest, git, curl, hf, NVIDIA's clients), never options of ours.
OUTSIDE_FLAGS = {
    "--http-restricted-api", "--grpc-restricted-protocol", "--backend-config", "--preview", "--set", "--rm",
    "--allow-run-as-root", "--no-deps", "--test-llmapi", "--stop-after-ms", "--stop-via-request-cancel",
    "--dry-run", "--upgrade", "--quiet", "--local-dir",
    "--target-model-dir", "--spec-type", "--spec-draft-n-max",  # llama.cpp (make bench-llamacpp)
}
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def code_lines(text: str) -> list[str]:
    """Every command line in fenced blocks (backslash continuations joined) and every inline code span."""
    lines = []
    for block in FENCE.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    prose = FENCE.sub("", text)
    lines += INLINE.findall(prose)
    return [line.split(" #")[0].strip() for line in lines]  # a shell comment is prose


def all_code() -> list[tuple[Path, str]]:
    return [(page, line) for page in PAGES for line in code_lines(page.read_text())]


# --- what exists -------------------------------------------------------------------------------------------


def make_targets_and_variables() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-zA-Z][\w-]*):", text, re.M))
    variables = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*[?:]?=", text, re.M))
    return targets, variables


def cli_options() -> dict[str, set[str]]:
    """`dflash-trt` subcommand -> its option strings, from the real parser."""
    from dflash_trt.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return {name: {s for action in sub._actions for s in action.option_strings}
            for name, sub in subparsers.choices.items()}


def project_flags() -> set[str]:
    """Every option string that an argparse parser of the project declares (python -m entry points too)."""
    flags = set()
    for path in (ROOT / "dflash_trt").rglob("*.py"):
        source = path.read_text()
        for call in re.findall(r"add_argument\((.*?\))", source, re.S):
            names = re.findall(r"\"(--[\w-]+)\"", call.split("help=")[0])
            flags |= set(names)
            if "BooleanOptionalAction" in call:
                flags |= {"--no-" + name[2:] for name in names}
        if 'add_argument("--" + ' in source:  # a parser generated from a config dataclass's fields
            flags |= {"--" + name.replace("_", "-") for name in re.findall(r"^    (\w+): [^=\n]+=", source, re.M)}
    return flags


def repository_parameters() -> set[str]:
    names = set()
    for config in (ROOT / "model_repository" / "templates").glob("*/config.pbtxt"):
        names |= set(re.findall(r"parameters\s*\{\s*key:\s*\"(\w+)\"", config.read_text()))
    return names


def helm_values() -> dict:
    return yaml.safe_load((ROOT / "deploy" / "helm" / "dflash-triton" / "values.yaml").read_text())


def helm_key_exists(values: dict, dotted: str) -> bool:
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


# --- the checks ----------------------------------------------------------------------------------------------


def test_the_pages_exist_and_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    assert {"make demo", "make test"} <= set(code_lines((ROOT / "README.md").read_text()))


def test_make_targets_and_variables_exist():
    targets, variables = make_targets_and_variables()
    wrong = []
    for page, line in all_code():
        for match in re.finditer(r"(?:^|[\s;&(])make\s+([a-z][\w-]*)((?:\s+[A-Z][A-Z0-9_]*=\S*)*)", line):
            if match.group(1) not in targets:
                wrong.append(f"{page.name}: make target {match.group(1)!r}")
            for name in re.findall(r"([A-Z][A-Z0-9_]*)=", match.group(2)):
                if name not in variables:
                    wrong.append(f"{page.name}: make variable {name!r} (in `make {match.group(1)}`)")
    assert not wrong, "the docs name what the Makefile does not have:\n" + "\n".join(wrong)


def test_dflash_trt_commands_and_their_flags_exist():
    options = cli_options()
    wrong = []
    for page, line in all_code():
        for match in re.finditer(r"dflash-trt\s+([a-z][\w-]*)([^|;&]*)", line):
            command, rest = match.group(1), match.group(2)
            if command not in options:
                wrong.append(f"{page.name}: dflash-trt command {command!r}")
                continue
            for flag in FLAG.findall(rest):
                if flag not in options[command]:
                    wrong.append(f"{page.name}: `dflash-trt {command}` has no {flag}")
    assert not wrong, "\n".join(wrong)


def test_every_flag_in_code_is_an_option_of_the_project_or_a_known_tool():
    known = project_flags() | OUTSIDE_FLAGS
    wrong = sorted({f"{page.name}: {flag}" for page, line in all_code() for flag in FLAG.findall(line)
                    if flag not in known})
    assert not wrong, "flags no parser declares:\n" + "\n".join(wrong)


def test_the_repository_parameter_table_matches_the_templates():
    # docs/serving.md lists the parameters in one table; every row must exist and every parameter be there.
    text = (ROOT / "docs" / "serving.md").read_text()
    section = text.split("## Repository parameters", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    existing = repository_parameters()
    assert documented - existing == set(), f"documented but not in any template: {documented - existing}"
    assert existing - documented == set(), f"in the templates but not documented: {existing - documented}"


def test_helm_values_named_in_the_docs_exist():
    values = helm_values()
    wrong = []
    for page, line in all_code():
        candidates = re.findall(r"--set\s+([\w.]+)=", line)
        span = line.strip()
        if re.fullmatch(r"[a-z][\w]*(\.[\w]+)+(=\S+)?", span) and span.split(".")[0] in values:
            candidates.append(span.split("=")[0])
        wrong += [f"{page.name}: Helm value {key!r}" for key in candidates if not helm_key_exists(values, key)]
    assert not wrong, "\n".join(wrong)


def test_relative_links_resolve():
    wrong = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                wrong.append(f"{page.relative_to(ROOT)}: {target}")
    assert not wrong, "broken links:\n" + "\n".join(wrong)


@pytest.mark.parametrize("line, problem", [
    ("dflash-trt repo --engine e --max-batch-sequence 8", "has no --max-batch-sequence"),
    ("dflash-trt serve-all --repo r", "dflash-trt command 'serve-all'"),
])
def test_the_checks_catch_a_renamed_flag_or_command(line, problem, monkeypatch, tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"```bash\n{line}\n```\n")
    monkeypatch.setitem(globals(), "PAGES", [page])
    with pytest.raises(AssertionError, match=re.escape(problem)):
        test_dflash_trt_commands_and_their_flags_exist()
