"""The schema registry: Avro schemas kept in ZooKeeper under numeric ids.

Layout (under the cluster root ``/raylog/<cluster>``, docs/design.md §4)::

    schemas/<id>                 persistent  the schema, as canonical JSON (below)
    schemas-by-hash/<sha256>     persistent  the id (ASCII) of the schema whose
                                             canonical JSON has that SHA-256
    schema-subjects/<subject>/<10 digits>
                                 persistent  the id (ASCII) of one version of the
                                             subject (a sequential node: the
                                             first is version 1)

Ids come from ZooKeeper's sequence counter on ``schemas/``: registering
creates the sequential node ``schemas/<10 digits>`` and the id is the int of
that suffix, so ids are unique and increasing within a cluster (the first is
0). ``schemas-by-hash/`` is an index that makes :meth:`SchemaRegistry.register`
idempotent: the same schema always gets the id it got first.

**Canonical JSON.** A schema is parsed with ``fastavro.parse_schema`` (which
fully qualifies every name with its namespace) and written with sorted keys
and no whitespace. Two spellings of one schema (key order, a namespace given
apart or inside the name) therefore share an id; two schemas that differ in
anything else, a default or a doc included, get different ids.

**Subjects.** A subject names the versions of one evolving schema (as
Confluent's registry does, e.g. ``clicks-value``): ``register(schema,
subject=...)`` registers the schema (its id as above) and, unless the
subject's latest version already has that id, adds it as the next version.
Readers pick a reader schema by subject and version (``"latest"`` or a
number: :meth:`SchemaRegistry.subject_version`). Two registrars adding the
same schema to a subject at once may both add a version (the later is
then a second version of the same id): harmless, since a version only
names an id.

**Races.** Two processes registering the same new schema at once both create
a sequential node, then race to create the index node; the loser deletes its
own sequential node and returns the winner's id. A process that dies between
the two steps leaves a schema node with no index entry: it is a valid schema
under a valid id, only never returned by :meth:`register` again.

Thread-safety: a registry may be shared between threads. The KazooClient is
thread-safe and the local cache is guarded by a lock. Registered schemas are
never changed or removed, so cached entries never go stale.

Usage::

    registry = SchemaRegistry(zk, cluster="default")
    schema_id = registry.register({"type": "record", "name": "Click", "fields": [...]})
    registry.get(schema_id)          # the schema as a dict
    registry.register(schema, subject="clicks-value")   # and a version of the subject
    registry.subject_version("clicks-value")            # the id of its latest version
    registry.list()                  # {id: schema, ...}
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError

from raylog.errors import SchemaError, UnknownSchemaError
from raylog.zk.errors import zookeeper_errors
from raylog.zk.paths import DEFAULT_CLUSTER, Paths

#: the longest one ZooKeeper request may take (a request queued while kazoo
#: reconnects waits at most this long) before it fails as unavailable
REQUEST_TIMEOUT_S = 10.0

#: An Avro schema as accepted by the registry: JSON text, or its parsed form
#: (a dict for named and complex types, a list for a union, a str for a
#: primitive name).
Schema = Any

_PRIMITIVES = frozenset(["null", "boolean", "int", "long", "float", "double", "bytes", "string"])


def load_schema(schema: Schema) -> Any:
    """``schema`` as a Python value: JSON text is decoded, a bare primitive
    name (``"string"``) is taken as it is, anything else is returned as given."""
    if isinstance(schema, (bytes, bytearray)):
        schema = schema.decode("utf-8")
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return schema
        try:
            return json.loads(schema)
        except ValueError as err:
            raise SchemaError(f"schema is not valid JSON: {err}; pass a dict or JSON text") from None
    return schema


def canonical_schema(schema: Schema) -> tuple[Any, str]:
    """Parse ``schema`` and return ``(clean, canonical_json)``.

    ``clean`` is the schema as fastavro parses it (names fully qualified)
    without fastavro's private ``__`` keys; ``canonical_json`` is ``clean``
    written with sorted keys and no whitespace. Raises :class:`SchemaError`
    if the schema is not a valid Avro schema.
    """
    from fastavro import parse_schema  # only for Avro: imported when used

    loaded = load_schema(schema)
    try:
        parsed = parse_schema(loaded, named_schemas={})
    except Exception as err:  # noqa: BLE001 - fastavro raises several unrelated types
        raise SchemaError(f"invalid Avro schema: {type(err).__name__}: {err}") from None
    clean = _strip_private(parsed)
    return clean, json.dumps(clean, sort_keys=True, separators=(",", ":"))


def _strip_private(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_private(v) for k, v in value.items() if not k.startswith("__")}
    if isinstance(value, list):
        return [_strip_private(v) for v in value]
    return value


class SchemaRegistry:
    """Avro schemas of one cluster, stored in ZooKeeper (see the module doc).

    ``zk`` is a started :class:`kazoo.client.KazooClient`; the registry does
    not start or stop it. Each ZooKeeper request waits at most
    ``request_timeout_s`` and then fails with :class:`ZooKeeperUnavailableError`.
    """

    def __init__(self, zk, cluster: str = DEFAULT_CLUSTER, *, request_timeout_s: float = REQUEST_TIMEOUT_S):
        self._zk = zk
        self._timeout = request_timeout_s
        self._paths = Paths(cluster)
        self._by_hash_root = self._paths.schemas_by_hash
        self._lock = threading.Lock()
        self._by_id: dict[int, str] = {}  # id -> canonical JSON
        self._ids: dict[str, int] = {}  # sha256 of canonical JSON -> id

    # ------------------------------------------------------------------
    # writing

    def register(self, schema: Schema, subject: str | None = None) -> int:
        """Register ``schema`` and return its id; a schema already registered
        (in any spelling with the same canonical JSON) returns its existing id.
        With ``subject``, the id also becomes the subject's next version
        unless it is its latest already.

        Raises :class:`SchemaError` for an invalid schema and
        :class:`ZooKeeperUnavailableError` when ZooKeeper cannot be reached.
        """
        if subject is not None:
            check_subject(subject)
        _, text = canonical_schema(schema)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        with self._lock:
            cached = self._ids.get(digest)
        if cached is not None:
            if subject is not None:
                self._add_version(subject, cached)
            return cached

        index_path = f"{self._by_hash_root}/{digest}"
        with zookeeper_errors(self._zk, "register a schema"):
            existing = self._read_index(index_path)
            if existing is None:
                created = self._request(
                    "create", self._paths.schemas + "/", text.encode("utf-8"), sequence=True, makepath=True
                )
                schema_id = _id_of(created)
                try:
                    self._request("create", index_path, str(schema_id).encode("ascii"), makepath=True)
                except NodeExistsError:
                    # Another registrar indexed the same schema first: use its id.
                    self._request("delete", created)
                    existing = self._read_index(index_path)
                    if existing is None:  # pragma: no cover - index nodes are never deleted
                        raise SchemaError(f"schema index {index_path} vanished while registering; retry")
                else:
                    existing = schema_id

        with self._lock:
            self._ids[digest] = existing
            self._by_id.setdefault(existing, text)
        if subject is not None:
            self._add_version(subject, existing)
        return existing

    def _add_version(self, subject: str, schema_id: int) -> None:
        versions = self.versions(subject)
        if versions and versions[max(versions)] == schema_id:
            return
        with zookeeper_errors(self._zk, f"add a version to schema subject {subject!r}"):
            self._request("create", self._paths.schema_subject(subject) + "/", str(schema_id).encode("ascii"),
                          sequence=True, makepath=True)

    def _request(self, op: str, *args, **kw):
        """``zk.<op>(*args, **kw)``, waiting at most the request timeout."""
        return getattr(self._zk, op + "_async")(*args, **kw).get(timeout=self._timeout)

    def _read_index(self, index_path: str) -> int | None:
        try:
            data, _ = self._request("get", index_path)
        except NoNodeError:
            return None
        return int(data.decode("ascii"))

    # ------------------------------------------------------------------
    # reading

    def get(self, schema_id: int) -> Any:
        """The schema registered under ``schema_id`` (a fresh copy on each call).

        Raises :class:`UnknownSchemaError` if no schema has that id.
        """
        return json.loads(self.get_json(schema_id))

    def get_json(self, schema_id: int) -> str:
        """The canonical JSON text of the schema registered under ``schema_id``."""
        if not isinstance(schema_id, int) or isinstance(schema_id, bool) or schema_id < 0:
            raise UnknownSchemaError(f"schema id must be a non-negative int, got {schema_id!r}", schema_id=schema_id)
        with self._lock:
            text = self._by_id.get(schema_id)
        if text is not None:
            return text
        with zookeeper_errors(self._zk, f"read schema {schema_id}"):
            try:
                data, _ = self._request("get", self._paths.schema(schema_id))
            except NoNodeError:
                raise UnknownSchemaError(
                    f"no schema is registered under id {schema_id} in cluster {self._paths.root!r}; "
                    "register it first (or check that producer and consumer use the same cluster)",
                    schema_id=schema_id,
                ) from None
        text = data.decode("utf-8")
        with self._lock:
            self._by_id[schema_id] = text
        return text

    def list(self) -> dict[int, Any]:
        """Every registered schema, ``{id: schema}``, in id order."""
        with zookeeper_errors(self._zk, "list schemas"):
            try:
                children = self._request("get_children", self._paths.schemas)
            except NoNodeError:
                return {}
        ids = sorted(int(child) for child in children if child.isdigit())
        result: dict[int, Any] = {}
        for schema_id in ids:
            try:
                result[schema_id] = self.get(schema_id)
            except UnknownSchemaError:
                continue  # a losing registrar's node, deleted since get_children
        return result

    def subjects(self) -> list[str]:
        """The subjects, sorted."""
        with zookeeper_errors(self._zk, "list schema subjects"):
            try:
                return sorted(self._request("get_children", self._paths.schema_subjects))
            except NoNodeError:
                return []

    def versions(self, subject: str) -> dict[int, int]:
        """``{version: schema id}`` of ``subject`` (versions from 1); empty
        when the subject has none."""
        check_subject(subject)
        root = self._paths.schema_subject(subject)
        with zookeeper_errors(self._zk, f"list the versions of schema subject {subject!r}"):
            try:
                children = self._request("get_children", root)
            except NoNodeError:
                return {}
            out = {}
            for child in children:
                if child.isdigit():
                    data, _ = self._request("get", f"{root}/{child}")
                    out[int(child) + 1] = int(data.decode("ascii"))
        return dict(sorted(out.items()))

    def subject_version(self, subject: str, version: int | str = "latest") -> int:
        """The schema id of ``version`` (a number from 1, or ``"latest"``) of
        ``subject``; :class:`UnknownSchemaError` when there is none."""
        if not (version == "latest" or (isinstance(version, int) and not isinstance(version, bool) and version > 0)):
            raise SchemaError(f"a subject version is 'latest' or a number from 1, got {version!r}")
        versions = self.versions(subject)
        if not versions:
            raise UnknownSchemaError(
                f"no schema is registered under subject {subject!r} in cluster {self._paths.root!r}; register "
                "one with register(schema, subject=...) (AvroSerializer(..., subject=...))")
        chosen = max(versions) if version == "latest" else version
        if chosen not in versions:
            raise UnknownSchemaError(
                f"subject {subject!r} has no version {version} (its versions: 1 to {max(versions)})")
        return versions[chosen]

    def __repr__(self) -> str:
        return f"SchemaRegistry(root={self._paths.root!r})"


def check_subject(subject) -> str:
    """``subject`` if it can name a subject (a ZooKeeper node name); else
    :class:`SchemaError`."""
    if (not isinstance(subject, str) or not subject or subject in (".", "..") or "/" in subject
            or any(ord(c) < 32 for c in subject) or len(subject) > 255):
        raise SchemaError(f"a schema subject is a non-empty name of at most 255 characters without '/' or "
                          f"control characters, got {subject!r}")
    return subject


def _id_of(node_path: str) -> int:
    return int(node_path.rsplit("/", 1)[1])

