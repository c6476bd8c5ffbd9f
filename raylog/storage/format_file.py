"""The format file of a partition directory: ``format``, the version of each kind of file in it.

Segment files hold the message format of docs/design.md §2 with no file
header, and the producer-state journal, the time index and the recovery
point have none either; so the directory says once, in this small file,
which version of each it holds. :class:`PartitionLog` checks it before it
reads (or recovers, truncates or rewrites) anything in the directory
(:func:`check_directory`):

* no ``format`` file and no other file: a new partition; the file is
  written (the current versions) before the first segment;
* no ``format`` file beside existing files: a directory written before the
  file existed, which is version 1 of every kind (the current one); the
  file is written, nothing else is touched;
* a ``format`` file naming versions this code knows: the log opens;
* a version this code does not know (a newer raylog wrote the directory),
  a file layout it does not know, or a damaged file:
  :class:`~raylog.errors.StorageFormatError` naming the file and the
  versions, and nothing in the directory is read, truncated or rewritten.

The file is 13 bytes, big-endian::

     field            type  bytes    meaning
  1. magic            4s    0..4     b"RLFM"
  2. layout           u8    4        the layout of this file (1: these fields)
  3. segments         u8    5        the message format of the ``.log`` segment
                                     files (1: docs/design.md §2, magic byte 1;
                                     2: format 1 and record batches, format 2,
                                     one format a segment -- written when the
                                     directory gets its first segment of format 2;
                                     3: as 2, with transactions: transactional and
                                     control batches, ``.txnindex`` files
                                     (:mod:`raylog.storage.txnindex`) -- written
                                     before the first transactional batch or marker)
  4. producer state   u8    6        the ``producer-state`` journal's record
                                     format (1: :mod:`raylog.storage.producer_state`)
  5. time index       u8    7        the ``.timeindex`` entry format
                                     (1: :mod:`raylog.storage.timeindex`)
  6. recovery point   u8    8        the ``recovery-point`` record format
                                     (1: :mod:`raylog.storage.recovery`)
  7. crc              u32   9..13    CRC32C of bytes 0..9

It is written once, to a temporary file that is synced and renamed over
``format`` (then the directory is synced), so it is whole or absent. A
change to any of the four file formats raises its version here; code that
reads the older version as well keeps it readable, and older code refuses
the directory instead of taking the new bytes for damage.

Thread-safety: plain functions; the log calls them once while it opens,
holding the directory's lock.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from crc32c import crc32c

from raylog.errors import StorageFormatError
from raylog.storage.fileops import LOCK_NAME, sync_directory
from raylog.storage.owner_only import FILE_MODE

FILE_NAME = "format"
MAGIC = b"RLFM"
#: the layout of the format file itself (field 2)
LAYOUT = 1
_FIELDS = struct.Struct(">4sBBBBB")
_CRC = struct.Struct(">I")
SIZE = _FIELDS.size + _CRC.size
assert SIZE == 13


class Formats(NamedTuple):
    """The version of each kind of file in a partition directory."""

    segments: int
    producer_state: int
    time_index: int
    recovery_point: int


#: what this code writes in a new directory, of each kind
CURRENT = Formats(segments=1, producer_state=1, time_index=1, recovery_point=1)
#: the newest version of each kind this code reads (segments 2: a directory
#: holding record batches, marked so when it gets its first segment of format 2
#: -- :func:`mark_segments` -- which a raylog reading only format 1 refuses
#: instead of cutting the batches as damage)
READS = CURRENT._replace(segments=3)
#: the versions of a directory written before the format file existed
IMPLIED = Formats(1, 1, 1, 1)


def encode(formats: Formats) -> bytes:
    fields = _FIELDS.pack(MAGIC, LAYOUT, *formats)
    return fields + _CRC.pack(crc32c(fields))


def decode(data: bytes, path: str) -> Formats:
    """The versions a format file holds; :class:`StorageFormatError` for a
    file this code cannot read (another layout, damage) or versions it
    does not know."""
    if len(data) >= 5 and data[:4] == MAGIC and data[4] != LAYOUT:
        raise StorageFormatError(
            f"{path}: the format file has layout version {data[4]}, this raylog knows {LAYOUT}: "
            f"the directory was written by a newer raylog; open it with that version",
            path=path, found=data[4], known=LAYOUT,
        )
    if len(data) != SIZE or data[:4] != MAGIC or _CRC.unpack_from(data, _FIELDS.size)[0] != crc32c(
            data[: _FIELDS.size]):
        raise StorageFormatError(
            f"{path}: the format file is damaged ({len(data)} bytes, expected {SIZE} with magic {MAGIC!r} "
            f"and a matching CRC); nothing in the directory was read or changed. Restore the file "
            f"(or, if the directory was written by raylog 1.x, delete it: version 1 is then implied)",
            path=path, found=None, known=READS._asdict(),
        )
    formats = Formats(*_FIELDS.unpack_from(data)[2:])
    unknown = {kind: version for kind, version in formats._asdict().items()
               if not 1 <= version <= getattr(READS, kind)}
    if unknown:
        said = ", ".join(f"{kind} version {version} (this raylog reads up to {getattr(READS, kind)})"
                         for kind, version in unknown.items())
        raise StorageFormatError(
            f"{path}: the directory holds {said}: it was written by a newer raylog; nothing was read, "
            f"truncated or rewritten. Open it with that version",
            path=path, found=formats._asdict(), known=READS._asdict(),
        )
    return formats


def mark_segments(directory: str, formats: Formats, version: int) -> Formats:
    """Raise the segments version of ``directory``'s format file to
    ``version`` (before the first segment that needs it is written); the
    versions now recorded. Nothing is written when it is that already."""
    if formats.segments >= version:
        return formats
    formats = formats._replace(segments=version)
    write(directory, formats)
    return formats


def write(directory: str, formats: Formats = CURRENT) -> None:
    """Write the format file of ``directory`` whole (temporary file, sync, rename, directory sync)."""
    path = os.path.join(directory, FILE_NAME)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        os.write(fd, encode(formats))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    sync_directory(directory)


def check_directory(directory: str) -> Formats:
    """Check (or, for a new or older directory, write) the format file of
    ``directory`` before anything else in it is read; returns its versions.
    Raises :class:`StorageFormatError` (see the module docstring)."""
    path = os.path.join(directory, FILE_NAME)
    try:
        with open(path, "rb") as f:
            data = f.read(SIZE + 1)
    except FileNotFoundError:
        others = [name for name in os.listdir(directory)
                  if name not in (LOCK_NAME, FILE_NAME + ".tmp")]
        formats = IMPLIED if others else CURRENT
        write(directory, formats)
        return formats
    return decode(data, path)
