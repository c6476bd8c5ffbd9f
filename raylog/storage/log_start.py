"""The log start offset of a partition log, kept in ``log-start-offset``
(Kafka's ``log-start-offset-checkpoint``): where the log begins when a
deletion of records (:meth:`raylog.storage.log.PartitionLog.delete_records_before`,
Kafka's DeleteRecords) moved it past the first segment's base offset,
possibly inside that segment.

Without the file the log starts at its first segment's base offset, as
before the file existed (retention deletes whole segments). With it, the
log starts at ``max(first segment's base, the file's offset)``, bounded by
the log end on open (a log cut shorter by recovery starts at most at its end).

The file is one record of 30 bytes, ASCII::

     field    bytes    meaning
  1. offset   0..20    the log start offset, 20 decimal digits, zero-padded
  2. space    20       b" "
  3. crc      21..29   the CRC32C of the 20 offset digits, 8 lowercase hex digits
  4. newline  29       b"\\n"

It is written whole (:func:`write`: a temporary file ``log-start-offset.tmp``
that is synced, renamed over the file, then the directory synced), so it is
the old record or the new one after a crash, never a mix. A file that does not
hold such a record (damage on disk) is a :class:`~raylog.errors.StorageFormatError`
naming it: the log does not open rather than serve records a deletion
removed, and nothing in the directory is changed (delete the file to open
the log from its first segment again).

Thread-safety: plain functions; the log calls :func:`read` while it opens
(holding the directory's lock) and :func:`write` under its writer's lock.
"""

from __future__ import annotations

import os

from crc32c import crc32c

from raylog.errors import StorageFormatError
from raylog.storage.fileops import sync_directory
from raylog.storage.owner_only import FILE_MODE

FILE_NAME = "log-start-offset"
#: the record: 20 offset digits, a space, 8 hex digits of CRC32C, a newline
SIZE = 30


def encode(offset: int) -> bytes:
    if not 0 <= offset < 10 ** 20:
        raise ValueError(f"a log start offset is 0 to 10**20 - 1, not {offset}")
    digits = b"%020d" % offset
    return b"%s %08x\n" % (digits, crc32c(digits))


def decode(data: bytes, path: str) -> int:
    """The offset a record holds; :class:`StorageFormatError` for one that is damaged."""
    if len(data) == SIZE and data[20:21] == b" " and data[-1:] == b"\n":
        digits = data[:20]
        if digits.isdigit() and b"%08x" % crc32c(digits) == data[21:29]:
            return int(digits)
    raise StorageFormatError(
        f"{path}: the log start offset file is damaged ({len(data)} bytes: {data[:40]!r}; expected {SIZE} "
        f"bytes, 20 digits, a space, their CRC32C in hex and a newline); the log was not opened so that "
        f"records deleted before the start are not served again. Restore the file, or delete it to start "
        f"the log at its first segment",
        path=path, found=None, known=None,
    )


def read(directory: str) -> int | None:
    """The log start offset recorded in ``directory``, or None without the file."""
    path = os.path.join(directory, FILE_NAME)
    try:
        with open(path, "rb") as f:
            data = f.read(SIZE + 1)
    except FileNotFoundError:
        return None
    return decode(data, path)


def write(directory: str, offset: int) -> None:
    """Record ``offset`` as the log start of ``directory`` (temporary file,
    sync, rename, directory sync). Raises the ``OSError`` of a failed step
    (the old record then stays)."""
    path = os.path.join(directory, FILE_NAME)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        data = encode(offset)
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"short write of {path}: {written} of {len(data)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    sync_directory(directory)
