"""The data channel's wire protocol: framed requests and replies over TCP.

Every integer is big-endian. Strings (topics, error messages) are a u16
byte length followed by that many bytes of UTF-8. A connection carries a
stream of request frames from the client and reply frames from the server;
replies come in request order and carry the request's correlation id.

Request frame
-------------

1. size            u32  number of bytes that follow this field
2. api key         i16  0 PRODUCE, 1 FETCH, 2 OFFSETS, 3 AUTH, 4 OFFSETS_FOR_TIME,
                        5 COUNT, 6 LOCATE, 7 REPLICA_FETCH
3. version         i16  0; PRODUCE also 1 (idempotence and acks=-1, below);
                        COUNT also 1 (bounded by a number of messages, below)
4. correlation id  i32  chosen by the client, echoed in the reply

then the body of the api:

AUTH, version 1 (must come first when the server has a token): a
challenge–response in two frames, HELLO then PROOF, through which both ends
prove they hold the cluster token and neither sends it
(:mod:`raylog.transfer.handshake`)
    5. step           i8   1 HELLO, 2 PROOF
    6. data           32 bytes: HELLO: the client's nonce (fresh random
                      bytes); PROOF: the client proof, HMAC-SHA256(token,
                      "raylog-auth-client" 0x00 + client nonce + server nonce)

    The client sends PROOF only after checking the server proof of the
    HELLO reply (below); a server without a token answers HELLO with
    AuthenticationError (it cannot prove anything). AUTH version 0 (the
    token in plain text) is refused. Until PROOF is accepted the server
    reads frames of at most :data:`PRE_AUTH_MAX_FRAME_BYTES` (a larger size
    field gets AuthenticationError and the connection is closed) into a
    buffer of that size, so an unauthenticated connection costs a few
    hundred bytes whatever it announces.

PRODUCE, version 0
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. acks           i8   0: no reply at all (the paper's default); 1: reply
                           with the base offset once the log has the set
    9. set length     i32  must equal the bytes left in the frame
    10. message set   bytes, whole messages in the format of docs/design.md §2

PRODUCE, version 1 (idempotent producers and acks=-1)
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. acks           i8   0: no reply; 1: reply once appended to the log;
                           -1 ("all"): reply once the set is flushed
                           (fsynced) and below the high watermark, so that
                           a FETCH right after the reply sees it (with
                           replication later: on every in-sync replica)
    9. producer id    i64  -1: not idempotent (then sequence must be -1);
                           else a non-negative id the producer chose at random
    10. producer epoch i16 0 for now (reserved for fencing)
    11. sequence      i32  number of this set among all sets this producer id
                           sent to this topic-partition: 0, 1, 2, ...
                           (-1 when not idempotent)
    12. set length    i32  must equal the bytes left in the frame
    13. message set   bytes, as in version 0

    The partition remembers, per producer id, the last
    ``PRODUCER_SEQUENCES_REMEMBERED`` (32) sequences and their base
    offsets, kept with the log (:mod:`raylog.storage.producer_state`):
    the next sequence (last + 1), or any sequence of a producer id it does
    not know, is appended; a remembered one is a duplicate, answered with
    the base offset at which the set was stored the first time, and nothing
    is appended; an older one gets DuplicateSequenceError, a gap
    (sequence > last + 1) OutOfOrderSequenceError; both are not retriable.

FETCH
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. offset         i64  byte offset of the first message wanted
    9. max bytes      i32  how much log to send (at least one whole message)
    10. max wait ms   i32  when nothing is there yet, wait up to this long
                           for data (long poll); 0 replies at once

FETCH, version 1 (an isolation level: transactions, docs/design.md §6)
    5. to 10.         as version 0
    11. isolation     i8   0 READ_UNCOMMITTED: as version 0 (every byte below
                           the high watermark); 1 READ_COMMITTED: only bytes
                           below the partition's last stable offset (the
                           first offset of its earliest open transaction,
                           else the high watermark), with the aborted
                           transactions they overlap in the reply (below).
                           A read_committed FETCH at the last stable offset
                           with an open transaction after it is a long poll
                           that waits for the high watermark to move (a
                           marker ends the transaction). Any other value is
                           a ProtocolError. Only a partition's leader (or an
                           unreplicated partition) answers READ_COMMITTED; a
                           follower replica answers NotOwnerError (it knows
                           the transactions only as far as it has copied
                           the log): read from the leader.

    Version 0 frames are answered as before (with version 0 replies), so
    clients that never send version 1 keep working.

OFFSETS
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32

OFFSETS_FOR_TIME
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. timestamp      i64  ms since the epoch

COUNT (how many messages a read of a range would return, without the data)
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. start          i64  byte offset of the first message to count: a
                           message boundary in [log start, high watermark]
    9. end            i64  byte offset where the count ends (exclusive): a
                           message boundary, start <= end <= high watermark
    10. max bytes     i32  how much of the range to walk in this request
                           (at least one message); the server walks at most
                           :data:`COUNT_MAX_BYTES` (64 MiB) whatever is asked

    The partition walks the range's messages on its own node and checks
    each as a FETCH's reader does: sizes, headers and every CRC32C; a
    compressed wrapper is decompressed (bounded by the topic's
    ``max_inflated_bytes``) and counts its inner messages, each checked
    (:mod:`raylog.storage.counting`). The partition keeps what its counts
    learnt (:mod:`raylog.storage.countindex`: records from a segment's start
    to a checkpoint every MiB), so the bytes of a range are walked and
    checked by the first count that reaches them; a later count of any range
    walks only from the last checkpoint before each of its ends, and
    ``max bytes`` bounds the bytes walked, not the range answered (a range
    counted before is answered whole). Errors as FETCH's: OffsetOutOfRangeError
    for a start or end outside the log (or end < start), InvalidOffsetError
    for one off a message boundary, CorruptMessageError (InvalidMessageError)
    for a damaged message: never a count that skips or adds messages.

COUNT, version 1 (the offset reached after at most N messages: what a
Spark trigger of ``maxOffsetsPerTrigger`` records ends at, and the records
between two positions)
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. start          i64  record offset of the first message to count: a
                           message boundary in [log start, high watermark],
                           or the record offset of an inner message of a
                           compressed wrapper (docs/design.md §2): the count
                           then starts at that inner message
    9. end            i64  as in version 0: a message boundary,
                           start <= end <= high watermark
    10. max bytes     i32  as in version 0
    11. max messages  i64  the most messages to count; -1 for no bound (then
                           the count is version 0's, from any record offset)

    The walk stops after ``max messages`` messages. When the last one
    counted is an inner message of a wrapper that holds more, the reply's
    next offset is the record offset of the wrapper's next inner message
    (wrapper offset + its index), which a FETCH or a COUNT may start at.
    Checks and errors as version 0 (:func:`raylog.storage.counting.count_records`).

LOCATE (where a FETCH's record batches lie in the partition's segment file,
for a reader on the partition's own machine that sends them itself with
``os.sendfile``: the Kafka listener, docs/design.md section 10)
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. offset         i64  record offset of the first record wanted (as a
                           FETCH's: the batch holding it is located)
    9. max bytes      i32  how many bytes of batches to locate: whole
                           batches within it, the first one whole even when
                           larger (as a Kafka broker answers a fetch)

    The partition reads as a FETCH does (no long poll: the caller waits
    with FETCH), then walks the batches' headers where they lie in the
    segment file (the headers alone are read, never the records nor a
    copy of the range: :func:`raylog.storage.record_batch.whole_batches_in_file`):
    batches whose records all lie before the offset are passed over, the
    rest cut at whole batches. Bytes that are not format-2 batches in a segment file
    (format-1 messages; a log held in memory) are answered with kind 1:
    the caller reads them with FETCH. Errors as FETCH's.

LOCATE, version 1 (an isolation level, as FETCH version 1's)
    5. to 9.          as version 0
    10. isolation     i8   0 READ_UNCOMMITTED, 1 READ_COMMITTED: the batches
                           located lie below the last stable offset, and the
                           reply names the aborted transactions they overlap
                           (read as a FETCH version 1 reads; errors as its)

REPLICA_FETCH (a follower replica copying its leader's log, docs/design.md
section 7; never sent by clients)
    5. topic length   u16
    6. topic          UTF-8
    7. partition      i32
    8. replica length u16
    9. replica        UTF-8: the follower's replica id (its disk node label,
                      one of the partition's ``replicas`` in ZooKeeper)
    10. leader epoch  i32  the leader epoch of the follower's data (it
                           truncated to this epoch's boundary already); the
                           leader answers NotOwnerError to any other epoch
                           than its own (the follower reads the partition's
                           ``state`` again, truncates and asks again)
    11. log end       i64  the follower's log end: it holds every byte below
                           it, and the answer's bytes start there (the
                           fetch position)
    12. flushed       i64  the follower's flushed (fsynced) end, <= log end:
                           what ``acks="all"`` counts as on this replica
    13. max bytes     i32  how much log to send (at least one whole message);
                           the producers' sets are bounded by it too
    14. max wait ms   i32  when the leader has no bytes past the log end,
                           wait up to this long for an append (long poll,
                           capped as FETCH's); 0 replies at once

    The leader records the follower's progress first (log end and flushed,
    whatever the rest of the request does: a follower's request is how the
    leader learns how far it reaches), updates the committed offset (the
    high watermark) and the ISR from it, then reads its log from the log
    end, flushed or not, and the idempotent producers' sets those bytes hold
    (read after the bytes, so that they cover every set the bytes hold).
    Errors: NotOwnerError when this endpoint does not lead the partition,
    the replica is not one of the partition's or the epochs differ;
    OffsetOutOfRangeError (details earliest, latest) when the log end lies
    outside the leader's log (a follower behind the leader's log start
    starts over there).

Reply frame
-----------

1. size            u32  number of bytes that follow this field
2. correlation id  i32  of the request; -1 for an error about the connection
                        itself (e.g. a frame too large to read its header)
3. error code      i16  0 for none, else the ``code`` of a raylog error class

If the error code is not 0 the body is the error, whatever the api:

    4. message length u16
    5. message        UTF-8
    6. details length u16
    7. details        a UTF-8 JSON object of the error's details (for
                      OffsetOutOfRangeError: offset, earliest, latest)

and :func:`decode_error` rebuilds the same typed error class from it.
Otherwise the body depends on the api of the request:

AUTH      HELLO: 4. server nonce 32 bytes (fresh random bytes), 5. server
          proof 32 bytes, HMAC-SHA256(token, "raylog-auth-server" 0x00 +
          client nonce + server nonce); PROOF: nothing
PRODUCE   4. base offset i64  (acks 1 and -1; acks=0 gets no reply); for a
             duplicate (version 1) the offset of the first store
FETCH     4. high watermark i64, 5. log start offset i64,
          6. data length i32, 7. data: the raw log bytes from the request's
          offset, whole messages and possibly a partial last one; sent by
          the server with ``os.sendfile`` straight from the segment file
FETCH version 1 (whatever the isolation of the request)
          4. high watermark i64, 5. log start offset i64,
          6. last stable offset i64: the partition's (the high watermark
             for READ_UNCOMMITTED and for a partition without transactions),
          7. aborted count i32, then that many aborted transactions that
             overlap the data (READ_COMMITTED only; 0 otherwise), in marker
             order, each:
               producer id  i64
               first offset i64  of the transaction's first batch here
               last offset  i64  of its abort marker (a control batch)
             a reader drops every record of a transactional batch of that
             producer id at an offset in [first offset, last offset) (Kafka's
             rule) and never hands out control batches,
          8. data length i32, 9. data: as version 0's, below the last stable
             offset for READ_COMMITTED; sent with ``os.sendfile``
OFFSETS   4. log start offset i64, 5. high watermark i64
OFFSETS_FOR_TIME
          4. offset i64: of the first message (below the high watermark)
             whose timestamp is at or after the request's, found with the
             segments' time indexes (:mod:`raylog.storage.timeindex`); for a
             compressed set, its wrapper; the high watermark when there is none
COUNT     4. messages i64: the messages a read of [start, next offset) returns
          5. next offset i64: where the count stopped: the request's end, or
             (past max bytes) the first boundary after it; ask again from there
          (version 1: the same fields; next offset may be a record offset
          inside a wrapper when max messages stopped the count there)
LOCATE    4. high watermark i64, 5. log start offset i64,
          6. kind i8: 0 a range of format-2 batches (fields 8 to 12; its
             length is 0 when nothing at the offset is below the high
             watermark, or when the batches walked held no record at or
             after it: then ask again from the next offset); 1 not
             locatable (format-1 messages or a log in memory): FETCH it
          7. next offset i64: where the reader goes on after the range (the
             last batch's baseOffset + lastOffsetDelta + 1; the request's
             offset when nothing was walked)
          8. position i64: of the range's first byte in the segment file
          9. length i32: bytes of the range
          10. device u64, 11. inode u64: the segment file's (``os.fstat``):
             the reader checks that the file it opens by path is this one
             (not a segment replaced since, nor another machine's file)
          12. path length u16, 13. path UTF-8: the segment file, absolute
          A reader must check the file it opens (fields 10 and 11, and
          that it holds the range) and read the range with FETCH when it
          cannot open it (retention may delete the segment meanwhile).
LOCATE version 1: the fields of version 0, then
          14. last stable offset i64 (the high watermark for READ_UNCOMMITTED),
          15. aborted count i32 and the aborted transactions as in a FETCH
              version 1 reply (producer id i64, first offset i64, last
              offset i64 each; none for READ_UNCOMMITTED)

REPLICA_FETCH
          4. high watermark i64: the leader's committed offset (what the
             follower serves readers up to), 5. log start offset i64,
          6. leader epoch i32: the leader's,
          7. sets length i32, 8. sets: the producers' sets remembered at or
             after the request's log end, as records of the producer-state
             journal (:mod:`raylog.storage.producer_state`, ``RECORD_SIZE``
             bytes each, with the sequence each producer was learnt at), at
             most the request's max bytes or
             :data:`REPLICA_FETCH_SETS_MAX_BYTES`, the smaller, of them (so
             that data of max bytes fits the frame beside them; when they
             are cut short the follower keeps the bytes the sets it got
             describe, and asks again from there); none (length 0) when the data are
             record batches (format 2): a replica remembers their producers
             from the batches' own fields,
          9. data length i32, 10. data: the leader's log from the request's
             log end, appended bytes whether flushed or not, whole messages
             and possibly a partial last one; sent with ``os.sendfile``

Errors and the connection
-------------------------

* A frame whose size exceeds the endpoint's maximum (default
  :data:`DEFAULT_MAX_FRAME_BYTES`, the default ``max_message_bytes`` plus
  64 KiB of header room) is refused before anything of that size is
  allocated: FrameTooLargeError, then the connection is closed.
* A malformed frame (unknown api key or version, lengths that do not add
  up, a truncated frame) gets a ProtocolError reply where possible, then
  the connection is closed.
* A failing acks=0 produce cannot be answered in place: the server sends the
  error reply (with that produce's correlation id) and closes the
  connection, so that the producer learns of it on its next call.
* Any other error (the log refused the set, the offset is out of range, the
  partition lives elsewhere ...) is answered and the connection stays open.
* A PRODUCE to a partition whose disk is full is answered with
  DiskFullError, error code 28 (:data:`ERROR_DISK_FULL`; retriable; details
  ``node``, ``path``, ``directory``): nothing of the set was stored, the
  connection stays open, FETCH and OFFSETS go on being served, and the
  partition takes writes again by itself once space is freed (producers
  retry within their delivery deadline).
* A FETCH (or COUNT) at an offset that is not a message boundary is
  answered with InvalidOffsetError, error code 14, whose details carry
  ``message_offset`` and ``next_offset`` (the message that holds it). When
  that message is a compressed wrapper (the offset is the record offset of
  one of its inner messages, docs/design.md §2, or lies in its padding) the
  details also carry ``wrapper_offset``: the reader fetches from there and
  skips the inner messages below the offset it wanted
  (``BrokerConnection.fetch(..., inside_wrapper=True)``; the Spark reader
  likewise). A COUNT whose start or end lies inside a wrapper is answered
  the same way, and the reader counts the rows it reads instead.
* A FETCH (or COUNT) that starts at a damaged stored message is answered
  with CorruptMessageError, error code 11, whose details carry
  ``next_offset``: the offset of the next readable message (or the log end),
  where a reader that chooses to skip the damage goes on
  (``consumer.skip_corrupt()``); ``damaged_from`` when the requested offset
  lies inside the damaged bytes. A damaged size field is reported this way
  too, never as MessageTooLargeError.
* Bounds of the server (:mod:`raylog.transfer.server`): the AUTH exchange must
  complete within a deadline (AuthenticationError, then close); a connection
  idle for long is closed; a FETCH's max wait ms is capped; at its
  connection limit the server closes the longest-idle connection or answers
  a new one with TooManyConnectionsError (correlation id -1) and closes it.
"""

from __future__ import annotations

import struct

from raylog.config import KiB, TopicConfig

API_PRODUCE = 0
API_FETCH = 1
API_OFFSETS = 2
API_AUTH = 3
API_OFFSETS_FOR_TIME = 4
API_COUNT = 5
API_LOCATE = 6
API_REPLICA_FETCH = 7
#: COUNT version 1: field 11, max messages
COUNT_VERSION_BOUNDED = 1
#: FETCH version 1: field 11, the isolation level, and the last stable
#: offset and aborted transactions in the reply (LOCATE version 1 likewise)
FETCH_VERSION_ISOLATION = 1
LOCATE_VERSION_ISOLATION = 1
#: isolation levels of a FETCH version 1 (Kafka's values)
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
API_NAMES = {
    API_PRODUCE: "PRODUCE",
    API_FETCH: "FETCH",
    API_OFFSETS: "OFFSETS",
    API_AUTH: "AUTH",
    API_OFFSETS_FOR_TIME: "OFFSETS_FOR_TIME",
    API_COUNT: "COUNT",
    API_LOCATE: "LOCATE",
    API_REPLICA_FETCH: "REPLICA_FETCH",
}

VERSION = 0
#: AUTH version 1: the challenge–response (version 0, the plain token, is refused)
AUTH_VERSION = 1
#: steps of an AUTH version 1 frame
AUTH_HELLO = 1
AUTH_PROOF = 2
#: bytes of a nonce and of a proof (HMAC-SHA256) in the AUTH exchange
NONCE_BYTES = 32
PROOF_BYTES = 32
#: the largest frame (value of its size field) read before AUTH completes
#: (an AUTH frame has 41)
PRE_AUTH_MAX_FRAME_BYTES = 256
#: PRODUCE version 1: producer id, epoch and sequence, and acks=-1
PRODUCE_VERSION_IDEMPOTENT = 1

#: acks levels of a PRODUCE
ACKS_NONE = 0
ACKS_LEADER = 1
ACKS_ALL = -1
#: producer id and sequence of a set that is not idempotent
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
#: sequences (with their base offsets) a partition remembers per producer id
PRODUCER_SEQUENCES_REMEMBERED = 32
#: the most sets a producer keeps unacknowledged per partition (below the
#: sequences remembered, so a retry of all of them is always recognised)
MAX_IN_FLIGHT_PER_PARTITION = 16

#: the error code of DiskFullError (raylog.errors): a PRODUCE refused for a full disk
ERROR_DISK_FULL = 28
#: the error code of CorruptMessageError (details: offset, next_offset)
ERROR_CORRUPT_MESSAGE = 11

#: correlation id of an error reply about the connection rather than a request
NO_CORRELATION = -1

#: header room on top of the largest message set
FRAME_OVERHEAD_BYTES = 64 * KiB
#: the largest frame (value of its size field) an endpoint accepts by default
DEFAULT_MAX_FRAME_BYTES = TopicConfig().max_message_bytes + FRAME_OVERHEAD_BYTES

MAX_STRING_BYTES = 0xFFFF

#: the most log one COUNT request walks (its max bytes is capped to this):
#: a count holds its connection's thread for tens of milliseconds at most
COUNT_MAX_BYTES = 64 * 1024 * KiB

# -- precompiled headers -----------------------------------------------------

#: size field alone
SIZE = struct.Struct(">I")
#: size, api key, version, correlation id
REQUEST_HEADER = struct.Struct(">Ihhi")
#: bytes of the request header after the size field
REQUEST_HEADER_BODY = REQUEST_HEADER.size - SIZE.size
#: a string's length prefix
STRING_LENGTH = struct.Struct(">H")
#: PRODUCE after the topic: partition, acks, set length
PRODUCE_FIELDS = struct.Struct(">ibi")
#: PRODUCE version 1 after the topic: partition, acks, producer id,
#: producer epoch, sequence, set length
PRODUCE_V1_FIELDS = struct.Struct(">ibqhii")
#: FETCH after the topic: partition, offset, max bytes, max wait ms
FETCH_FIELDS = struct.Struct(">iqii")
#: FETCH version 1 after the topic: partition, offset, max bytes, max wait ms, isolation
FETCH_V1_FIELDS = struct.Struct(">iqiib")
#: OFFSETS after the topic: partition
OFFSETS_FIELDS = struct.Struct(">i")
#: OFFSETS_FOR_TIME after the topic: partition, timestamp
OFFSETS_FOR_TIME_FIELDS = struct.Struct(">iq")
#: COUNT after the topic: partition, start, end, max bytes
COUNT_FIELDS = struct.Struct(">iqqi")
#: COUNT version 1 after the topic: partition, start, end, max bytes, max messages
COUNT_V1_FIELDS = struct.Struct(">iqqiq")
#: LOCATE after the topic: partition, offset, max bytes
LOCATE_FIELDS = struct.Struct(">iqi")
#: LOCATE version 1 after the topic: partition, offset, max bytes, isolation
LOCATE_V1_FIELDS = struct.Struct(">iqib")
#: LOCATE version 1 reply after the path: last stable offset, aborted count
LOCATE_V1_REPLY_TAIL = struct.Struct(">qi")
#: REPLICA_FETCH: partition (between the topic and the replica id)
REPLICA_FETCH_PARTITION = struct.Struct(">i")
#: REPLICA_FETCH after the replica id: leader epoch, log end, flushed, max bytes, max wait ms
REPLICA_FETCH_FIELDS = struct.Struct(">iqqii")

#: AUTH version 1 body: step, nonce or proof
AUTH_FIELDS = struct.Struct(f">b{NONCE_BYTES}s")

#: size, correlation id, error code
REPLY_HEADER = struct.Struct(">Iih")
#: bytes of the reply header after the size field
REPLY_HEADER_BODY = REPLY_HEADER.size - SIZE.size

# the fixed fields of each successful reply after its reply header
PRODUCE_REPLY_FIELDS = struct.Struct(">q")  # base offset
FETCH_REPLY_FIELDS = struct.Struct(">qqi")  # high watermark, log start offset, data length
#: FETCH version 1: high watermark, log start offset, last stable offset, aborted count
#: (then the aborted transactions, then FETCH_V1_DATA_LENGTH and the data)
FETCH_V1_REPLY_FIELDS = struct.Struct(">qqqi")
#: FETCH version 1: one aborted transaction: producer id, first offset, last (marker) offset
FETCH_V1_ABORTED = struct.Struct(">qqq")
#: FETCH version 1: data length, after the aborted transactions
FETCH_V1_DATA_LENGTH = struct.Struct(">i")
#: the most aborted transactions one FETCH version 1 reply carries (the
#: server cuts the data short before the first batch whose transaction it
#: cannot name)
FETCH_V1_MAX_ABORTED = 1024
OFFSETS_REPLY_FIELDS = struct.Struct(">qq")  # log start offset, high watermark
OFFSETS_FOR_TIME_REPLY_FIELDS = struct.Struct(">q")  # offset
COUNT_REPLY_FIELDS = struct.Struct(">qq")  # messages, next offset
#: high watermark, log start offset, kind, next offset, position, length, device, inode (then the path)
LOCATE_REPLY_FIELDS = struct.Struct(">qqbqqiQQ")
#: LOCATE reply kinds
#: REPLICA_FETCH: high watermark, log start offset, leader epoch, sets length (then the sets,
#: then REPLICA_FETCH_DATA_LENGTH and the data)
REPLICA_FETCH_REPLY_FIELDS = struct.Struct(">qqii")
#: the most bytes of producers' sets a REPLICA_FETCH reply carries (within the
#: FRAME_OVERHEAD_BYTES of a frame beside the data)
REPLICA_FETCH_SETS_MAX_BYTES = 32 * KiB
#: REPLICA_FETCH: data length, after the sets
REPLICA_FETCH_DATA_LENGTH = struct.Struct(">i")
LOCATED_BATCHES = 0
NOT_LOCATABLE = 1
AUTH_HELLO_REPLY_FIELDS = struct.Struct(f">{NONCE_BYTES}s{PROOF_BYTES}s")  # server nonce, server proof


def _after_reply_header(fields: struct.Struct) -> struct.Struct:
    return struct.Struct(REPLY_HEADER.format + fields.format.lstrip(">"))


#: whole replies (header and fields) of each api
PRODUCE_REPLY = _after_reply_header(PRODUCE_REPLY_FIELDS)
FETCH_REPLY = _after_reply_header(FETCH_REPLY_FIELDS)
FETCH_V1_REPLY = _after_reply_header(FETCH_V1_REPLY_FIELDS)
OFFSETS_REPLY = _after_reply_header(OFFSETS_REPLY_FIELDS)
OFFSETS_FOR_TIME_REPLY = _after_reply_header(OFFSETS_FOR_TIME_REPLY_FIELDS)
COUNT_REPLY = _after_reply_header(COUNT_REPLY_FIELDS)
LOCATE_REPLY = _after_reply_header(LOCATE_REPLY_FIELDS)
REPLICA_FETCH_REPLY = _after_reply_header(REPLICA_FETCH_REPLY_FIELDS)
AUTH_HELLO_REPLY = _after_reply_header(AUTH_HELLO_REPLY_FIELDS)
