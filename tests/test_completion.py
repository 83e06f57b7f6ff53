"""`gpuaas completion bash|zsh|fish`: the scripts parse, and completing in a real shell offers the parser's words."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from reconciler import cli
from reconciler.commands import completion

pytestmark = pytest.mark.integration  # runs bash and zsh

# Source the script, fill COMP_WORDS with the words given, call the completion function, print the candidates.
_BASH_PROBE = (
    'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); _gpuaas; printf "%s\\n" "${COMPREPLY[@]}"'
)
# The same in zsh, with compadd and _files (the completion system's builtins) standing in as printers.
_ZSH_PROBE = (
    'compdef() { :; }; compadd() { shift; printf "%s\\n" "$@"; }; _files() { print __files__; }; '
    'source "$1"; shift; words=("$@"); CURRENT=$#; _gpuaas'
)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("completion")
    out = {}
    for shell in completion.SHELLS:
        out[shell] = folder / f"gpuaas.{shell}"
        out[shell].write_text(completion.script(cli.build_parser(), shell))
    return out


def _complete(shell: str, script: Path, words: list[str]) -> list[str]:
    probe = _BASH_PROBE if shell == "bash" else _ZSH_PROBE
    argv = ["bash", "--norc", "-c"] if shell == "bash" else ["zsh", "-f", "-c"]
    done = subprocess.run(
        [*argv, probe, shell, str(script), *words], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout.split()


def test_bash_script_is_valid(scripts: dict[str, Path]) -> None:
    subprocess.run(["bash", "-n", str(scripts["bash"])], check=True, timeout=30)


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["gpuaas", "va"], ["validate"]),
        (["gpuaas", "ex"], ["explain"]),
        (["gpuaas", "host", "im"], ["image"]),
        (["gpuaas", "host", "image", ""], ["pull", "list", "evict", "bench"]),
        (["gpuaas", "validate", "-o", ""], ["text", "json", "yaml"]),
        (["gpuaas", "plan", "--output", "m"], ["markdown"]),
        (["gpuaas", "completion", ""], ["bash", "zsh", "fish"]),
        (["gpuaas", "db", "c"], ["check"]),
        # The value of --base is not a subcommand even when it spells one: the path stays `plan`.
        (["gpuaas", "plan", "--base", "validate", "--off"], ["--offline"]),
        (["gpuaas", "plan", "--detailed-exitcode", "-o", "j"], ["json"]),
    ],
)
def test_bash_completes_the_parsers_words(scripts: dict[str, Path], words: list[str], expected: list[str]) -> None:
    assert _complete("bash", scripts["bash"], words) == expected


def test_bash_option_names_and_files(scripts: dict[str, Path], tmp_path: Path) -> None:
    options = _complete("bash", scripts["bash"], ["gpuaas", "validate", "--"])
    assert "--output" in options and "--rev" in options and "--offline" not in options
    (tmp_path / "plan.json").write_text("{}")
    completed = _complete("bash", scripts["bash"], ["gpuaas", "apply", str(tmp_path / "pl")])
    assert completed == [str(tmp_path / "plan.json")]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_is_valid_and_completes(scripts: dict[str, Path]) -> None:
    subprocess.run(["zsh", "-n", str(scripts["zsh"])], check=True, timeout=30)
    assert "validate" in _complete("zsh", scripts["zsh"], ["gpuaas", "va"])
    assert _complete("zsh", scripts["zsh"], ["gpuaas", "host", "image", ""]) == ["pull", "list", "evict", "bench"]
    assert _complete("zsh", scripts["zsh"], ["gpuaas", "validate", "-o", ""]) == ["text", "json", "yaml"]
    assert _complete("zsh", scripts["zsh"], ["gpuaas", "apply", "--repo", ""]) == ["__files__"]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_script_is_valid_and_completes(scripts: dict[str, Path], tmp_path: Path) -> None:
    subprocess.run(["fish", "--no-config", "-n", str(scripts["fish"])], check=True, timeout=30)

    def complete(line: str) -> list[str]:
        # `complete -C` asks fish for the candidates of a command line, as TAB does.
        done = subprocess.run(
            ["fish", "--no-config", "-c", "source $argv[1]; complete -C $argv[2]", str(scripts["fish"]), line],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout.split()

    assert complete("gpuaas va") == ["validate"]
    assert complete("gpuaas host image ") == sorted(["pull", "list", "evict", "bench"])
    assert complete("gpuaas validate -o ") == ["json", "text", "yaml"]
    assert complete("gpuaas plan --base validate --off") == ["--offline"]
    assert "allocation" in complete("gpuaas get ")
    (tmp_path / "plan.json").write_text("{}")
    assert complete(f"gpuaas apply {tmp_path / 'pl'}") == [str(tmp_path / "plan.json")]


def test_the_tables_come_from_the_parser() -> None:
    parser = argparse.ArgumentParser(prog="tool")
    sub = parser.add_subparsers()
    run = sub.add_parser("run")
    run.add_argument("--mode", choices=("fast", "slow"))
    run.add_argument("--config", type=Path)
    run.add_argument("--dry-run", action="store_true")
    run.add_argument("--name")
    found = {c.path: c for c in completion.commands(parser)}
    assert found[""].subcommands == ["run"]
    assert found["run"].values == {"--mode": ["fast", "slow"], "--config": [completion.FILES]}
    assert "--dry-run" in found["run"].flags and "--name" not in found["run"].flags


def test_a_word_that_is_not_a_plain_token_never_reaches_the_script() -> None:
    parser = argparse.ArgumentParser(prog="tool")
    parser.add_argument("--mode", choices=("fast", "$(touch /tmp/owned)", "a b"))
    text = completion.script(parser, "bash")
    assert '"|--mode") echo "fast" ;;' in text and "owned" not in text and "a b" not in text
