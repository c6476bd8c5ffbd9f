"""Stored record batches sent to a Kafka client straight from their segment
file (docs/design.md section 10: from the page cache to the client's
socket).

When a partition's data server runs on the listener's own machine, the
listener asks it where the batches of a Fetch lie (LOCATE,
:mod:`raylog.transfer.protocol`: segment path, position, length, the file's
device and inode), opens the file itself (:func:`open_located`) and writes
the response's fixed fields, then the range with ``sendfile``
(:meth:`FileRange.send_to`): the bytes never enter the listener's memory.
Over TLS (an :class:`ssl.SSLSocket`) the kernel cannot encrypt them, so the
range is read in pieces of :data:`TLS_READ_BYTES` and sent through the TLS
socket instead: the same bytes, at most one piece in memory at a time.

What can go wrong between LOCATE and the send, and what happens then:

* the segment was deleted by retention, or replaced (compaction; a log
  moved), or the path is another machine's: :func:`open_located` opens
  nothing (the file at the path is missing, or it is not the device and
  inode LOCATE named, or it is shorter than the range) and the caller reads
  the bytes through the data channel as before;
* once opened, the file stays the one located (deleting or replacing the
  path does not touch an open file); were it cut shorter under the send,
  :meth:`FileRange.send_to` raises :class:`RangeCut` after the response's
  first bytes are out: the connection cannot be completed and is closed
  (the client reconnects and fetches again).

Thread-safety: a :class:`FileRange` is confined to one connection's thread.
"""

from __future__ import annotations

import os
import select
import socket
import ssl

#: the most bytes of a file range held at once when it goes through a TLS socket
TLS_READ_BYTES = 256 * 1024


class RangeCut(Exception):
    """A file range could not be sent whole (its file was cut shorter under
    the send); the connection it was going to must be closed."""


class FileRange:
    """``length`` bytes at ``position`` of an open segment file, to be sent
    to a socket with ``sendfile``. ``len()`` is ``length``; :meth:`close`
    closes the file (so does sending it)."""

    __slots__ = ("file", "position", "length")

    def __init__(self, file, position: int, length: int):
        self.file = file
        self.position = position
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"FileRange({self.file.name!r}, position={self.position}, length={self.length})"

    def send_to(self, sock: socket.socket) -> None:
        """Send the range to ``sock`` with ``os.sendfile`` and close the
        file. The socket's timeout bounds each wait for room in its send
        buffer (:class:`TimeoutError` past it); :class:`RangeCut` when the
        file ended before the range did. To an :class:`ssl.SSLSocket`: read
        and sent through it (the same bounds)."""
        if isinstance(sock, ssl.SSLSocket):
            self._copy_to(sock)
            return
        out_fd, timeout = sock.fileno(), sock.gettimeout()
        position, left = self.position, self.length
        try:
            in_fd = self.file.fileno()
            while left:
                try:
                    sent = os.sendfile(out_fd, in_fd, position, left)
                except BlockingIOError:  # a socket with a timeout is non-blocking underneath
                    waiting = select.poll()
                    waiting.register(out_fd, select.POLLOUT)
                    if not waiting.poll(None if timeout is None else timeout * 1000):
                        raise TimeoutError(f"the peer took no bytes for {timeout} s") from None
                    continue
                if not sent:
                    break
                position += sent
                left -= sent
        finally:
            self.close()
        if left:
            raise RangeCut(f"{self.file.name}: {self.length - left} of the {self.length} bytes at {self.position} "
                           f"sent (the segment was cut under the send)")

    def _copy_to(self, sock: ssl.SSLSocket) -> None:
        """Read the range in pieces and send each through ``sock``; closes the file."""
        position, left = self.position, self.length
        try:
            in_fd = self.file.fileno()
            while left:
                piece = os.pread(in_fd, min(left, TLS_READ_BYTES), position)
                if not piece:
                    break
                sock.sendall(piece)
                position += len(piece)
                left -= len(piece)
        finally:
            self.close()
        if left:
            raise RangeCut(f"{self.file.name}: {self.length - left} of the {self.length} bytes at {self.position} "
                           f"sent (the segment was cut under the send)")

    def close(self) -> None:
        self.file.close()


def open_located(located) -> FileRange | None:
    """The :class:`FileRange` of a LOCATE reply
    (:class:`~raylog.transfer.connection.Located` of kind 0 with a range),
    or None when its file cannot be used here: missing (deleted by retention
    since, or on another machine), not the device and inode located
    (replaced since), or shorter than the range."""
    try:
        file = open(located.path, "rb", buffering=0)  # noqa: SIM115 - the range owns it until sent or closed
    except OSError:
        return None
    try:
        stat = os.fstat(file.fileno())
    except OSError:
        file.close()
        return None
    if (stat.st_dev, stat.st_ino) != (located.device, located.inode) \
            or stat.st_size < located.position + located.length:
        file.close()
        return None
    return FileRange(file, located.position, located.length)
