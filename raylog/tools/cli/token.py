"""``raylog token``: print the cluster's data token, for a process outside Ray
that must pass it (``raylog.connect(token=...)``, ``RAYLOG_TOKEN``)."""

from __future__ import annotations

import logging

import click

from raylog import auth
from raylog.errors import RaylogError
from raylog.ray_join import check_ray_reachable, present_ray_token
from raylog.tools.cli.base import Target, pass_target, cli, ray_error

_WARNING = (
    "warning: this is the secret of raylog cluster {cluster!r}: whoever holds it can read, write and delete "
    "its topics; keep it out of logs and shell history (hand it over as RAYLOG_TOKEN, not on a command line)"
)


@cli.command()
@pass_target
def token(target: Target):
    """Print the cluster's data token on stdout (a warning on stderr), for
    a process outside Ray that has to pass it: RAYLOG_TOKEN=... raylog ...,
    or raylog.connect(token=...).

    The token is derived as every part of the cluster derives it (see
    raylog.auth): from Ray's auth token when this process has it
    (~/.ray/auth_token, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH), without
    joining anything; otherwise this joins the Ray cluster (--ray-address,
    default auto) and reads it there. Run it on a node of the cluster."""
    value = auth.cluster_token(target.cluster)
    if value is None:
        value = _token_from_ray(target)
    click.echo(_WARNING.format(cluster=target.cluster), err=True)
    click.echo(value.decode())


def _token_from_ray(target: Target) -> bytes:
    """Join the Ray cluster as a driver, derive the token there, leave."""
    import ray  # heavy (Ray): imported when used

    address = target.ray_address or "auto"
    present_ray_token()
    check_ray_reachable(address)
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except Exception as err:  # noqa: BLE001 - Ray's own errors on joining, as one line
        raise ray_error(err, address, f"could not join the Ray cluster at {address!r} to read the token",
                        "run this on a node of the cluster, or pass --ray-address HOST:PORT of its head") from None
    try:
        value = auth.cluster_token(target.cluster)
    finally:
        ray.shutdown()
    if value is None:
        raise RaylogError(f"the token of cluster {target.cluster!r} could not be derived in the Ray cluster")
    return value
