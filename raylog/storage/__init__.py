"""The partition log on local disk: message format, segment files, the log
(append, flush, read, retention, recovery). Knows nothing of Ray, sockets or
ZooKeeper; imports only :mod:`raylog.config` and :mod:`raylog.errors`.

Modules, one per concept:

* :mod:`raylog.storage.message` -- the byte layout of a message (documented
  field by field there), encoding of messages and message sets;
* :mod:`raylog.storage.record_batch` -- format 2, Kafka's RecordBatch v2
  with raylog's offsets (documented field by field there): encoding,
  validation at append, stamping, decoding, telling the formats apart;
* :mod:`raylog.storage.batch_validation` -- format 2 in the log: the checks
  before batches are stored, their stamping, recovery's scan of them;
* :mod:`raylog.storage.message_errors` -- the errors of the format (a corrupt
  message, a bad header), built off the hot paths;
* :mod:`raylog.storage.compression` -- the gzip, zstd and lz4 codecs of
  wrapper messages, and snappy (format 2);
* :mod:`raylog.storage.validation` -- every CRC and header of a set, on
  append and in recovery; :mod:`raylog.storage.decoding` -- decoding sets
  into messages, consumer side; :mod:`raylog.storage.counting` -- counting
  the messages of a range without handing them out, by
  :mod:`raylog.storage.countindex` -- a segment's record counts, learnt;
* :mod:`raylog.storage.base` -- the log interface (:class:`~raylog.storage.base.Log`,
  ``Slice``) that the data server and the partition actor use, with two
  implementations: :mod:`raylog.storage.log` (:class:`PartitionLog`, on
  disk) and :mod:`raylog.storage.memory` (in memory);
* :mod:`raylog.storage.segment` -- one segment file; :mod:`raylog.storage.timeindex`
  -- its sparse time index;
* :mod:`raylog.storage.log_reads` -- reads as :class:`FileSlice` for
  ``os.sendfile``, message boundaries; a replica's writes (a leader's bytes
  at the same offsets, truncation) are :class:`PartitionLog`'s own
  (``append_replica``, ``truncate_replica``);
* :mod:`raylog.storage.format_file` -- the ``format`` file of a partition
  directory: the version of each kind of file, checked when a log opens;
* :mod:`raylog.storage.recovery` -- opening a log: the checkpoint and the
  recovery that reports what it dropped (:class:`RecoveryReport`);
  :mod:`raylog.storage.resync` -- the way past damaged bytes;
* :mod:`raylog.storage.retention` -- segment rolls and retention;
* :mod:`raylog.storage.log_start` -- the ``log-start-offset`` file: a log
  start that a deletion of records (``PartitionLog.delete_records_before``,
  Kafka's DeleteRecords) moved past the first segment's base, inside it too;
* compaction (docs/design.md §3): :mod:`raylog.storage.cleaner` -- a pass of
  the log cleaner (keep the latest record of each key) and the atomic swap
  of cleaned segments; :mod:`raylog.storage.offsetmap` -- its map of keys to
  their latest offset, bounded in memory; :mod:`raylog.storage.offsetindex`
  -- a cleaned segment's offset index (``<base>.index``);
  :mod:`raylog.storage.cleaner_thread` -- the partition's thread that runs
  the passes; :mod:`raylog.storage.keyed` -- a compacted topic refuses
  records without a key;
* :mod:`raylog.storage.producer_state` -- the idempotent producers'
  sequences, kept with the log; :mod:`raylog.storage.batch_producers` --
  those of format 2, from the batches' own fields (snapshots at rolls);
* transactions, the partition's side (docs/design.md §6):
  :mod:`raylog.storage.markers` -- the control batches that end a
  transaction (written only through the log, for the coordinator);
  :mod:`raylog.storage.transactions` -- ongoing transactions, the last
  stable offset, fencing and KIP-890's verification, kept in the producer
  snapshots; :mod:`raylog.storage.txnindex` -- the aborted-transactions
  index of a segment (``<base>.txnindex``) that ``read_committed`` reads use;
  :mod:`raylog.storage.aborted_reads` -- the readers' side: which records of
  a ``read_committed`` fetch belong to aborted transactions (Kafka's rule);
* :mod:`raylog.storage.fileops` -- the file system: the directory lock,
  removing a log under that lock, replica directory names, flush threads,
  directory syncs, a full disk;
* :mod:`raylog.storage.stable_hash` -- the stable hash (CRC32C) that maps a
  key to a partition and a topic to its first node;
* :mod:`raylog.storage.owner_only` -- data and secrets at rest are their
  owner's only (``0700`` directories, ``0600`` files);
* :mod:`raylog.storage.faults` -- fault injection for tests of the
  disk-error paths (off unless switched on);
* ``raylog.storage._speedups`` (``_speedups.c``) -- the compiled fast path
  of :mod:`~raylog.storage.message` and :mod:`~raylog.storage.record_batch`
  for runs of plain messages; the pure-Python code is the reference and the
  fallback;
* ``raylog.storage._compaction`` (``_compaction.c``) -- the compiled fast
  path of :mod:`~raylog.storage.cleaner` and :mod:`~raylog.storage.offsetmap`
  (the map in fixed slots, the walks of uncompressed batches without the
  interpreter); the Python code is the reference and the fallback.
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
