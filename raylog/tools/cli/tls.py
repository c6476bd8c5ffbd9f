"""``raylog tls init DIR``: a CA and the Kafka listeners' certificate and
key, for ``raylog.connect(kafka_tls=raylog.TlsSettings.in_dir(DIR))`` or
``client.start_kafka_listeners(tls=...)`` (the files:
:mod:`raylog.kafka.tls`)."""

from __future__ import annotations

import click

import raylog
from raylog.tools.cli.base import cli


@cli.group()
def tls():
    """TLS for the Kafka listeners: make the certificates they serve."""


@tls.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--host", "hosts", multiple=True, metavar="ADDRESS",
              help="a name clients reach a listener by (an IP address or a DNS name), besides 127.0.0.1 and "
                   "localhost; once per node address")
@click.option("--days", type=click.IntRange(min=1), default=825, show_default=True,
              help="how long the certificates are valid")
def init(directory: str, hosts: tuple[str, ...], days: int):
    """Make a CA (ca.pem, ca.key) and the Kafka listeners' certificate and
    key (server.pem, server.key; the keys readable by their owner only) in
    DIRECTORY, made if missing. The certificate names 127.0.0.1, localhost
    and every --host. Files of those names there already: nothing is
    written (exit code 2). Then: raylog.connect(kafka_tls=raylog.TlsSettings.in_dir(DIRECTORY)),
    and clients verify the listeners with ca.pem (client.kafka_config() names it)."""
    settings = raylog.TlsSettings.make(directory, hosts, days)
    for path in (settings.ca, settings.cert, settings.key):
        click.echo(path)
    click.echo(f"the CA's key is {directory.rstrip('/')}/ca.key: keep it to sign more certificates, or delete it",
               err=True)
