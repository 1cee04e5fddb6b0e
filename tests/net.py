"""Network helpers of the tests."""

import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now: tests that run side by side (pytest-xdist, two sessions) never share one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
