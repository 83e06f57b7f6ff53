"""A small image server on 127.0.0.1 for labs, benches and tests (never used by the host agent).

Serves the files of one directory over HTTP/1.1 with `Range: bytes=N-`
(206 + Content-Range), in a daemon thread. Faults can be injected per path
to exercise the fetcher: drop the connection after N bytes of the first K
responses, serve other bytes than the file, or ignore Range (answer 200).

    with ImageServer(root) as srv:
        url = srv.url("image.qcow2")
        srv.faults["image.qcow2"] = Fault(drop_after=1 << 20, times=1)
"""

from __future__ import annotations

import contextlib
import http.server
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from host_reconciler import listening

_RANGE = re.compile(r"^bytes=(\d+)-$")
MAX_CONNECTIONS = 32
DEADLINE_S = 600.0  # one connection, request and whole body


@dataclass
class Fault:
    drop_after: int | None = None  # close the connection after this many body bytes
    times: int = 1  # responses affected (then the file is served normally)
    corrupt: bool = False  # flip every byte of the body (always, ignores `times`)
    ignore_range: bool = False  # answer 200 with the whole file even to a Range request
    no_length: bool = False  # no Content-Length: the body ends when the connection closes


@dataclass
class Stats:
    requests: list[tuple[str, str | None, int]] = field(default_factory=list)  # (path, Range, status)
    body_bytes: int = 0


class ImageServer:
    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root = root
        self.faults: dict[str, Fault] = {}
        self.stats = Stats()
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            timeout = 30  # one read

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._serve(self)

        # Capped like every listener the product runs: a lab's clients are a few hosts, and a whole
        # image at lab speeds takes seconds (a stalled client is cut, never held for good).
        self.httpd = listening.BoundedServer((host, 0), Handler, max_connections=MAX_CONNECTIONS, deadline_s=DEADLINE_S)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="image-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def url(self, rel: str) -> str:
        return f"http://127.0.0.1:{self.port}/{urllib.parse.quote(rel)}"

    def __enter__(self) -> ImageServer:
        self._thread.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)

    def _serve(self, h: http.server.BaseHTTPRequestHandler) -> None:
        rel = urllib.parse.unquote(urllib.parse.urlsplit(h.path).path).lstrip("/")
        path = (self.root / rel).resolve()
        rng = h.headers.get("Range")
        if self.root.resolve() not in path.parents or not path.is_file():
            self._record(rel, rng, 404)
            h.send_error(404)
            return
        size = path.stat().st_size
        with self._lock:
            fault = self.faults.get(rel)
            drop = None
            if fault is not None and fault.drop_after is not None and fault.times > 0:
                fault.times -= 1
                drop = fault.drop_after
        start = 0
        m = _RANGE.match(rng or "")
        if m and not (fault and fault.ignore_range):
            start = int(m.group(1))
            if start >= size:
                self._record(rel, rng, 416)
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{size}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self._record(rel, rng, 206)
        else:
            h.send_response(200)
            self._record(rel, rng, 200)
        h.send_header("Content-Type", "application/octet-stream")
        if fault is not None and fault.no_length:
            h.close_connection = True
            h.send_header("Connection", "close")
        else:
            h.send_header("Content-Length", str(size - start))
        h.send_header("Accept-Ranges", "bytes")
        h.end_headers()
        self._body(h, path, start, size, fault=fault, drop=drop)

    def _body(
        self,
        h: http.server.BaseHTTPRequestHandler,
        path: Path,
        start: int,
        size: int,
        *,
        fault: Fault | None,
        drop: int | None,
    ) -> None:
        sent = 0
        with path.open("rb") as f:
            f.seek(start)
            if drop is None and not (fault and fault.corrupt):
                with contextlib.suppress(OSError):
                    sent = _sendfile(h, f, size - start)
                self._count(sent)
                return
            while block := f.read(1 << 16):
                if fault is not None and fault.corrupt:
                    block = bytes(b ^ 0xFF for b in block)
                if drop is not None and sent + len(block) > drop:
                    block = block[: drop - sent]
                with contextlib.suppress(OSError):
                    h.wfile.write(block)
                    h.wfile.flush()
                sent += len(block)
                if drop is not None and sent >= drop:
                    h.close_connection = True
                    with contextlib.suppress(OSError):
                        h.connection.shutdown(2)  # the client sees the connection close mid-body
                    break
        self._count(sent)

    def _record(self, rel: str, rng: str | None, status: int) -> None:
        with self._lock:
            self.stats.requests.append((rel, rng, status))

    def _count(self, n: int) -> None:
        with self._lock:
            self.stats.body_bytes += n


def _sendfile(h: http.server.BaseHTTPRequestHandler, f: Any, count: int) -> int:
    """Send `count` bytes of `f` from its position with sendfile(2); returns what went out."""
    h.wfile.flush()
    # socket.sendfile, not os.sendfile: the handler's read timeout makes the socket non-blocking
    # underneath, and socket.sendfile waits for it to be writable where os.sendfile fails with EAGAIN.
    sent: int = h.connection.sendfile(f, f.tell(), count)
    return sent


def main(argv: list[str] | None = None) -> int:
    """`python -m host_reconciler.imageserver DIR`: serve DIR on 127.0.0.1, print the port, run until stdin closes.

    The bench runs the server in its own process, so neither client it times
    shares an interpreter (and its GIL) with the server.
    """
    import sys

    args = sys.argv[1:] if argv is None else argv
    with ImageServer(Path(args[0])) as srv:
        print(srv.port, flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
