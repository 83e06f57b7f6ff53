"""A slice VM's serial console as a byte stream: libvirt's console stream, behind a Protocol.

The gateway reaches the node's libvirt over libvirt's own management channel
(`qemu+ssh://`, `qemu+tls://`: a URI template with `{node}`), never a port the
node opens for consoles, and asks for the domain's serial console
(`virDomainOpenConsole`), the same stream `virsh console` reads.

libvirt delivers stream events on its event loop: one daemon thread per
process runs `virEventRunDefaultImpl`, registered before the first
connection. Bytes read in a callback go to the session's asyncio queue; bytes
written are sent from a worker thread. One lock per stream keeps send and
recv from running at once (a stream is one object of the remote driver).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any, Protocol

from reconciler import codes as reconciler_codes
from schemas.errors import PermanentError, TemporaryError


class ConsoleUnavailable(PermanentError):
    code = reconciler_codes.CONSOLE_UNAVAILABLE


class ConsoleStream(Protocol):
    async def read(self) -> bytes:
        """The next bytes the console printed; b"" when it ended."""
        ...

    async def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class ConsoleOpener(Protocol):
    async def open(self, node: str, domain: str) -> ConsoleStream: ...


_events_lock = threading.Lock()
_events_started: list[bool] = []  # one entry once the process's libvirt event loop runs


def _ensure_event_loop(libvirt: Any) -> None:
    with _events_lock:
        if _events_started:
            return
        libvirt.virEventRegisterDefaultImpl()

        def run() -> None:
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _events_started.append(True)


class LibvirtConsole:
    """One open console stream; `read` and `write` are for the event loop that opened it."""

    def __init__(self, libvirt: Any, conn: Any, stream: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._libvirt = libvirt
        self._conn = conn
        self._stream = stream
        self._loop = loop
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._lock = threading.Lock()
        self._closed = False
        events = libvirt.VIR_STREAM_EVENT_READABLE | libvirt.VIR_STREAM_EVENT_ERROR | libvirt.VIR_STREAM_EVENT_HANGUP
        stream.eventAddCallback(events, self._on_event, None)

    def _push(self, data: bytes) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, data)

    def _on_event(self, stream: Any, events: int, _opaque: Any) -> None:
        lv = self._libvirt
        if events & lv.VIR_STREAM_EVENT_READABLE:
            while True:
                with self._lock:
                    if self._closed:
                        return
                    try:
                        got = stream.recv(4096)
                    except lv.libvirtError:
                        got = b""
                if got == -2:  # would block: wait for the next event
                    break
                if not got:
                    self._hang_up()
                    return
                self._push(bytes(got))
        if events & (lv.VIR_STREAM_EVENT_ERROR | lv.VIR_STREAM_EVENT_HANGUP):
            self._hang_up()

    def _hang_up(self) -> None:
        with contextlib.suppress(Exception):
            self._stream.eventRemoveCallback()
        self._push(b"")

    async def read(self) -> bytes:
        return await self._queue.get()

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + 10
        while view:
            with self._lock:
                if self._closed:
                    raise ConsoleUnavailable("the console stream is closed")
                sent = self._stream.send(bytes(view))
            if sent == -2:  # the stream's buffer is full: the guest reads slowly
                if time.monotonic() > deadline:
                    raise TemporaryError(
                        "the console did not take input for 10 s", code=reconciler_codes.CONSOLE_STALLED
                    )
                time.sleep(0.005)
                continue
            view = view[sent:]

    async def write(self, data: bytes) -> None:
        await asyncio.to_thread(self._send, data)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for call in (self._stream.eventRemoveCallback, self._stream.finish, self._conn.close):
            with contextlib.suppress(Exception):
                call()


class LibvirtConsoles:
    """ConsoleOpener over libvirt: `uri_template` with `{node}` (node names follow the name rule)."""

    def __init__(self, uri_template: str) -> None:
        self._template = uri_template

    def uri(self, node: str) -> str:
        return self._template.replace("{node}", node)

    def _open(self, node: str, domain: str, loop: asyncio.AbstractEventLoop) -> LibvirtConsole:
        import libvirt

        _ensure_event_loop(libvirt)
        try:
            conn = libvirt.open(self.uri(node))
        except libvirt.libvirtError as e:
            raise ConsoleUnavailable(f"node {node}: libvirt unreachable: {e.get_error_message()}") from e
        try:
            dom = conn.lookupByName(domain)
            stream = conn.newStream(libvirt.VIR_STREAM_NONBLOCK)
            dom.openConsole(None, stream, 0)
        except libvirt.libvirtError as e:
            conn.close()
            raise ConsoleUnavailable(f"{domain} on {node}: {e.get_error_message()}") from e
        return LibvirtConsole(libvirt, conn, stream, loop)

    async def open(self, node: str, domain: str) -> ConsoleStream:
        loop = asyncio.get_running_loop()
        return await asyncio.to_thread(self._open, node, domain, loop)
