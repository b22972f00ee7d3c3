"""A listening socket that stops taking connections without resetting the ones a client is making."""

from __future__ import annotations

import ctypes
import logging
import socket
import struct
import sys

log = logging.getLogger(__name__)
_SO_ATTACH_FILTER = 26  # <asm-generic/socket.h>; Python's socket module does not name it


def stop_queueing(sock: socket.socket) -> None:
    """The kernel drops new connections' packets from now on, for every process that holds `sock`.

    A socket filter that drops everything: a connecting client's SYN goes unanswered (it retries,
    and is refused once the socket is closed), while what is queued already stays to be accepted.
    Closing the socket instead resets what is queued; shutting it down as well. Linux only; elsewhere
    the workers' closes alone end the listening."""
    if sys.platform != "linux":
        return
    drop = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0))  # BPF_RET | BPF_K, 0: keep 0 bytes
    program = struct.pack("HP", 1, ctypes.addressof(drop))  # struct sock_fprog {len, filter}
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, program)
    except OSError as error:
        log.warning("cannot stop the listening socket queueing connections: %s", error)
