"""Transaction records (raylog.zk.transactions) on a real ZooKeeper:
versioned compare-and-set, and offsets written with the commit or not at all."""

from __future__ import annotations

import json

import pytest

from raylog.errors import ConfigError, TransactionStateConflictError
from raylog.groups.offsets import OffsetStore
from raylog.zk.paths import Paths, transactional_id_node, transactional_id_of_node
from raylog.zk.transactions import (
    COMPLETE_COMMIT,
    EMPTY,
    ONGOING,
    PREPARE_COMMIT,
    TransactionRecord,
    TransactionStore,
)


def _record(**kw) -> TransactionRecord:
    base = dict(producer_id=7, producer_epoch=0, state=EMPTY, timeout_ms=60_000)
    base.update(kw)
    return TransactionRecord(**base)


def test_the_json_holds_the_fields_of_design_section_4():
    record = _record(state=ONGOING, started_ms=5).with_partitions([("t", 1), ("a", 0)]).with_group(
        "g", {("t", 0): 42})
    raw = json.loads(record.to_json())
    assert {"producer_id", "producer_epoch", "state", "partitions", "groups", "timeout_ms", "started_ms"} <= set(raw)
    assert raw["partitions"] == [["a", 0], ["t", 1]]
    assert raw["groups"] == {"g": [["t", 0, 42]]}
    assert TransactionRecord.from_json(record.to_json()) == record


def test_unknown_fields_survive_a_write():
    data = json.loads(_record().to_json())
    data["coordinator_note"] = {"x": 1}
    record = TransactionRecord.from_json(json.dumps(data).encode())
    assert json.loads(record.to_json())["coordinator_note"] == {"x": 1}


def test_a_damaged_record_is_a_typed_error_naming_what_to_do():
    with pytest.raises(ConfigError, match="delete the node"):
        TransactionRecord.from_json(b'{"producer_id": 1}', "/x")


@pytest.mark.parametrize("tid", ["a", "with/slash", ".", "..", "ünï cødé", "%2F"])
def test_any_transactional_id_has_a_node_of_its_own(zk, cluster_name, tid):
    store = TransactionStore(zk, cluster_name)
    store.write(tid, _record(), None)
    assert transactional_id_of_node(transactional_id_node(tid)) == tid
    assert store.transactional_ids() == [tid]
    assert store.read(tid)[0] == _record()


def test_a_stale_writer_is_refused_and_the_newer_record_stays(zk, cluster_name, make_zk):
    first, second = TransactionStore(zk, cluster_name), TransactionStore(make_zk(), cluster_name)
    version = first.write("t1", _record(), None)
    record, read_version = second.read("t1")
    assert read_version == version
    newer = first.write("t1", _record(state=ONGOING, started_ms=1), version)
    with pytest.raises(TransactionStateConflictError) as err:
        second.write("t1", _record(producer_epoch=5), read_version)
    assert err.value.retriable and err.value.transactional_id == "t1"
    assert first.read("t1") == (_record(state=ONGOING, started_ms=1), newer)
    # a second creator of the same id is refused too
    with pytest.raises(TransactionStateConflictError, match="created by another writer"):
        second.write("t1", _record(), None)


def test_completing_a_commit_writes_the_offsets_with_it(zk, cluster_name):
    store, offsets = TransactionStore(zk, cluster_name), OffsetStore(zk, cluster_name)
    offsets.commit("g", "t", 0, 3)  # one offset node exists, the other not yet
    prepared = _record(state=PREPARE_COMMIT).with_group("g", {("t", 0): 10, ("t", 1): 20})
    version = store.write("tx", prepared, None)
    done = _record(state=COMPLETE_COMMIT)
    new_version = store.complete("tx", done, version, prepared.group_offsets)
    assert store.read("tx") == (done, new_version)
    assert offsets.committed_all("g") == {("t", 0): 10, ("t", 1): 20}


def test_a_stale_completion_writes_no_offset(zk, cluster_name):
    """The record and the offsets are one ZooKeeper transaction: a completion
    on a stale version writes neither."""
    store, offsets = TransactionStore(zk, cluster_name), OffsetStore(zk, cluster_name)
    offsets.commit("g", "t", 0, 3)
    prepared = _record(state=PREPARE_COMMIT).with_group("g", {("t", 0): 10, ("t", 1): 20})
    version = store.write("tx", prepared, None)
    store.write("tx", prepared, version)  # another coordinator's write moves the version
    with pytest.raises(TransactionStateConflictError):
        store.complete("tx", _record(state=COMPLETE_COMMIT), version, prepared.group_offsets)
    assert offsets.committed_all("g") == {("t", 0): 3}
    assert store.read("tx")[0] == prepared


def test_records_lists_every_transactional_id(zk, cluster_name):
    store = TransactionStore(zk, cluster_name)
    assert list(store.records()) == []
    for i in range(3):
        store.write(f"t{i}", _record(producer_id=i), None)
    assert [(tid, rec.producer_id) for tid, rec, _ in store.records()] == [("t0", 0), ("t1", 1), ("t2", 2)]
    assert Paths(cluster_name).transaction("t0").endswith("/transactions/t0")
