"""What a deployed machine's SSH looks like in labs: a TCP listener on 127.0.0.1 that accepts and closes.

A lease turns `active` only when the provider says deployed AND the machine
answers on SSH (`providers.probes`). Fake hardware boots nothing, so the demo,
the baremetal bench and the tests point every machine's `ssh_address` here.
"""

from __future__ import annotations

import socket
import threading


class SshStandIn:
    def __init__(self, backlog: int = 256) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(backlog)
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, name="gpuaas-ssh-standin", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self._sock.accept()
            except OSError:  # closed: the stand-in is done
                return
            c.close()

    def close(self) -> None:
        self._sock.close()
