"""Provider sockets that leave nothing behind when an attempt ends.

Bytes the gateway wrote sit in its kernel's send queue until the provider
acknowledges them. A graceful close (FIN) leaves that queue to TCP, which
delivers it whenever the path allows: seconds after the attempt's deadline,
after the drain barrier opened and fence F+1 was granted (issue 21). So every
provider socket is prepared here, as soon as it is connected:

- ``SO_LINGER`` on, linger 0: closing the socket (``transport.abort()``, or
  the kernel closing it for a process that died, SIGKILL included) discards
  the send queue and sends RST. Nothing written is delivered afterwards.
- ``TCP_NOTSENT_LOWAT``: the kernel takes at most this many bytes beyond what
  is already on the wire (``send()`` stops there; asyncio keeps the rest in
  the process, where it dies with an abort or with the process). What a
  frozen process's kernel can still push out is bounded by it.
- ``TCP_USER_TIMEOUT``: data the provider does not acknowledge within the
  provider's timeout ends the connection (a provider that stops reading).

What already reached the provider's host (its receive queue: at most its
receive window, one round trip's worth) cannot be recalled: docs/gateway.md,
"What the wire still holds".
"""

from __future__ import annotations

import socket
import struct
from typing import Any

#: linger on, 0 seconds: close discards unsent data and resets
LINGER_RESET = struct.pack("ii", 1, 0)
#: Linux's TCP_NOTSENT_LOWAT, where Python does not name it
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)
#: unsent bytes the kernel may hold for one provider connection
NOTSENT_LOWAT_BYTES = 16 * 1024


def prepare(sock: Any, timeout_seconds: float) -> None:
    """Set up one connected provider socket (a ``socket.socket`` or asyncio's
    ``TransportSocket``) as the module docstring says. ``SO_LINGER`` must
    take; the two bounds are Linux's and are skipped where unknown."""
    if sock is None:
        raise RuntimeError("a provider connection without a socket cannot be reset")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, NOTSENT_LOWAT_BYTES)
    except OSError:  # not Linux (or too old): the queue is bounded by SO_LINGER alone
        pass
    user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
    if user_timeout is not None:
        sock.setsockopt(socket.IPPROTO_TCP, user_timeout,
                        max(1000, int(timeout_seconds * 1000)))
