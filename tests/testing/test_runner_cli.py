"""``raylog faults`` reaches the runner; the fault kit's import line of docs/howto/hosts.md works."""

from __future__ import annotations

import pytest

from raylog.tools import cli


def test_raylog_faults_help_lists_the_runner_options(capfd):
    assert cli.run(["faults", "--help"]) == 0
    out = capfd.readouterr().out
    for option in ("--duration", "--seed", "--faults", "--out"):
        assert option in out


def test_an_unknown_fault_kind_is_refused_before_anything_starts(tmp_path):
    from raylog.testing.runner import RunOptions, run

    with pytest.raises(ValueError, match="unknown fault kinds"):
        run(RunOptions(faults=("kill-partition", "meteor"), out_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


def test_readme_import_line():
    from raylog.testing.faults import drop_connection, expire_session, flip_byte, kill_actor, pause_actor  # noqa: F401


def test_kill_leader_is_scheduled_only_when_the_topic_is_replicated():
    from raylog.testing.nemesis import FAULT_KINDS, KILL_LEADER, REMOVE_NODE, REPLICATED_KINDS
    from raylog.testing.runner import RunOptions, run_kinds

    assert run_kinds(RunOptions(nodes=3)) == FAULT_KINDS
    assert run_kinds(RunOptions(nodes=3, replication_factor=3)) == FAULT_KINDS + REPLICATED_KINDS
    # asked for by name, it is still left out without replication (as remove-node on one node)
    assert run_kinds(RunOptions(nodes=3, faults=(KILL_LEADER, "kill-partition"))) == ("kill-partition",)
    assert run_kinds(RunOptions(nodes=1, faults=(REMOVE_NODE, KILL_LEADER))) == ()


def test_replication_options_reach_the_run():
    import argparse

    from raylog.testing.runner import add_arguments, options_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    options = options_from_args(p.parse_args(["--nodes", "3", "--replication-factor", "3", "--min-insync", "2"]))
    assert (options.replication_factor, options.min_insync_replicas, options.faults) == (3, 2, None)


def test_raylog_faults_with_an_unknown_kind_is_a_usage_error_not_a_traceback(capfd):
    assert cli.run(["faults", "--faults", "meteor", "--duration", "1"]) == 2
    err = capfd.readouterr().err
    assert "unknown fault kinds ['meteor']" in err and "Traceback" not in err


def test_the_compact_workload_schedules_the_cleaner_faults_and_no_consumer_fault():
    import argparse
    import os

    from raylog.testing.nemesis import COMPACTION_KINDS, CONSUMER_KINDS, FLIP_BYTE, REPLICATED_KINDS
    from raylog.testing.runner import RunOptions, add_arguments, options_from_args, run_kinds

    kinds = run_kinds(RunOptions(nodes=3, workload="compact"))
    expected = set(COMPACTION_KINDS) if os.geteuid() == 0 else set(COMPACTION_KINDS) - {"disk-full-cleaning"}
    assert expected <= set(kinds)
    assert not set(kinds) & set(CONSUMER_KINDS + (FLIP_BYTE,))
    assert set(REPLICATED_KINDS) <= set(run_kinds(RunOptions(nodes=3, workload="compact", replication_factor=3)))
    # the queue workload has no compacted topic: no cleaner fault, even when asked for
    assert not set(run_kinds(RunOptions(nodes=3))) & set(COMPACTION_KINDS)
    assert run_kinds(RunOptions(nodes=3, faults=("kill-cleaning", "kill-partition"))) == ("kill-partition",)
    with pytest.raises(ValueError, match="do not apply to the compact workload"):
        run_kinds(RunOptions(nodes=3, workload="compact", faults=("kill-consumer",)))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = options_from_args(parser.parse_args(["--workload", "compact", "--keys", "7"]))
    assert (options.workload, options.keys) == ("compact", 7)


def test_the_txn_workload_schedules_the_transaction_faults_and_no_consumer_fault():
    from raylog.testing.nemesis import (
        COMPACTION_KINDS, CONSUMER_KINDS, FLIP_BYTE, REMOVE_NODE, REPLICATED_KINDS, TXN_KINDS,
    )
    from raylog.testing.runner import RunOptions, run_kinds

    kinds = run_kinds(RunOptions(nodes=3, workload="txn"))
    assert set(TXN_KINDS) <= set(kinds) and REMOVE_NODE in kinds
    assert not set(kinds) & set(CONSUMER_KINDS + (FLIP_BYTE,) + COMPACTION_KINDS + REPLICATED_KINDS)
    assert set(REPLICATED_KINDS) <= set(run_kinds(RunOptions(nodes=3, workload="txn", replication_factor=3)))
    assert REMOVE_NODE not in run_kinds(RunOptions(nodes=1, workload="txn"))
    # the other workloads have no transactional writers: no transaction fault, even when asked for
    assert not set(run_kinds(RunOptions(nodes=3))) & set(TXN_KINDS)
    assert run_kinds(RunOptions(nodes=3, faults=("kill-producer", "kill-partition"))) == ("kill-partition",)
    with pytest.raises(ValueError, match="do not apply to the txn workload"):
        run_kinds(RunOptions(nodes=3, workload="txn", faults=("flip-byte",)))
    with pytest.raises(ValueError, match="do not apply to the compact workload"):
        run_kinds(RunOptions(nodes=3, workload="compact", faults=("kill-coordinator",)))


def test_an_unknown_workload_is_refused_before_anything_starts(tmp_path):
    from raylog.testing.runner import RunOptions, run

    with pytest.raises(ValueError, match="unknown workload"):
        run(RunOptions(workload="bank", out_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []
