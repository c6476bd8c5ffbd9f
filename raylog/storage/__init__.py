"""The partition log on local disk: message format, segment files, the log (append, flush, read, retention, recovery). Knows nothing of Ray, sockets or ZooKeeper.

Modules, one per concept:

* :mod:`raylog.storage.message` -- the byte layout of a message (documented
  field by field there), encoding, validation and decoding of message sets;
* :mod:`raylog.storage.compression` -- the gzip, zstd and lz4 codecs of
  wrapper messages;
* :mod:`raylog.storage.segment` -- one segment file;
* :mod:`raylog.storage.resync` -- the way past damaged bytes: the next
  readable message after a corrupt one;
* :mod:`raylog.storage.log` -- :class:`PartitionLog`: append, flush and the
  high watermark, reads as :class:`FileSlice` for ``os.sendfile``, retention
  and recovery.
"""

from raylog.storage.decoding import decode_messages
from raylog.storage.log import FileSlice, PartitionLog, RecoveryReport
from raylog.storage.message import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_ZSTD,
    DEFAULT_MAX_MESSAGE_BYTES,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    codec_id,
    encode_message,
    encode_message_set,
)
from raylog.storage.validation import validate_message_set

__all__ = [
    "PartitionLog",
    "FileSlice",
    "RecoveryReport",
    "MAGIC",
    "LOG_OVERHEAD",
    "HEADER_SIZE",
    "CODEC_NONE",
    "CODEC_GZIP",
    "CODEC_ZSTD",
    "CODEC_LZ4",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "codec_id",
    "encode_message",
    "encode_message_set",
    "decode_messages",
    "validate_message_set",
]
