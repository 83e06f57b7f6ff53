"""`gpuaas NAME ...` builds only NAME's parser, and it parses exactly as the whole parser does."""

from __future__ import annotations

import argparse

import pytest

from reconciler import cli
from schemas import plugins
from schemas.errors import PermanentError, UsageError

# The product's commands and the tools' (gpuaas-tools, found through the gpuaas.commands entry points).
ALL = set(cli.NAMES) | set(plugins.names())


def _choices(parser: argparse.ArgumentParser) -> set[str]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_every_name_is_the_command_its_module_registers() -> None:
    assert _choices(cli.build_parser()) == ALL
    for name in ALL:
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
    assert _choices(cli.build_parser(argv)) == ALL


@pytest.mark.parametrize("argv", [["plan", "--bogus"], ["plan", "-o", "xml"], ["validate", "--rev"]])
def test_a_command_s_usage_error_is_the_same(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    said = []
    for parser in (cli.build_parser(argv), cli.build_parser()):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        said.append((e.value.code, capsys.readouterr().err))
    assert said[0] == said[1]
    assert said[0][0] == 2 and "usage: gpuaas" in said[0][1]


def test_the_tools_commands_come_from_their_entry_points() -> None:
    """bench and demo are not product modules; gpuaas-tools adds them (and `host image bench`)."""
    assert {"bench", "demo"} <= set(plugins.names()) and not {"bench", "demo"} & set(cli.NAMES)
    assert plugins.names("host.image") == ("bench",)


def test_a_tool_command_without_the_tools_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugins, "_entry_points", dict)
    with pytest.raises(UsageError) as e:
        cli.build_parser(["demo"])
    assert e.value.code == "cli.tools_missing" and "gpuaas-reconciler[tools]" in e.value.message
    assert "bench" not in _choices(cli.build_parser())


def test_a_tool_that_does_not_import_is_left_out_of_help_and_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from importlib.metadata import EntryPoint

    broken = EntryPoint("demo", "gpuaas_tools_gone.demo:register", plugins.GROUP)
    monkeypatch.setattr(plugins, "_entry_points", lambda: {"demo": broken})
    assert "demo" not in _choices(cli.build_parser())
    assert "`gpuaas demo` (gpuaas_tools_gone.demo:register) does not import" in capsys.readouterr().err
    with pytest.raises(PermanentError) as e:
        cli.build_parser(["demo"])
    assert e.value.code == "cli.tool_unavailable"
