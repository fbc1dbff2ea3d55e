"""Joining a running Ray cluster by address, which either connects or says within seconds why it cannot.

`ray.init(address=...)` on an address nobody answers retries for minutes (11 were seen), printing its C++ client's
reconnect lines; `--address auto` without a cluster raises a `ConnectionError` that commands used to end with exit
status 1, the status `plan` means "nothing fits" and `revalidate` "drift alert" by. So before Ray is asked, the address
is resolved as Ray resolves it (`ray._private.services.canonicalize_bootstrap_address`: RAY_ADDRESS, the last `ray
start` cluster of this machine for "auto", a loopback host replaced by this node's address) and its port is tried
with a plain TCP connection, then a GCS client connects from a child process given JOIN_DEADLINE_S (Ray's client
retries holding the interpreter lock: nothing in this process could stop it); `ray.init` then runs with Ray's own
lines held back from the terminal. Every failure is `ClusterUnreachable`, exit status `EXIT_UNREACHABLE`, its message
naming the address and what was tried.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import subprocess
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

# The exit status of every command that could not reach the cluster it was told to use.
EXIT_UNREACHABLE = 3
CONNECT_TIMEOUT_S = 5.0  # one TCP connection attempt to the cluster's bootstrap port
JOIN_DEADLINE_S = 20.0  # a GCS client's connection once the port answers: beyond it the cluster is unreachable
# A line of Ray's C++ log ("[2026-12-04 04:06:29,649 W 13076 13076] rpc_client.h:153: message").
_RAY_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+ [DIWEF] \d+ \d+\] [\w.]+:\d+: ")


class ClusterUnreachable(RuntimeError):
    """The Ray cluster named by an address could not be reached; the message says which and what was tried."""


def bootstrap_address(address: str) -> str:
    """The host:port Ray connects to for `address` ('auto', 'host:port', 'ray://host:port'), as Ray resolves it."""
    from ray._private.services import canonicalize_bootstrap_address

    if address.startswith("ray://"):
        return address.removeprefix("ray://")
    try:
        resolved = canonicalize_bootstrap_address(address)
    except ConnectionError:
        raise ClusterUnreachable(
            f"--address {address}: no running Ray cluster found (RAY_ADDRESS is "
            f"{'unset' if not os.environ.get('RAY_ADDRESS') else repr(os.environ['RAY_ADDRESS'])} and no `ray start` "
            f"cluster runs on this machine); start one with `ray start --head` or give its host:port") from None
    except ValueError as err:
        raise ClusterUnreachable(f"--address {address}: not a Ray address ({err}); use host:port, ray://host:port "
                                 f"or auto") from None
    if resolved is None:
        raise ClusterUnreachable(f"--address {address}: names no cluster to join (omit --address for a local Ray)")
    return resolved


def check_reachable(address: str) -> str:
    """The bootstrap host:port of `address` once a TCP connection to it succeeds; ClusterUnreachable otherwise."""
    target = bootstrap_address(address)
    host, _, port = target.rpartition(":")
    shown = address if target == address else f"{address} (Ray resolves it to {target})"
    if not port.isdigit():
        raise ClusterUnreachable(f"--address {shown}: no port to connect to; give host:port")
    started = time.monotonic()
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        why = "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise ClusterUnreachable(f"cannot reach the Ray cluster at --address {shown}: a TCP connection to {target} "
                                 f"failed after {time.monotonic() - started:.1f} s ({why}); is the head node up "
                                 f"(`ray status --address {target}`) and its port open?") from None
    return target


@contextmanager
def _stderr_held(into: Callable[[str], None]) -> Iterator[None]:
    """Hold what is written to file descriptor 2 in the block (Ray's C++ client writes there, past Python) and hand
    it to `into` afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            into(held.read().decode("utf-8", "replace"))


def _own_lines(text: str) -> str:
    """What others than Ray's C++ log wrote (a thread's warning), to show as it was."""
    return "".join(line for line in text.splitlines(keepends=True) if not _RAY_LINE.match(line))


def _last_ray_line(text: str) -> str:
    lines = [_RAY_LINE.sub("", line).strip() for line in text.splitlines() if _RAY_LINE.match(line)]
    return f"; Ray's last word: {lines[-1]}" if lines else ""


def check_gcs(address: str, target: str) -> None:
    """A Ray GCS answers at `target`: asked from a child process, which is ended at JOIN_DEADLINE_S (Ray's client
    retries for minutes holding the interpreter lock, so no thread of this process could end it)."""
    try:
        probe = subprocess.run([sys.executable, "-c", _GCS_PROBE, target], capture_output=True, text=True,
                               timeout=JOIN_DEADLINE_S)
    except subprocess.TimeoutExpired as err:
        said = err.stderr.decode("utf-8", "replace") if isinstance(err.stderr, bytes) else (err.stderr or "")
        raise ClusterUnreachable(f"cannot join the Ray cluster at --address {address}: {target} accepts connections "
                                 f"but no Ray GCS answered within {JOIN_DEADLINE_S:.0f} s (another service on that "
                                 f"port, or a head node still starting?){_last_ray_line(said)}") from None
    if probe.returncode != 0:
        raise ClusterUnreachable(f"cannot join the Ray cluster at --address {address}: the Ray GCS at {target} "
                                 f"refused the connection{_last_ray_line(probe.stderr)}"
                                 f"{'; ' + probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else ''}")


# Connects a GCS client as `ray.init` does first (the cluster id), nothing more.
_GCS_PROBE = "import sys; from ray._raylet import GcsClient; GcsClient(address=sys.argv[1])"


def join(address: str, init: Callable[..., Any], **init_kwargs: Any) -> None:
    """`init(address=..., **init_kwargs)` (ray.init) on a cluster whose port and GCS answer, Ray's own lines held
    back from the terminal; ClusterUnreachable otherwise."""
    target = check_reachable(address)
    if not address.startswith("ray://"):  # a Ray Client server is no GCS: its own connect fails fast
        check_gcs(address, target)
    held: list[str] = []
    try:
        with _stderr_held(held.append):
            init(address=address, **init_kwargs)
    except ConnectionError as err:
        raise ClusterUnreachable(f"cannot join the Ray cluster at --address {address} ({target}): "
                                 f"{str(err).splitlines()[0]}{_last_ray_line(''.join(held))}") from None
    finally:
        sys.stderr.write(_own_lines("".join(held)))
