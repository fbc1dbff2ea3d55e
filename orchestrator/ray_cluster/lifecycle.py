"""Process lifecycle of a command that starts its own Ray: nothing it started outlives it.

`ray.init` starts gcs_server and the raylet as children of the driver that die with it
(PR_SET_PDEATHSIG), but the raylet's own children, the dashboard and runtime-env agents and the
workers, do not: after a SIGKILL of the driver, or a Ctrl-C while Ray starts, the agents wait
about a minute on the dead GCS before they exit. So a reaper process, started before Ray, follows
the driver's process tree and, once the driver is gone however it ended, kills what is left of it.
A process the tree lost before the reaper saw it (its parent died first) is found by a token the
driver put in its environment, which the driver's descendants, and only they, inherit; neither
way alone suffices: Ray's agents blank their environment as they rename themselves
(setproctitle), and the youngest processes may not have been seen yet. A cluster the driver
merely joined is neither in its tree nor carries its token, and is left alone.

Under `terminating()`, a SIGTERM unwinds the command like a Ctrl-C, so the `finally` blocks that
record partial results and shut Ray down run, and leaves it as `Terminated`; `init_ray` keeps
`ray.init` from replacing that handler with its own, which exits with status 1 and no message.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any, Iterator

import psutil

from orchestrator.ray_cluster.address import join

POLL_S = 0.2  # how often the reaper looks at the driver's tree
TOKEN = "SCALEDL_REAPER_TOKEN"  # the environment variable marking what the driver started
# Where `ray.init` warns, on every start of a cluster with RAY_AUTH_MODE unset, that it turned token authentication on.
AUTH_LOG = "ray._private.authentication.authentication_token_setup"

_reaper: subprocess.Popen | None = None


class Terminated(BaseException):
    """The command got SIGTERM; not an `Exception`, so no `except Exception` takes it for a failure."""


@contextmanager
def terminating() -> Iterator[None]:
    """A SIGTERM inside the block unwinds it (its `finally` blocks run) and leaves it as `Terminated`.

    The handler raises KeyboardInterrupt: Ray's blocking calls (`ray.get`, `ray.wait`) turn only
    that and SystemExit, raised by a signal handler, into exceptions of their own (others end as
    a SystemError), so the block's way out is told apart by the flag. Main thread only: Python
    delivers signals there.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except KeyboardInterrupt:
        if received:
            raise Terminated() from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def init_ray(**init_kwargs: Any) -> None:
    """`ray.init(**init_kwargs)`, keeping the caller's SIGTERM handler if it has one, with a reaper
    watching when it may start a local Ray (no address, or "local"; should RAY_ADDRESS make it join
    a running cluster instead, the reaper leaves that be). A named address is joined through
    `orchestrator.ray_cluster.address.join`: reached within seconds, or `ClusterUnreachable`.

    A Ray it starts keeps the token authentication `ray.init` turns on for a new cluster when RAY_AUTH_MODE is
    unset, without the warning Ray prints each time that it did (its errors still show). Naming the mode instead
    would not do: `import ray` has read the environment by then, and the driver would not send the token."""
    import ray

    address = init_kwargs.pop("address", None)
    local = address in (None, "local")
    if local:
        start_reaper()
    auth_log = logging.getLogger(AUTH_LOG)
    level = auth_log.level
    auth_log.setLevel(logging.ERROR)
    try:
        with _callers_sigterm():
            if local:
                ray.init(address=address, **init_kwargs)
            else:  # a cluster to join: reached within seconds or refused (ClusterUnreachable), Ray's lines held back
                join(address, ray.init, **init_kwargs)
    finally:
        auth_log.setLevel(level)


@contextmanager
def _callers_sigterm() -> Iterator[None]:
    """Keep the caller's own SIGTERM handler through the block, and hand it a SIGTERM that came meanwhile.

    `ray.init` (seconds; ten on a busy two-core machine) installs handlers that exit with status
    1 or 15; a SIGTERM that reaches one of them is seen on a wakeup fd. Without a handler of the
    caller's (SIG_DFL), Ray's stay, as with a plain `ray.init`. Main thread only, as signal handlers.
    """
    handler = signal.getsignal(signal.SIGTERM)
    if not callable(handler) or threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    for fd in (read_fd, write_fd):
        os.set_blocking(fd, False)
    wakeup = signal.set_wakeup_fd(write_fd)
    try:
        yield
    finally:
        signal.set_wakeup_fd(wakeup)
        signal.signal(signal.SIGTERM, handler)
        received = _drain(read_fd)
        os.close(read_fd)
        os.close(write_fd)
        if received and wakeup != -1:
            with suppress(OSError):
                os.write(wakeup, received)  # its owner (an asyncio loop) would have seen them too
        if signal.SIGTERM in received:
            handler(signal.SIGTERM, None)  # under terminating(): raised instead of Ray's SystemExit


def shutdown_ray_meanwhile() -> threading.Thread:
    """`ray.shutdown()` in a thread, started; join it before leaving. Over a second of it is Ray waiting: it stops
    its autoscaler monitor after the GCS, so the monitor's SIGTERM handler hangs reporting to the dead GCS until
    Ray's one-second grace ends in a SIGKILL. A caller with work left that needs no Ray does it meanwhile."""
    import ray

    closing = threading.Thread(target=ray.shutdown, name="ray-shutdown")
    closing.start()
    return closing


def _drain(fd: int) -> bytes:
    """What a non-blocking pipe holds: here the numbers of the signals that arrived."""
    data = b""
    with suppress(BlockingIOError):
        while chunk := os.read(fd, 512):
            data += chunk
    return data


def start_reaper() -> None:
    """Start this process's reaper (once) and wait until it watches, so nothing escapes it."""
    global _reaper
    if _reaper is not None and _reaper.poll() is None:
        return
    token = secrets.token_hex(16)
    os.environ[TOKEN] = token
    # Its own session: a Ctrl-C or hang-up of the terminal's process group does not reach it.
    # -P: the script's folder (orchestrator/) is not put on sys.path, where it would shadow modules.
    _reaper = subprocess.Popen([sys.executable, "-P", os.path.abspath(__file__), str(os.getpid()), token],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    assert _reaper.stdout is not None
    _reaper.stdout.readline()  # "watching", or nothing if it could not start
    _reaper.stdout.close()


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a killed driver stays one until its parent reaps it)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _carries(proc: psutil.Process, token: str) -> bool:
    try:
        return proc.environ().get(TOKEN) == token
    except psutil.Error:  # gone, a zombie, or another user's
        return False


def reap(driver_pid: int, token: str) -> None:
    """Follow `driver_pid`'s descendants until it is gone, then kill those still running and any carrying `token`."""
    # A broad SIGTERM (systemd stopping a unit) must not take the reaper before the driver's cleanup ran.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    driver = psutil.Process(driver_pid)
    print("watching", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # let go of the driver's pipe: nothing else is written
    os.close(devnull)
    seen: set[psutil.Process] = set()  # a psutil.Process is its pid and start time: a reused pid is another
    while _alive(driver):
        with suppress(psutil.Error):
            seen.update(driver.children(recursive=True))
        time.sleep(POLL_S)
    me = os.getpid()
    left = {p for p in seen if _alive(p)} | {p for p in psutil.process_iter() if _carries(p, token)}
    left = {p for p in left if p.pid != me}
    for proc in left:
        with suppress(psutil.Error):
            proc.kill()  # SIGKILL: the runtime-env agent does not reliably act on SIGTERM
    psutil.wait_procs(left, timeout=10)


if __name__ == "__main__":
    reap(int(sys.argv[1]), sys.argv[2])
