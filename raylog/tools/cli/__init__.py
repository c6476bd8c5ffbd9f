"""The ``raylog`` command line, one module per command family:

* :mod:`~raylog.tools.cli.base`: the click group, global options, the target cluster;
* :mod:`~raylog.tools.cli.topics`: ``topics``, ``supervisor``;
* :mod:`~raylog.tools.cli.nodes`: ``nodes`` (drain, rolling restart);
* :mod:`~raylog.tools.cli.streams`: ``produce``, ``consume``;
* :mod:`~raylog.tools.cli.groups`: ``groups``;
* :mod:`~raylog.tools.cli.mirror`: ``mirror`` (start, status, stop) and ``groups translate``;
* :mod:`~raylog.tools.cli.pool`: ``pool status`` (consumer pools);
* :mod:`~raylog.tools.cli.audit`: ``audit``;
* :mod:`~raylog.tools.cli.bench`: ``bench``;
* :mod:`~raylog.tools.cli.zookeeper`: ``zookeeper``;
* :mod:`~raylog.tools.cli.token`: ``token`` (the cluster's data token, for users outside Ray);
* :mod:`~raylog.tools.cli.tls`: ``tls init`` (the Kafka listeners' certificates);
* ``faults`` (here): the fault checker of :mod:`raylog.testing.runner`.

After Kafka's tools: topics, a console
producer and consumer, consumer groups, the audit check, the autoscaled
benchmark, and a local ZooKeeper.

::

    raylog zookeeper start --port 2181 --data-dir /var/tmp/raylog-zk
    raylog --zookeeper 127.0.0.1:2181 --ray-address auto topics create clicks --partitions 8
    raylog --zookeeper 127.0.0.1:2181 topics describe clicks
    printf 'user-1\\t/home\\n' | raylog --zookeeper 127.0.0.1:2181 produce clicks --key-separator $'\\t'
    raylog --zookeeper 127.0.0.1:2181 consume clicks --group stats --from-beginning --max-messages 10
    raylog --zookeeper 127.0.0.1:2181 groups describe stats
    raylog --zookeeper 127.0.0.1:2181 audit --topic clicks --group stats
    raylog bench --phases 1,2,3
    raylog zookeeper stop --data-dir /var/tmp/raylog-zk
    export RAYLOG_TOKEN=$(raylog token)   # on a cluster node, for a process outside Ray

Which cluster a command talks to: ``--zookeeper`` (the cluster's ZooKeeper)
is enough for every command but ``topics create``, ``topics delete``,
``topics repair``, ``topics delete-records``, ``supervisor start`` and ``audit``, which call partition actors and so also join the Ray cluster
(``--ray-address``, default ``auto``: the cluster of this node, or
``RAY_ADDRESS``). Without ``--zookeeper`` and ``--ray-address``, ``topics
create`` and ``topics list`` run on the embedded default of
:func:`raylog.connect` — a local Ray and a ZooKeeper that live only while
the command runs — ``bench`` starts a local autoscaling cluster of its own
for the run, and the other cluster commands refuse to run.

Output: a command's result (a listing, a table, the line that says what
was done, a token) goes to stdout; notes, hints, progress and errors go to
stderr. ``--json`` on the list and describe commands prints the result as
one JSON document instead of text.

Exit codes: 0 done; 1 a raylog error, printed as one line ``error:
<message>`` on stderr (``audit``: also a window that fell short; ``topics
repair``: a partition still not served); 2 bad usage or a bad setting, also
one line ``error: <message> (see 'raylog ... --help')``; 130 interrupted
(Ctrl-C); ``consume``: 143 after SIGTERM (it commits first, as after
Ctrl-C).
"""

from __future__ import annotations

import subprocess
import sys

import click

from raylog.errors import ConfigError, RaylogError
from raylog.tools.cli import audit, bench, groups, mirror, nodes, pool, streams, tls, token, topics, zookeeper  # noqa: F401 - registers the commands
from raylog.tools.cli.base import echo_error, cli

__all__ = ["cli", "main", "run"]


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.pass_context
def faults(ctx):
    """Run the fault checker: producers and a consumer group under seeded
    faults, then Jepsen-style checks of the whole history (raylog faults
    --help for its options: --duration, --seed, --faults, --out ...).
    Starts its own ZooKeeper and Ray cluster; exit code 1 on an anomaly."""
    # The checker runs in a process of its own (raylog.testing.runner is not
    # part of the public API the CLI builds on), with this one's stdin,
    # stdout and stderr; Ctrl-C reaches both.
    ctx.exit(subprocess.call([sys.executable, "-m", "raylog.testing.runner", *ctx.args]))


def run(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv``; return the exit code."""
    try:
        result = cli.main(args=argv, prog_name="raylog", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        return 130
    except click.exceptions.NoArgsIsHelpError as err:
        err.show()  # a command group alone: its help (on stderr, exit 2), not an error line
        return err.exit_code
    except click.UsageError as err:
        _fail_usage(err)
        return 2
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except ConfigError as err:
        echo_error(err)
        return 2
    except RaylogError as err:
        echo_error(err)
        return 1
    return result if isinstance(result, int) else 0


def _fail_usage(err: click.UsageError) -> None:
    """A usage error as one line: what is wrong, then where the help is."""
    message = " ".join(err.format_message().split())
    path = err.ctx.command_path if err.ctx is not None else "raylog"
    click.echo(f"error: {message} (see '{path} --help')", err=True)


def main() -> None:
    """The ``raylog`` console script."""
    sys.exit(run())


if __name__ == "__main__":
    main()
