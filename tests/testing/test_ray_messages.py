"""A fault run's Ray messages about the faults it makes go to a file of
the run, not to its output; the actors' own lines still reach the console,
and the console is given back on close."""

from __future__ import annotations

from raylog.testing.ray_messages import divert_ray_messages

_STATE_DUMP = (
    "Raylet is terminated. Termination is unexpected. Last 3 lines of the Raylet logs:\n"
    "    [state-dump] NodeManager: a\n    [state-dump] b\n    [state-dump] c"
)


def test_the_raylets_messages_go_to_the_file_and_the_actors_lines_pass(ray_local, tmp_path, capfd):
    import ray._private.worker as worker

    original = worker.print_to_stdstream
    diverted = divert_ray_messages(str(tmp_path / "ray-messages.log"))
    try:
        # as the driver's error listener hands a message to the console
        worker.print_to_stdstream({"lines": [_STATE_DUMP], "pid": "raylet", "is_err": False}, ignore_prefix=False)
        worker.print_to_stdstream({"lines": ["an actor's own line"], "pid": 4242, "is_err": False,
                                   "actor_name": "Holder", "task_name": "", "ip": "127.0.0.1"},
                                  ignore_prefix=False)
    finally:
        diverted.close()
    out = capfd.readouterr().out
    assert "state-dump" not in out and "Raylet is terminated" not in out, out
    assert "an actor's own line" in out
    assert (tmp_path / "ray-messages.log").read_text() == _STATE_DUMP + "\n"
    assert diverted.lines == 4
    assert worker.print_to_stdstream is original
