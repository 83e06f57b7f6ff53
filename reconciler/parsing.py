"""The `gpuaas` argument parser: argparse, plus "did you mean" for typos.

kubectl and git answer `gpuaas aplly` with the one command meant, not the
twenty there are: an invalid choice (a command, a subcommand, an `-o` value)
and an unknown option (`--dry-rn`) name the closest spellings that exist
(difflib, the ratio git's own suggestions are about). Where nothing is close
the choices are listed as argparse does.

Subparsers inherit the class (argparse builds them with `type(parent)`), so
every command of both agents gets this without registering anything.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any

_HINTS = "_gpuaas_hints"  # namespace attribute: unknown option -> close options, set by the parser that saw it


def close(word: str, words: Iterable[str]) -> list[str]:
    """The spellings in `words` close to `word`, closest first (at most three)."""
    import difflib  # only once a word is wrong: every command line pays for an import at start-up

    return difflib.get_close_matches(word, sorted(set(words)), n=3, cutoff=0.6)


def did_you_mean(candidates: Sequence[str]) -> str:
    """`did you mean 'apply'?` (or one of several); empty when there is nothing to offer."""
    if not candidates:
        return ""
    quoted = [repr(c) for c in candidates]
    return "did you mean " + (quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]) + "?"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors for typos say what was probably meant."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is None or value in action.choices:
            return
        hint = did_you_mean(close(str(value), (str(c) for c in action.choices)))
        if hint:
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}; {hint}")
        super()._check_value(action, value)

    def parse_known_args(  # type: ignore[override]  # typeshed overloads
        self,
        args: Sequence[str] | None = None,
        namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        # The deepest parser runs first and knows the command's options; a parent adds hints only for the rest.
        hints: dict[str, list[str]] = getattr(ns, _HINTS, {})
        for word in extras:
            if word.startswith("-") and word not in hints:
                hints[word] = close(word.partition("=")[0], self._option_string_actions)
        if hints:
            setattr(ns, _HINTS, hints)
        return ns, extras

    def parse_args(  # type: ignore[override]  # typeshed overloads
        self,
        args: Sequence[str] | None = None,
        namespace: argparse.Namespace | None = None,
    ) -> argparse.Namespace:
        ns, extras = self.parse_known_args(args, namespace)
        hints: dict[str, list[str]] = getattr(ns, _HINTS, {})
        if hasattr(ns, _HINTS):
            delattr(ns, _HINTS)
        if extras:
            notes = [f"{w}: {did_you_mean(hints[w])}" for w in extras if hints.get(w)]
            self.error("unrecognized arguments: " + " ".join(extras) + "".join(f"\n  {n}" for n in notes))
        return ns
