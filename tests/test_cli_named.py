"""`gpuaas NAME ...` builds only NAME's parser, and it parses exactly as the whole parser does."""

from __future__ import annotations

import argparse

import pytest

from reconciler import cli


def _choices(parser: argparse.ArgumentParser) -> set[str]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_every_name_is_the_command_its_module_registers() -> None:
    assert _choices(cli.build_parser()) == set(cli.NAMES)
    for name in cli.NAMES:
        assert _choices(cli.build_parser([name])) == {name}, name


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", ".", "--offline", "--base", "HEAD~1", "--head", "HEAD", "-o", "json", "--detailed-exitcode"],
        ["plan", "--no-cache", "--out", "plan.json", "repo"],
        ["validate", ".", "--rev", "HEAD", "-o", "json"],
        ["request", "create", "--tenant", "t", "--sku", "s", "--gpus", "2", "--region", "r", "--commit"],
        ["fleet", "synth", "--nodes", "10", "--out", "x"],
        ["bench", "gitops", "--nodes", "100", "--commits", "5", "--json"],
    ],
)
def test_one_command_s_parser_parses_as_the_whole_one(argv: list[str]) -> None:
    assert vars(cli.build_parser(argv).parse_args(argv)) == vars(cli.build_parser().parse_args(argv))


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["pla"], ["--version", "plan"]])
def test_anything_else_gets_the_whole_parser(argv: list[str]) -> None:
    assert _choices(cli.build_parser(argv)) == set(cli.NAMES)


@pytest.mark.parametrize("argv", [["plan", "--bogus"], ["plan", "-o", "xml"], ["validate", "--rev"]])
def test_a_command_s_usage_error_is_the_same(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    said = []
    for parser in (cli.build_parser(argv), cli.build_parser()):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        said.append((e.value.code, capsys.readouterr().err))
    assert said[0] == said[1]
    assert said[0][0] == 2 and "usage: gpuaas" in said[0][1]
