"""The process pool's fork server: one single-threaded process that forks the children.

Forking the worker itself once it runs would copy a process of many threads (the watchdog,
the listener, the maintainer, the releaser, the slots' threads), any of which may hold a lock
(logging, the import machinery, a connection pool's) at that moment; a child would wait on it
for ever. So the pool forks one process, the *fork server*, as the worker starts: after
Django was set up and the handlers' modules were imported, before any of the worker's threads
start and with no database connection open. The fork server never starts a thread and never
opens a connection; it forks each child on request, so every child starts as a copy of the
warmed-up worker, single-threaded, without a connection, in a millisecond or two.

Who owns what:

- :class:`ForkServer` (in the worker) owns the fork server process and the one socket to it:
  a request to fork (:meth:`ForkServer.spawn`, with the child's end of a new socket pair
  passed along as a file descriptor, ``SCM_RIGHTS``), a signal to send to a child
  (:meth:`ForkServer.signal`), and the exit statuses the fork server reports
  (:meth:`ForkServer.wait`). One thread of the worker reads that socket.
- The fork server (:func:`_serve`) owns its children: it forks them, reaps them (``waitpid``
  as soon as ``SIGCHLD`` comes) and reports each exit. Signals go through it so that a pid is
  never signalled after it was reaped (and maybe reused by another process).
- What a child runs is the ``child_main`` given to :class:`ForkServer` (the pool's).

Nothing outlives the worker: the fork server and each child ask the kernel for ``SIGKILL``
when their parent dies (``PR_SET_PDEATHSIG``, then a look at ``getppid()`` for a parent
that died before that), so ``kill -9`` of the worker takes the fork server with it, and the
fork server its children. The fork server sits in a process group of its own, with
``SIGINT`` and ``SIGTERM`` ignored: a Ctrl+C in the worker's terminal, or ``kill`` of the
worker's group, reaches the worker only, and the worker decides what happens to its
children. Linux only (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from django.db import connections

logger = logging.getLogger("django_pgtasks.worker")

#: ``prctl()`` option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1
#: Longest message between the worker and its fork server (requests and reports are tiny).
MESSAGE_SIZE = 4096
#: Seconds to wait for the fork server's reply to a request to fork.
SPAWN_TIMEOUT = 30.0


class ForkServerLost(RuntimeError):
    """The fork server died (or was stopped): the pool can start no child any more."""


def supported() -> str | None:
    """Why the process pool cannot run here, or ``None`` when it can."""
    if not sys.platform.startswith("linux"):
        return "the process pool needs Linux (fork() and PR_SET_PDEATHSIG)"
    return None


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process (``SIGKILL``) when its parent dies; exit at once
    if ``parent`` died already (before the request took effect)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(70)
    if os.getppid() != parent:
        os._exit(70)


def close_for_fork() -> None:
    """Close this thread's database connections and connection pools before a fork: a child
    must never share a connection (or a pool's threads) with the worker."""
    for connection in connections.all(initialized_only=True):
        connection.close()
        pools = getattr(type(connection), "_connection_pools", {})
        if connection.alias in pools:  # Django's pool (OPTIONS["pool"]), only if created
            connection.close_pool()


def describe_exit(status: int) -> str:
    """How a process with wait status ``status`` ended, in words: ``was killed by SIGSEGV``
    or ``exited with code 3``."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


class ForkServer:
    """The worker's handle on its fork server (see the module docstring): forks it at once,
    then asks it for children, signals them through it and learns how they exited.

    Thread-safe: every slot of the pool spawns, signals and waits for its own children.
    ``on_lost()`` is called (on the reading thread) if the fork server dies while the pool
    still uses it.
    """

    def __init__(self, child_main: Callable[[socket.socket], None],
                 on_lost: Callable[[], None] = lambda: None) -> None:
        problem = supported()
        if problem:
            raise RuntimeError(problem)
        close_for_fork()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        worker = os.getpid()
        pid = os.fork()
        if pid == 0:  # the fork server
            code = 0
            try:
                ours.close()
                _serve(theirs, child_main, worker)
            except BaseException:  # never back into the worker's code
                with contextlib.suppress(BaseException):
                    logger.exception("The process pool's fork server failed.")
                code = 70
            finally:
                os._exit(code)
        theirs.close()
        #: The fork server's pid.
        self.pid = pid
        self._socket = ours
        self._on_lost = on_lost
        self._send_lock = threading.Lock()
        self._changed = threading.Condition()
        self._forked: dict[int, int] = {}
        self._exited: dict[int, int] = {}
        self._requests = itertools.count(1)
        self._closing = False
        #: The fork server died or was closed: no child can be started any more.
        self.lost = False
        self._reader = threading.Thread(target=self._read, name="pgtasks-forkserver",
                                        daemon=True)
        self._reader.start()

    def spawn(self) -> tuple[int, socket.socket]:
        """Fork a child; return its pid and the worker's end of the socket to it (the child
        runs ``child_main`` on the other end). Raises :class:`ForkServerLost`."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            request = next(self._requests)
            self._send(("fork", request), theirs.fileno())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        deadline = time.monotonic() + SPAWN_TIMEOUT
        with self._changed:
            while request not in self._forked:
                if self.lost or not self._changed.wait(max(deadline - time.monotonic(), 0)):
                    ours.close()
                    raise ForkServerLost("the fork server did not fork the child")
            pid = self._forked.pop(request)
            self._exited.pop(pid, None)  # a pid used again: what is known is of another
            return pid, ours

    def signal(self, pid: int, signum: int) -> None:
        """Send ``signum`` to child ``pid`` unless it has been reaped already."""
        with contextlib.suppress(ForkServerLost):
            self._send(("signal", pid, int(signum)))

    def wait(self, pid: int, timeout: float | None = None) -> int | None:
        """The wait status of child ``pid`` once it exited and was reaped, or ``None`` if it
        still runs after ``timeout`` seconds. Once the fork server is gone its children are
        killed by the kernel: then the status is that of a ``SIGKILL``, once the child is
        gone (or a zombie, which runs nothing)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while pid not in self._exited:
                if self.lost:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._changed.wait(left)
            else:
                return self._exited[pid]
        # The fork server is gone: its children got SIGKILL from the kernel.
        while not _gone(pid):
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        return signal.SIGKILL  # a wait status: killed by SIGKILL

    def forget(self, pid: int) -> None:
        """Forget the exit of child ``pid`` (its slot is done with it)."""
        with self._changed:
            self._exited.pop(pid, None)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the fork server: it kills the children still running (``SIGKILL``), reaps
        them and exits; wait for that (``timeout`` seconds, then kill it)."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        while True:
            try:
                pid, _status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, 0)
                break
            time.sleep(0.005)
        self._reader.join(timeout)
        self._socket.close()

    def _send(self, message: tuple, fd: int | None = None) -> None:
        data = pickle.dumps(message)
        with self._send_lock:
            if self.lost:
                raise ForkServerLost("the fork server is gone")
            try:
                if fd is None:
                    self._socket.send(data)
                else:
                    socket.send_fds(self._socket, [data], [fd])
            except OSError as exc:
                raise ForkServerLost(f"the fork server is gone ({exc})") from exc

    def _read(self) -> None:
        """The reading thread: the fork server's replies and reports, until it is gone."""
        while True:
            try:
                data = self._socket.recv(MESSAGE_SIZE)
            except OSError:
                data = b""
            if not data:
                break
            message = pickle.loads(data)
            with self._changed:
                if message[0] == "forked":
                    self._forked[message[1]] = message[2]
                elif message[0] == "exited":
                    self._exited[message[1]] = message[2]
                self._changed.notify_all()
        with self._changed:
            self.lost = True
            self._changed.notify_all()
        if not self._closing:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)
            self._on_lost()


def _gone(pid: int) -> bool:
    """Whether process ``pid`` no longer runs (it does not exist, or is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def _serve(sock: socket.socket, child_main: Callable[[socket.socket], None],
           worker: int) -> NoReturn:
    """The fork server's loop (it has one thread, and no connection): fork on request, reap
    and report each exit, signal a child on request; at the end (the worker closed the socket
    or died), kill the children still running, reap them and exit."""
    die_with_parent(worker)
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    me = os.getpid()
    children: set[int] = set()

    def report(message: tuple) -> bool:
        try:
            sock.send(pickle.dumps(message))
            return True
        except OSError:
            return False

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            report(("exited", pid, status))

    running = True
    while running:
        readable, _, _ = select.select([sock, wake_read], [], [])
        if wake_read in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_read, 512):
                    pass
        reap()
        if sock not in readable:
            continue
        try:
            data, fds, _flags, _address = socket.recv_fds(sock, MESSAGE_SIZE, 1)
        except OSError:
            data, fds = b"", []
        if not data:
            break
        message = pickle.loads(data)
        if message[0] == "fork":
            channel = socket.socket(fileno=fds[0])
            pid = os.fork()
            if pid == 0:  # the child
                code = 0
                try:
                    sock.close()
                    signal.set_wakeup_fd(-1)
                    os.close(wake_read)
                    os.close(wake_write)
                    for signum in (signal.SIGCHLD, signal.SIGTERM):
                        signal.signal(signum, signal.SIG_DFL)
                    die_with_parent(me)
                    child_main(channel)
                except BaseException:
                    with contextlib.suppress(BaseException):
                        logger.exception("A child of the process pool failed.")
                    code = 70
                finally:
                    os._exit(code)
            channel.close()
            children.add(pid)
            running = report(("forked", message[1], pid))
        elif message[0] == "signal" and message[1] in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(message[1], message[2])
        for fd in fds[1:] if message[0] == "fork" else fds:
            os.close(fd)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    os._exit(0)
