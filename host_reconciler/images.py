"""OS images on the host: where a claim's image comes from, and its sha256.

A claim names its image by `source_ref` and `digest_sha256` (required for
every image a host fetches). `source_url` says where the host gets it:

- an absolute `http://` / `https://` URL (Image `source_type: http`);
- a `file:///PATH` URL (`source_type: file`, labs; off unless the host
  setting `allow_file_images` is on);
- a relative path (`source_type: platform_storage`): a file staged under the
  host's image dir at that path if there is one (labs, pre-seeded hosts),
  else the path joined to the host's `image_base_url` (the central
  reconciler may also hand the host an absolute URL it resolved against a
  fleet-level base). A relative ref never leaves the image dir: no absolute
  path, no `..`.

`fetching` puts the verified bytes into the content-addressed cache
(`imagecache`, `<image_dir>/sha256/<hex>`), and a disk is written only from
a file whose sha256 equals the claim's digest (seed 000). The verification
is remembered as the file's identity (inode, size, mtime), so the
disk-write phase re-hashes only when the file changed in between.
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from host_reconciler import codes as host_codes
from schemas.errors import PermanentError, TemporaryError
from schemas.hostplans import ImageRef

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]{0,1023}$")
FORMATS = frozenset({"raw", "qcow2"})


class ImageError(PermanentError):
    code = host_codes.IMAGE_INVALID


@dataclass(frozen=True, slots=True)
class VerifiedImage:
    path: str
    digest: str
    size: int
    inode: int
    mtime_ns: int

    def still_valid(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_size, st.st_ino, st.st_mtime_ns) == (self.size, self.inode, self.mtime_ns)

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "digest": self.digest,
            "size": self.size,
            "inode": self.inode,
            "mtime_ns": self.mtime_ns,
        }


def resolve(image_dir: Path, image: ImageRef) -> Path:
    ref = image.source_ref
    parts = Path(ref).parts
    if not _REF.match(ref) or ref.startswith("/") or ".." in parts or "." in parts:
        raise ImageError(
            f"image source_ref {ref!r} is not a relative path in the image store",
            code=host_codes.IMAGE_BAD_REF,
        )
    if image.image_format not in FORMATS:
        raise ImageError(
            f"image format {image.image_format!r} cannot be written to a raw disk",
            code=host_codes.IMAGE_FORMAT,
        )
    root = image_dir.resolve()
    path = (root / ref).resolve()
    if root not in path.parents:
        raise ImageError(f"image {ref!r} resolves outside {root}", code=host_codes.IMAGE_BAD_REF)
    return path


def source_url(image: ImageRef, *, image_dir: Path, base_url: str | None, allow_file: bool) -> str:
    """Where the host fetches `image` from (module docstring); ImageError when it cannot say."""
    ref = image.source_ref
    if image.image_format not in FORMATS:
        raise ImageError(
            f"image format {image.image_format!r} cannot be written to a raw disk",
            code=host_codes.IMAGE_FORMAT,
        )
    scheme = urllib.parse.urlsplit(ref).scheme
    if scheme in ("http", "https"):
        return ref
    if scheme == "file":
        if not allow_file:
            raise ImageError(
                f"image {image.slug} is a file:// image and this host does not take them (allow_file_images)",
                code=host_codes.IMAGE_FILE_SOURCE_OFF,
            )
        return ref
    staged = resolve(image_dir, image)
    if staged.is_file():
        return staged.as_uri()
    if base_url:
        return urllib.parse.urljoin(base_url.rstrip("/") + "/", urllib.parse.quote(ref))
    raise ImageError(
        f"image {image.slug}: {ref!r} is not staged under {image_dir} and the host has no image_base_url",
        code=host_codes.IMAGE_NO_SOURCE,
    )


def expected_digest(image: ImageRef) -> str:
    if not image.digest_sha256 or not _DIGEST.match(image.digest_sha256):
        raise ImageError(
            f"image {image.slug} has no sha256 digest; an unverified image is never written",
            code=host_codes.IMAGE_NO_DIGEST,
        )
    return image.digest_sha256


def sha256_file(path: Path, chunk: int = 4 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, digest: str) -> VerifiedImage:
    try:
        st = path.stat()
    except FileNotFoundError as e:
        raise TemporaryError(
            f"image {path} is not in the host cache yet", code=host_codes.IMAGE_MISSING, delay=30.0
        ) from e
    got = sha256_file(path)
    if got != digest:
        raise ImageError(
            f"image {path} has sha256 {got}, the claim says {digest}",
            code=host_codes.IMAGE_DIGEST_MISMATCH,
        )
    return VerifiedImage(str(path), digest, st.st_size, st.st_ino, st.st_mtime_ns)
