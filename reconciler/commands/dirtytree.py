"""Which desired-state files of a working tree may differ from HEAD, as git's index knows: `apply`'s dirty check.

`gpuaas apply` refuses a working tree that differs from HEAD
(`apply.tree_dirty`): each YAML file the reader reads is compared, by git
blob id, with HEAD's. Reading and hashing every file was about 0.45 s of a
cold apply at 10,000 nodes. git keeps the stat data of each file it last saw
(the index) and finds what changed since in a fraction of that, so `candidates`
asks git which files may differ and apply reads and compares only those:

- `git status`: the files that differ between HEAD and the index or between
  the index and the working tree (by stat data; a racily clean entry by
  content), and the untracked files git does not ignore. Read-only
  (`--no-optional-locks`: the index is not rewritten under a concurrent git),
  with its stat checks at their strictest and no file-system monitor or
  untracked cache trusted;
- the index entries git does not check, or compares otherwise than by the
  raw bytes apply hashes: assume-unchanged or skip-worktree, larger than the
  reader reads (apply hashes a truncated read), or with a conversion
  attribute (text, eol, filter, ident, working-tree-encoding).

None (apply compares every file) wherever git's answer cannot stand for the
reader's: git missing, failing or printing a warning, no HEAD, a path outside
a work tree, environment that points git elsewhere, core.autocrlf (a checkout
converts every file), core.worktree, a case-folding repository, a symlink the
reader reports (a linked directory or YAML file), a FIFO or device with a
YAML name (git lists neither), a nested repository (git names only its
directory), a directory that cannot be listed.

Left to git's stat data, as git itself leaves it: a file rewritten with the
same size, modification and change times, or converted by attributes or
config since removed.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from pathlib import Path

from desired.reading import safefiles
from desired.reading.yamlio import MAX_FILE_BYTES

_TIMEOUT_S = 120.0
# Environment that points git at another repository, index or work tree than the one above the path.
_GIT_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM",
)
_COMMIT_ID = re.compile(rb"[0-9a-f]{40}")
_FALSE = frozenset({b"false", b"no", b"off", b"0", b""})
# One `git ls-files -v --debug -z` entry: "<tag> <path>\0" and five lines of stat data.
_INDEX_ENTRY = re.compile(
    rb"([^\0]*)\0  ctime: [^\n]*\n  mtime: [^\n]*\n  dev: [^\n]*\n  uid: [^\n]*\n  size: (\d+)\tflags: [0-9a-f]+\n"
)
_STAT_DATA = re.compile(rb"\0  ctime: [^\n]*\n  mtime: [^\n]*\n  dev: [^\n]*\n  uid: [^\n]*\n  size: [^\n]*\n")
_LARGE = re.compile(rb"  size: \d{7,}\t")  # a million bytes or more: near the reader's limit (MAX_FILE_BYTES)
_CHECKED_TAG = b"H "  # an entry git checks against the working tree (lowercase: assume-unchanged, S: skip-worktree)
_CONVERSIONS = frozenset({b"text", b"eol", b"crlf", b"filter", b"ident", b"working-tree-encoding"})
_STATUS_CODES = frozenset(b" MTADU?")  # no R or C: --no-renames, so every entry names one path


def candidates(path: Path) -> set[str] | None:
    """The files under `path` (relative, '/'-separated, those `safefiles.iter_directory` reads) that may
    differ from HEAD; every other file is as HEAD has it. None: git cannot vouch for the tree."""
    if any(name in os.environ for name in _GIT_ENV):
        return None
    try:
        with contextlib.ExitStack() as started:
            # Side by side: git lstat's every tracked file while the rest is asked and the tree walked.
            status = started.enter_context(_status_process(path))
            started.callback(_stop, status)
            index = started.enter_context(_index_process(path))
            started.callback(_stop, index)
            return _candidates(path, status, index)
    except (OSError, subprocess.SubprocessError, ValueError):  # no git, no such directory, a git that hangs
        return None


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:  # given up on: killed before it is waited for
        process.kill()


def _status_process(path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            "git",
            "--no-optional-locks",
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.untrackedCache=false",
            "-c",
            "core.trustctime=true",
            "-c",
            "core.checkStat=default",
            "-c",
            "core.symlinks=true",  # a link checked out as a plain file is a change, as the reader sees it
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--no-renames",
            "--ignore-submodules=all",
            "--",
            ".",
        ],
        cwd=path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _index_process(path: Path) -> subprocess.Popen[bytes]:
    # Each entry's tag (assume-unchanged, skip-worktree) and stat data (its size); paths relative to `path`.
    return subprocess.Popen(
        ["git", "ls-files", "-v", "--debug", "-z"], cwd=path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _candidates(path: Path, status: subprocess.Popen[bytes], index: subprocess.Popen[bytes]) -> set[str] | None:
    prefix = _prefix(path)
    if prefix is None or not _plain_config(path) or _odd_entry(path):
        return None
    unchecked = _unchecked(path, _output(index))
    changed = _changed(_output(status), prefix)
    if unchecked is None or changed is None:
        return None
    return {name for name in changed if safefiles.is_read(name)} | unchecked


def _output(process: subprocess.Popen[bytes]) -> bytes | None:
    out, err = process.communicate(timeout=_TIMEOUT_S)
    return out if process.returncode == 0 and not err else None


def _git(done: subprocess.CompletedProcess[bytes]) -> bytes | None:
    """git's output where it answered without a word on stderr, None otherwise."""
    return done.stdout if done.returncode == 0 and not done.stderr else None


def _prefix(path: Path) -> str | None:
    """`path` relative to the top of its work tree ('' or ending in '/'); None: no work tree or no HEAD."""
    out = _git(
        subprocess.run(
            ["git", "rev-parse", "--show-prefix", "--verify", "HEAD"],
            cwd=path,
            capture_output=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    )
    lines = out.split(b"\n") if out is not None else []
    if len(lines) != 3 or lines[2] or not _COMMIT_ID.fullmatch(lines[1]):
        return None
    return os.fsdecode(lines[0])


def _plain_config(path: Path) -> bool:
    """Whether git, by its config, sees each file by its raw bytes and exact name."""
    done = subprocess.run(
        # Keys under which git does not see a file by its raw bytes and exact name (the last value wins).
        ["git", "config", "-z", "--get-regexp", r"^core\.(autocrlf|ignorecase|precomposeunicode|worktree)$"],
        cwd=path,
        capture_output=True,
        timeout=_TIMEOUT_S,
        check=False,
    )
    if done.returncode == 1 and not done.stdout and not done.stderr:
        return True  # none of them is set
    out = _git(done)
    if out is None:
        return False
    last: dict[bytes, bytes] = {}
    for entry in out.split(b"\0")[:-1]:
        key, valued, value = entry.partition(b"\n")
        last[key.lower()] = value.lower() if valued else b"true"  # a bare `key` (no '=') is true
    return all(value in _FALSE for value in last.values())


def _unchecked(path: Path, out: bytes | None) -> set[str] | None:
    """The index entries under `path` that `git status` does not compare as apply does (see the module)."""
    if out is None:
        return None
    listing, entries = _STAT_DATA.subn(b"\0", out)  # "<tag> <path>\0" each
    if entries != out.count(b"\0"):  # a shape not read here
        return None
    # Bytes searches, not a loop over 10,000 entries: a path holds no NUL, so "\0H " starts an entry.
    tagged = b"\0" + listing
    if tagged.count(b"\0" + _CHECKED_TAG) == entries and not _LARGE.search(out):
        unchecked: set[str] = set()
        paths = tagged.replace(b"\0" + _CHECKED_TAG, b"\0")[1:]
    else:
        unchecked, paths = _unchecked_entries(out)
    converted = _converted(path, paths)
    return None if converted is None else unchecked | converted


def _unchecked_entries(out: bytes) -> tuple[set[str], bytes]:
    """(the entries git does not check or that are over the reader's limit, every path NUL-terminated)."""
    unchecked: set[str] = set()
    paths: list[bytes] = []
    for tagged, size in _INDEX_ENTRY.findall(out):
        paths.append(tagged[2:] + b"\0")
        if not tagged.startswith(_CHECKED_TAG) or int(size) > MAX_FILE_BYTES:
            unchecked.add(os.fsdecode(tagged[2:]))
    return {name for name in unchecked if safefiles.is_read(name)}, b"".join(paths)


def _converted(path: Path, paths: bytes) -> set[str] | None:
    """The files git converts between the working tree and the index (`git check-attr`)."""
    if not paths:
        return set()
    out = _git(
        subprocess.run(
            ["git", "check-attr", "--all", "-z", "--stdin"],
            cwd=path,
            input=paths,
            capture_output=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    )
    fields = out.split(b"\0") if out is not None else []
    if len(fields) % 3 != 1 or fields[-1]:  # path, attribute, value; and the last NUL
        return None
    converted = {os.fsdecode(fields[i]) for i in range(0, len(fields) - 1, 3) if fields[i + 1] in _CONVERSIONS}
    return {name for name in converted if safefiles.is_read(name)}


def _odd_entry(root: Path) -> bool:
    """Whether the tree holds what `git status` reports otherwise than the reader reads it.

    The reader's walk (`safefiles.iter_directory`), without reading a file:
    a symlink it reports (to a directory, or with a YAML name: git compares
    the link's target), a FIFO or device with a YAML name (git lists none),
    a nested repository (git names its directory, the reader reads into it).
    """
    top = os.fspath(root)
    folders = [top]
    while folders:
        folder = folders.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                name = entry.name
                if name == ".git" and folder != top:
                    return True
                if entry.is_dir():  # a link to a directory too, as os.walk sorts them
                    if name in safefiles.SKIP_DIRS or name.startswith("."):
                        continue
                    if entry.is_symlink():
                        return True
                    folders.append(entry.path)
                elif name.endswith(safefiles.YAML_SUFFIXES) and not entry.is_file(follow_symlinks=False):
                    return True  # a link (to a file or dangling), a FIFO, a socket, a device
    return False


def _changed(out: bytes | None, prefix: str) -> set[str] | None:
    """The paths `git status` names, relative to `path`; None where it failed or named a directory."""
    if out is None:
        return None
    names: set[str] = set()
    for entry in out.split(b"\0"):
        if not entry:
            continue
        if len(entry) < 4 or entry[2:3] != b" " or not set(entry[:2]) <= _STATUS_CODES:
            return None
        full = os.fsdecode(entry[3:])  # porcelain v1 paths are relative to the top of the work tree
        if full.endswith("/") or not full.startswith(prefix):  # a nested repository, or not ours
            return None
        names.add(full[len(prefix) :])
    return names
