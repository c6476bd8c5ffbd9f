package org.raylog.spark;

import java.util.Collections;
import java.util.HashMap;
import java.util.Map;

/**
 * A raylog error met by a reader in an executor: its message starts with the
 * name of the raylog error class (the same names as Python's
 * {@code raylog.errors}), so a failed Spark job says which raylog error ended
 * it, e.g. {@code "DataLossError: offsets clicks-0 [0, 4096) were deleted ..."}.
 *
 * <p>Error replies of the data socket keep their wire code and JSON details
 * (for OffsetOutOfRangeError: offset, earliest, latest).
 */
public class RaylogReadException extends RuntimeException {

  private static final long serialVersionUID = 1L;

  /**
   * Wire error codes (raylog/errors.py) and their class names; the test
   * test_the_java_error_table_is_the_one_of_raylog_errors keeps them equal.
   */
  private static final Map<Integer, String> NAMES = new HashMap<>();

  static final int CONFIG = 2;
  static final int INVALID_MESSAGE = 10;
  static final int CORRUPT_MESSAGE = 11;
  static final int MESSAGE_TOO_LARGE = 12;
  static final int OFFSET_OUT_OF_RANGE = 13;
  static final int INVALID_OFFSET = 14;
  static final int PROTOCOL = 20;
  static final int AUTHENTICATION = 22;
  static final int NOT_OWNER = 23;
  static final int BROKER_UNAVAILABLE = 24;
  static final int REQUEST_TIMEOUT = 25;
  static final int UNKNOWN_TOPIC = 30;
  static final int UNKNOWN_PARTITION = 32;
  static final int ZOOKEEPER_UNAVAILABLE = 40;
  static final int SCHEMA = 50;
  static final int UNKNOWN_SCHEMA = 51;
  /** not a wire code: raylog's DataLossError is an OffsetOutOfRangeError raised by readers */
  static final int DATA_LOSS = -13;

  static {
    NAMES.put(1, "RaylogError");
    NAMES.put(CONFIG, "ConfigError");
    NAMES.put(3, "ClosedError");
    NAMES.put(7, "ArgumentTypeError");
    NAMES.put(INVALID_MESSAGE, "InvalidMessageError");
    NAMES.put(CORRUPT_MESSAGE, "CorruptMessageError");
    NAMES.put(MESSAGE_TOO_LARGE, "MessageTooLargeError");
    NAMES.put(OFFSET_OUT_OF_RANGE, "OffsetOutOfRangeError");
    NAMES.put(INVALID_OFFSET, "InvalidOffsetError");
    NAMES.put(15, "StorageError");
    NAMES.put(PROTOCOL, "ProtocolError");
    NAMES.put(21, "FrameTooLargeError");
    NAMES.put(22, "AuthenticationError");
    NAMES.put(NOT_OWNER, "NotOwnerError");
    NAMES.put(BROKER_UNAVAILABLE, "BrokerUnavailableError");
    NAMES.put(REQUEST_TIMEOUT, "RequestTimeoutError");
    NAMES.put(UNKNOWN_TOPIC, "UnknownTopicError");
    NAMES.put(31, "TopicExistsError");
    NAMES.put(UNKNOWN_PARTITION, "UnknownPartitionError");
    NAMES.put(ZOOKEEPER_UNAVAILABLE, "ZooKeeperUnavailableError");
    NAMES.put(41, "SessionExpiredError");
    NAMES.put(42, "RebalanceError");
    NAMES.put(43, "UnknownGroupError");
    NAMES.put(44, "PartitionNotAssignedError");
    NAMES.put(45, "StaleEpochError");
    NAMES.put(48, "GroupActiveError");
    NAMES.put(SCHEMA, "SchemaError");
    NAMES.put(UNKNOWN_SCHEMA, "UnknownSchemaError");
    NAMES.put(52, "ResourcesUnavailableError");
    NAMES.put(16, "OutOfOrderSequenceError");
    NAMES.put(17, "DuplicateSequenceError");
    NAMES.put(18, "InflatedSizeTooLargeError");
    NAMES.put(19, "LogDirectoryLockedError");
    NAMES.put(26, "TooManyConnectionsError");
    NAMES.put(27, "NotEnoughReplicasError");
    NAMES.put(28, "DiskFullError");
    NAMES.put(29, "MissingKeyError");
    NAMES.put(33, "InvalidReassignmentError");
    NAMES.put(34, "ReassignmentTimeoutError");
    NAMES.put(35, "HandoffError");
    NAMES.put(36, "StorageFormatError");
    NAMES.put(37, "RollingRestartError");
    NAMES.put(49, "RayUnavailableError");
    NAMES.put(69, "DeliveryError");
    NAMES.put(70, "LogInUseError");
    NAMES.put(71, "ConcurrentLoadError");
    NAMES.put(72, "FaultInjectionError");
    NAMES.put(80, "DataDirInUseError");
    NAMES.put(90, "EmbeddedZooKeeperError");
    NAMES.put(91, "ClusterPathTakenError");
    NAMES.put(100, "BenchError");
    NAMES.put(110, "DataLossError");
    NAMES.put(120, "MirrorSourceError");
    NAMES.put(121, "MirrorNoTopicsError");
    NAMES.put(122, "MirrorTopicMismatchError");
    NAMES.put(123, "MirrorNotFoundError");
    NAMES.put(124, "MirrorFormatError");
    NAMES.put(150, "PoolNotFoundError");
    NAMES.put(151, "PoolExistsError");
    NAMES.put(160, "MixedGroupError");
    NAMES.put(161, "AssignorError");
    NAMES.put(170, "ControlBatchError");
    NAMES.put(173, "TransactionCoordinatorFencedError");
    NAMES.put(180, "TransactionError");
    NAMES.put(181, "ProducerFencedError");
    NAMES.put(182, "InvalidProducerEpochError");
    NAMES.put(183, "InvalidTxnStateError");
    NAMES.put(184, "ConcurrentTransactionsError");
    NAMES.put(185, "InvalidProducerIdMappingError");
    NAMES.put(186, "TransactionStateConflictError");
    NAMES.put(187, "InvalidTransactionTimeoutError");
    NAMES.put(188, "ProducerIdsExhaustedError");
    NAMES.put(190, "ConfigNotLiveError");
    NAMES.put(191, "InvalidPartitionsError");
    NAMES.put(DATA_LOSS, "DataLossError");
  }

  private final int code;
  private final Map<String, Object> details;

  RaylogReadException(int code, String message) {
    this(code, message, Collections.emptyMap(), null);
  }

  RaylogReadException(int code, String message, Map<String, Object> details, Throwable cause) {
    super(errorName(code) + ": " + message, cause);
    this.code = code;
    this.details = details == null ? Collections.emptyMap() : Collections.unmodifiableMap(details);
  }

  /** The raylog error class name of a wire code. */
  static String errorName(int code) {
    String name = NAMES.get(code);
    return name != null ? name : "RaylogError(code " + code + ")";
  }

  /** The wire code of the raylog error (DataLossError: -13). */
  public int code() {
    return code;
  }

  public String errorName() {
    return errorName(code);
  }

  /** The error's details (from the error reply's JSON, or set by the reader). */
  public Map<String, Object> details() {
    return details;
  }

  /** A long detail, or {@code fallback} when it is missing or not a number. */
  long longDetail(String key, long fallback) {
    Object value = details.get(key);
    return value instanceof Number ? ((Number) value).longValue() : fallback;
  }
}
