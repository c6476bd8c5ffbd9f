"""The TLS files and settings of the Kafka listener (:mod:`raylog.kafka.tls`),
without a cluster: what ``raylog tls init`` writes (a CA, and a server
certificate with the names asked for, that the CA verifies), what it refuses
(a bad name, files there already: nothing written), settings whose files
cannot be used (refused by ``raylog.connect`` before anything starts), and
the CA file ``kafka_config()`` names."""

from __future__ import annotations

import os
import socket
import ssl
import threading

import pytest

import raylog
from raylog.errors import ConfigError
from raylog.kafka import tls


def _handshake(settings: tls.TlsSettings, cafile: str, server_hostname: str) -> str:
    """A TLS handshake with a server of ``settings`` on 127.0.0.1, the client
    trusting ``cafile`` and naming ``server_hostname``; its TLS version."""
    server = socket.create_server(("127.0.0.1", 0))
    context = tls.server_context(settings)
    failures = []

    def serve():
        conn, _ = server.accept()
        try:
            with context.wrap_socket(conn, server_side=True):
                pass
        except (ssl.SSLError, OSError) as err:
            failures.append(err)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        client = ssl.create_default_context(cafile=cafile)
        with socket.create_connection(server.getsockname(), timeout=10) as raw, \
                client.wrap_socket(raw, server_hostname=server_hostname) as conn:
            return conn.version()
    finally:
        thread.join(10)
        server.close()


def _encrypted(key_path) -> bytes:
    """The PEM key at ``key_path`` encrypted with a password."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(open(key_path, "rb").read(), password=None)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.BestAvailableEncryption(b"secret"))


def test_init_makes_a_ca_and_a_certificate_it_verifies_under_every_name(tmp_path):
    settings = raylog.TlsSettings.make(tmp_path / "certs", hosts=["10.1.2.3", "node-1.example"], days=30)
    assert settings == raylog.TlsSettings.in_dir(tmp_path / "certs")
    for name in ("127.0.0.1", "localhost", "node-1.example"):
        assert _handshake(settings, settings.ca, name) in ("TLSv1.2", "TLSv1.3")
    with pytest.raises(ssl.SSLCertVerificationError):  # another name
        _handshake(settings, settings.ca, "node-2.example")
    other = raylog.TlsSettings.make(tmp_path / "other")
    with pytest.raises(ssl.SSLCertVerificationError):  # another CA
        _handshake(settings, other.ca, "127.0.0.1")
    modes = {name: os.stat(tmp_path / "certs" / name).st_mode & 0o777 for name in os.listdir(tmp_path / "certs")}
    assert modes["ca.key"] == modes["server.key"] == 0o600


@pytest.mark.parametrize("hosts, days", [(["bad host!"], 30), ([""], 30), ([], 0), ([], "30")])
def test_a_bad_name_or_term_writes_nothing(tmp_path, hosts, days):
    with pytest.raises(ConfigError):
        tls.make_files(tmp_path / "certs", hosts, days)
    assert not (tmp_path / "certs").exists()


def test_files_there_already_are_left_as_they_are(tmp_path):
    (tmp_path / "server.key").write_bytes(b"the key in use")
    with pytest.raises(ConfigError, match="exist already; nothing was written"):
        tls.make_files(tmp_path)
    assert os.listdir(tmp_path) == ["server.key"] and (tmp_path / "server.key").read_bytes() == b"the key in use"


def test_settings_whose_files_cannot_be_used_are_refused_before_anything_starts(tmp_path):
    made = raylog.TlsSettings.make(tmp_path / "certs")
    with pytest.raises(ConfigError, match="cannot be used"):
        tls.checked_tls(raylog.TlsSettings(made.cert, made.ca), "tls")  # a certificate as the key
    with pytest.raises(ConfigError, match="cannot be read as PEM"):
        tls.checked_tls(raylog.TlsSettings(made.cert, made.key, ca=made.key), "tls")
    with pytest.raises(ConfigError, match="must be a path"):
        raylog.TlsSettings("", made.key)
    encrypted = tmp_path / "encrypted.key"  # no terminal prompt for its password: refused, saying why
    encrypted.write_bytes(_encrypted(made.key))
    with pytest.raises(ConfigError, match="is encrypted"):
        tls.checked_tls(raylog.TlsSettings(made.cert, encrypted), "tls")
    assert tls.checked_tls(None, "tls") is None and tls.checked_tls(made, "tls") is made
    # raylog.connect checks them first: no ZooKeeper, no Ray is started for settings that cannot work
    with pytest.raises(ConfigError, match="kafka_tls must be a raylog.TlsSettings"):
        raylog.connect(kafka_tls=str(tmp_path / "certs"))
    with pytest.raises(ConfigError, match="cannot be used"):
        raylog.connect(kafka_tls=raylog.TlsSettings(tmp_path / "missing.pem", made.key))


def test_the_ca_file_a_client_is_given_holds_the_registered_certificate(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    pem = tls.ca_pem(raylog.TlsSettings.make(tmp_path / "certs"))
    path = tls.ca_file(pem)
    assert path.startswith(str(tmp_path / "cache" / "raylog")) and open(path).read() == pem
    assert tls.ca_file(pem) == path  # named by its content: written once
    with open(path, "w") as file:  # a damaged copy is written again
        file.write("damaged")
    assert tls.ca_file(pem) == path and open(path).read() == pem
