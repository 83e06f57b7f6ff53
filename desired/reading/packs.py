"""What reading hands a cache of parsed blobs, and what it asks of one: plain values and two Protocols.

A pack is the reader's output for the files one parse worker read: each
file's bytes, the reader's problems and its typed documents. The reader
makes packs where it parses (a pool worker) with the encoder a cache gives
it, and reads back what a cache found; how a pack is encoded and where it is
kept is the cache's business (`reconciler.caches.blobs`), so nothing here
pickles or touches a database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# A problem without its file (the caller's): code, message, line, column.
Found = tuple[str, str, int, int]
# One document: index in its file, line, its model (None: typing refused it), typing's problems.
TypedDoc = tuple[int, int, Any, tuple[Found, ...]]
# One file in a pack: its bytes, the reader's problems, its documents.
Packed = tuple[bytes, tuple[Found, ...], tuple[TypedDoc, ...]]


@dataclass(frozen=True, slots=True)
class Entry:
    """What the reader and typing made of one blob: its bytes, the reader's problems, its documents."""

    data: bytes
    problems: tuple[Found, ...]  # the reader's (a file-level refusal)
    docs: tuple[TypedDoc, ...]


@dataclass(frozen=True, slots=True)
class Encoded:
    """A pack's payload, made where its files were parsed (a pool worker), and the blob ids it holds.

    Each blob id is the git blob id of the bytes beside it in the pack: a
    store indexes a pack under exactly those.
    """

    blobs: tuple[str, ...]
    payload: bytes


# Makes a pack of files; a module-level function, so a pool worker receives it by name.
Encode = Callable[[Sequence[Packed]], Encoded]
# Reads back a pack this process's own worker made; None when it is not one.
Decode = Callable[[bytes], "dict[str, Entry] | None"]


@dataclass(frozen=True, slots=True)
class Codec:
    """How a cache encodes the packs a pool worker makes, and reads back those of this process's workers."""

    encode: Encode
    decode: Decode


class PackStore(Protocol):
    """Packs of parsed blobs kept between runs (on disk, for CLI runs)."""

    codec: Codec

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """The trusted entries among `keys` (blob ids); a missing or doubtful one is simply absent."""
        ...

    def put_packs(self, packs: Iterable[Encoded], *, keep: Iterable[str] = ()) -> None:
        """Keep these packs; `keep`: blob ids the current tree uses (never dropped to make room)."""
        ...
