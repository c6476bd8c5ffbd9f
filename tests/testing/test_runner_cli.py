"""``raylog faults`` reaches the runner; the README's import line works."""

from __future__ import annotations

import pytest

from raylog.tools import cli


def test_raylog_faults_help_lists_the_runner_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.run(["faults", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for option in ("--duration", "--seed", "--faults", "--out"):
        assert option in out


def test_an_unknown_fault_kind_is_refused_before_anything_starts(tmp_path):
    from raylog.testing.runner import RunOptions, run

    with pytest.raises(ValueError, match="unknown fault kinds"):
        run(RunOptions(faults=("kill-partition", "meteor"), out_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


def test_readme_import_line():
    from raylog.testing.faults import drop_connection, expire_session, flip_byte, kill_actor, pause_actor  # noqa: F401
