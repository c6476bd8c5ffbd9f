"""What every command shares: the cluster a command talks to (:class:`Target`),
error reporting, tables, and the ``raylog`` click group with its global options
(the command families are listed in :mod:`raylog.tools.cli`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import os

import click

import raylog
from raylog import quiet
from raylog.client import Client, default_data_dir
from raylog.errors import RaylogError

#: where ``zookeeper start`` and ``zookeeper stop`` keep a local ZooKeeper's data:
#: in the user's own space beside the default data dir, not the shared /tmp
DEFAULT_ZOOKEEPER_DIR = os.path.join(default_data_dir(), "zookeeper")
ZOOKEEPER_PID_FILE = "raylog-zookeeper.pid"
ZOOKEEPER_LOG_FILE = "raylog-zookeeper.log"
#: how long ``consume`` in a group waits for its first assignment before the
#: idle clock of ``--timeout-ms`` starts anyway
ASSIGNMENT_WAIT_S = 60.0
#: how often ``consume`` in a group commits what it has written out (its
#: ``--auto-commit-interval-ms``, as the consumer's ``auto_commit_interval_ms``)
COMMIT_INTERVAL_MS = 5000

_EMBEDDED_NOTE = (
    "note: no --zookeeper given: this runs on an embedded cluster (a local Ray and a "
    "ZooKeeper of its own) that is gone when the command ends"
)


class CommandError(click.ClickException):
    """A failure of a command that is not a raylog error (exit code 1)."""
    exit_code = 1

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def echo_error(err: BaseException) -> None:
    click.echo(f"error: {err}", err=True)


# --------------------------------------------------------------------------
# which cluster


class Target:
    """The cluster the global options name; makes the command's client."""
    def __init__(self, zookeeper: str | None, ray_address: str | None, cluster: str, token: str | None):
        self.zookeeper = zookeeper or None
        self.ray_address = ray_address or None
        self.cluster = cluster
        self.token = token.encode() if token else None

    @property
    def embedded(self) -> bool:
        return self.zookeeper is None and self.ray_address is None

    @contextlib.contextmanager
    def client(self, command: str, *, ray: bool = False, embedded_ok: bool = False, data_dir: str | None = None):
        """A :class:`raylog.Client` for ``command``, closed afterwards.

        ``ray``: the command starts or stops partition actors, so it joins
        the Ray cluster; otherwise ZooKeeper and the data sockets suffice.
        ``embedded_ok``: without any address, run on the embedded default.
        """
        if self.embedded:
            if not embedded_ok:
                raise click.UsageError(
                    f"'{command}' needs an existing raylog cluster: pass --zookeeper HOST:PORT "
                    f"(or set RAYLOG_ZOOKEEPER) with the address of the cluster's ZooKeeper"
                )

            click.echo(_EMBEDDED_NOTE, err=True)
            client = raylog.connect(data_dir=data_dir, cluster=self.cluster, token=self.token)
        elif self.zookeeper is None:
            raise click.UsageError(
                "--ray-address needs --zookeeper HOST:PORT too (or RAYLOG_ZOOKEEPER): the address "
                "of the cluster's ZooKeeper, which holds its topics and consumer groups"
            )
        elif ray:
            client = self._join_ray(data_dir)
        else:
            client = Client(zookeeper=self.zookeeper, cluster=self.cluster, token=self.token)
        try:
            yield client
        finally:
            client.close()

    def _join_ray(self, data_dir: str | None):
        address = self.ray_address or "auto"
        try:
            # joined here rather than by connect(): a command prints its own
            # output alone, without the lines Ray forwards from the cluster's
            # processes ("(raylet) ...") to a driver
            import logging

            import ray  # heavy (Ray): imported when used

            from raylog.ray_join import check_ray_reachable, present_ray_token

            if not ray.is_initialized():
                present_ray_token()
                check_ray_reachable(address)
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            return raylog.connect(
                zookeeper=self.zookeeper,
                ray_address=address,
                data_dir=data_dir,
                cluster=self.cluster,
                token=self.token,
            )
        except RaylogError:
            raise
        except Exception as err:  # noqa: BLE001 - Ray's own errors on joining
            raise ray_error(
                err, address,
                f"could not join the Ray cluster at {address!r}",
                "pass --ray-address HOST:PORT of the cluster's head (or set RAYLOG_RAY_ADDRESS), "
                "or run this on a node of the cluster",
            ) from None


def ray_error(err: BaseException, address: str | None, what: str, advice: str | None = None,
              *, last_line: bool = False) -> "CommandError":
    """One line for an error of Ray's own: a refused token says how to
    present it; anything else is ``what`` with the error's first (or last)
    line and ``advice``."""
    if _refused_token(err):
        return CommandError(
            f"the Ray cluster at {address!r} refused this process: it requires token "
            f"authentication; export RAY_AUTH_MODE=token, with the cluster's token in "
            f"~/.ray/auth_token (or RAY_AUTH_TOKEN_PATH, RAY_AUTH_TOKEN)"
        )
    lines = str(err).strip().splitlines()
    detail = (lines[-1] if last_line else lines[0]) if lines else "no details"
    return CommandError(f"{what} ({type(err).__name__}: {detail})" + (f"; {advice}" if advice else ""))


def echo_names(names: list[str], as_json: bool) -> None:
    """A list of names: one per line, or (``--json``) one JSON list."""
    if as_json:
        echo_json(names)
        return
    for name in names:
        click.echo(name)


def _refused_token(err: BaseException | None) -> bool:
    """Whether Ray refused to join for want of its authentication token."""
    seen = 0
    while err is not None and seen < 10:
        if type(err).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(err):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


pass_target = click.make_pass_decorator(Target)


def format_table(headers: list[str], rows: list[list]) -> str:
    """Plain columns aligned with two spaces; None shows as '-'."""
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    lines = [headers] + cells
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


#: the ``--json`` option of the list, describe and status commands
json_option = click.option(
    "--json", "as_json", is_flag=True,
    help="Print the result as one JSON document (for scripts) instead of text.",
)


def echo_json(value) -> None:
    """``value`` as indented JSON on stdout (dataclasses as objects)."""
    def default(obj):
        if dataclasses.is_dataclass(obj):
            return dataclasses.asdict(obj)
        if isinstance(obj, (bytes, bytearray)):
            return obj.decode(errors="replace")
        if isinstance(obj, (set, frozenset, tuple)):
            return list(obj)
        return str(obj)

    click.echo(json.dumps(value, indent=2, default=default))


# --------------------------------------------------------------------------
# the root


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--zookeeper",
    metavar="HOST:PORT",
    envvar="RAYLOG_ZOOKEEPER",
    show_envvar=True,
    help="The cluster's ZooKeeper (its topics, partition endpoints and consumer groups).",
)
@click.option(
    "--ray-address",
    metavar="ADDR",
    envvar="RAYLOG_RAY_ADDRESS",
    show_envvar=True,
    help="The Ray cluster, for 'topics create', 'topics delete', 'topics repair', 'topics reassign', 'supervisor "
    "start' and 'audit' (they call partition actors) and 'bench': HOST:PORT of its head, or 'auto' (the default: the "
    "cluster this node belongs to, or RAY_ADDRESS).",
)
@click.option(
    "--cluster",
    default="default",
    show_default=True,
    envvar="RAYLOG_CLUSTER",
    show_envvar=True,
    help="The raylog cluster name: its root in ZooKeeper is /raylog/<cluster>.",
)
@click.option(
    "--token",
    envvar="RAYLOG_TOKEN",
    show_envvar=True,
    help="The cluster's data token. Every data port requires it; on a node of the Ray cluster it is "
    "derived (from Ray's auth token, or read from Ray's key-value store), so pass it only from "
    "outside Ray (prefer the environment variable: command lines are visible to other users).",
)
@click.version_option(package_name="raylog", prog_name="raylog")
@click.pass_context
def cli(ctx, zookeeper, ray_address, cluster, token):
    """Manage and use a raylog cluster: topics, console producer and consumer,
    consumer groups, the audit check, the autoscaled benchmark, and a local
    ZooKeeper.

    Point the commands at a cluster with --zookeeper HOST:PORT (and, for
    'topics create', 'topics delete', 'topics repair', 'topics reassign',
    'supervisor start' and 'audit', --ray-address). Without
    either, 'topics create' and 'topics list' run on the embedded default: a
    local Ray and a ZooKeeper of their own that exist only while the command
    runs (good for a first try, nothing is kept); 'bench' starts a local
    autoscaling cluster for the run; the other cluster commands then stop
    and say what to pass.

    Exit codes: 0 done, 1 error (one line 'error: ...' on stderr), 2 bad
    usage or setting, 130 interrupted (Ctrl-C), 143 'consume' after SIGTERM.
    """

    quiet.configure()  # warnings only, no ZooKeeper retry chatter (RAYLOG_LOG_LEVEL to change)
    ctx.obj = Target(zookeeper, ray_address, cluster, token)
