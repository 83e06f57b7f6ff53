"""Values from outside, made safe for the document they are written into.

Every renderer that writes a value it did not make itself (names and file
names from git, revisions, codes and messages from host reports, validation
messages that quote input) into markdown, HTML or a terminal passes it through
one of these functions, so the value can never change the document's
structure: no raw HTML tag, no broken table cell or row, no leaving a
`<details>` block, no code span, emphasis, link or heading of its own, and no
control character reaching a terminal or a CI log.

- `md_text`: inline markdown text, safe in a paragraph and in a GFM table
  cell. Newlines and tabs become spaces; other control characters show as
  escapes (`\\x1b`); every character CommonMark or GFM gives a meaning
  inline (`\\ ` * _ [ ] < > & | ~ $`) is backslash-escaped, and so is a
  leading block marker (`#`, `-`, `+`, `=`, `1.`).
- `md_code`: a code span when the value is plain (no backtick, `|`,
  backslash or control character; what names, codes and paths look like),
  else the same value as `md_text`. Inside a code span nothing but a
  backtick or a newline has a meaning.
- `html_text`: HTML element text or a quoted attribute value.
- `terminal_text`: one line for a terminal or a CI log.

The markdown functions return `Markdown`, a `str` that says "already safe":
table helpers pass it through and escape everything else, so a value that
skips the escaping has to do so on purpose.

Pure: strings in, strings out. Both the central and the host reconciler
import it, so it lives here, below both.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable

# C0 and C1 controls, DEL, the Unicode line and paragraph separators, and the bidi
# embedding, override and isolate marks (they reorder what a reader sees).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_BLANKS = frozenset("\t\n\v\f\r\x85\u2028\u2029")
_MD_INLINE = re.compile(r"([\\`*_\[\]<>&|~$])")
# Markers that start a block when they open a line (the value may land at a line start).
_MD_LEADING = re.compile(r"^([ ]*)([#+=-]|\d{1,9}(?=[.)]))")
_MD_PLAIN_CODE = re.compile(r"^[^`|\\\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+$")


class Markdown(str):
    """Markdown text that is safe as it is (made by the functions of this module)."""

    __slots__ = ()


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    return " " if char in _BLANKS else char.encode("unicode_escape").decode("ascii")


def one_line(text: object) -> str:
    """`text` on one line: blanks become spaces, other control characters show as escapes."""
    return _CONTROL.sub(_visible, str(text))


def terminal_text(text: object) -> str:
    """`text` safe to print on one terminal line (no escape sequence, no line of its own)."""
    return one_line(text)


def md_text(text: object) -> Markdown:
    """`text` as literal inline markdown: renders as itself, in a paragraph or a table cell."""
    if isinstance(text, Markdown):
        return text
    escaped = _MD_INLINE.sub(r"\\\1", one_line(text))
    leading = _MD_LEADING.match(escaped)
    if leading:
        # A digit run stays as it is; the `.` or `)` after it is escaped instead.
        if leading.group(2)[0].isdigit():
            end = leading.end()
            escaped = escaped[:end] + "\\" + escaped[end:]
        else:
            escaped = escaped[: leading.start(2)] + "\\" + escaped[leading.start(2) :]
    return Markdown(escaped)


def md_code(text: object) -> Markdown:
    """`text` as a code span when it is plain, else as literal text (never a broken span)."""
    value = str(text)
    if _MD_PLAIN_CODE.match(value) and value.strip(" ") == value:
        return Markdown(f"`{value}`")
    return md_text(value)


def md_join(separator: str, parts: Iterable[Markdown]) -> Markdown:
    """Join safe parts with a (literal) separator."""
    return Markdown(md_text(separator).join(parts))


def md_cell(value: object) -> Markdown:
    """A table cell: `Markdown` passes as it is, anything else is escaped text."""
    return value if isinstance(value, Markdown) else md_text(value)


def md_row(cells: Iterable[object]) -> Markdown:
    """One GFM table row; every cell goes through `md_cell`."""
    return Markdown("| " + " | ".join(md_cell(c) for c in cells) + " |")


def html_text(text: object) -> str:
    """`text` as HTML element content or a double- or single-quoted attribute value."""
    return html.escape(one_line(text), quote=True)
