"""A TCP proxy in front of PostgreSQL that a test can cut, to simulate the server going away.

``cut(seconds)`` closes every proxied connection on both sides (the server ends those
sessions and drops their locks, as in a restart) and refuses new connections for a while;
``refused`` counts the connections refused, what a test waits for to know that a client
tried to connect during the outage.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class FlakyProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._lock = threading.Lock()
        self._refuse_until = 0.0
        self._closed = False
        #: Connections refused so far (while cut or refusing).
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if time.monotonic() < self._refuse_until:
                client.close()
                self.refused += 1
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            pair = (client, upstream)
            with self._lock:
                self._pairs.add(pair)
            threading.Thread(target=self._pump, args=(client, upstream, pair), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, pair), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair: tuple) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(pair)

    def _drop(self, pair: tuple[socket.socket, socket.socket]) -> None:
        with self._lock:
            self._pairs.discard(pair)
        for sock in pair:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut(self, seconds: float) -> int:
        """Drop every connection now and refuse new ones for ``seconds``; return how many."""
        self._refuse_until = time.monotonic() + seconds
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._drop(pair)
        return len(pairs)

    def refuse(self, seconds: float) -> None:
        """Refuse new connections for ``seconds`` (0: accept again); the open ones go on."""
        self._refuse_until = time.monotonic() + seconds

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self.cut(0)
