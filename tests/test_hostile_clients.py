"""Strangers at every door: one module, every listener and every server.

Each test is one row of the attack list below, tried as an attacker would
try it, against real sockets, a real ZooKeeper and a real Ray cluster (the
module's ``raylog_client``, an embedded cluster with a data directory of its
own). A door added later gets its rows here, so that every door is held to
the same locks.

The attack list (door: what a stranger tries → what it gets):

* data channel: no AUTH, plaintext AUTH, a 4 GiB frame before AUTH, replayed
  proofs, 300 idle strangers, a HELLO every few seconds to stay past the
  authentication deadline → refused, shed or closed; nothing allocated of a
  claimed size.
* Kafka listener: idle connections that never authenticate, large frames
  before SASL, a compressed Produce that inflates past the partition's bound
  → deadline from accept, small frames before SASL, strangers shed first at
  the limit, a per-address bound, decompression bounded as it runs.
* ZooKeeper: writes without the token anywhere (the root included), large
  znodes, many connections, four-letter words, a squatted cluster path, a
  killed server → refused or bounded; a squatted path reported as such; the
  client that launched it restarts it or says so once.
* At rest: data directories and files, the token and the Ray token file →
  readable by their owner only.
"""

from __future__ import annotations

# -- data channel -----------------------------------------------------------------


# -- Kafka listener ---------------------------------------------------------------


# -- ZooKeeper --------------------------------------------------------------------


# -- at rest and edges ------------------------------------------------------------

import json as _json
import os as _os
import stat as _stat
import subprocess as _subprocess
import sys as _sys
import textwrap as _textwrap
import uuid as _uuid


def _loose_modes(top: str) -> list[str]:
    """Every directory not 0700 and every file not 0600 below ``top`` (itself included)."""
    loose = []
    for root, dirs, files in _os.walk(top):
        for name, want in [(root, 0o700)] + [(_os.path.join(root, f), 0o600) for f in files]:
            st = _os.lstat(name)
            if _stat.S_ISLNK(st.st_mode):
                continue
            if _stat.S_IMODE(st.st_mode) != want:
                loose.append(f"{name} {_stat.S_IMODE(st.st_mode):04o}")
    return loose


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in _os.environ.items() if not k.startswith("RAYLOG_") and k != "RAY_ADDRESS"}
    env.update(extra)
    return env


def test_at_rest_a_new_data_dir_is_its_owners_only(raylog_client):
    topic = f"rest-{_uuid.uuid4().hex[:10]}"
    raylog_client.create_topic(topic, partitions=2, flush_ms=10)
    producer = raylog_client.producer(acks="all")
    for i in range(40):
        producer.send(topic, b"m-%d" % i, partition=i % 2)
    producer.close()
    data_dir = raylog_client.data_dir
    partition_dirs = [_os.path.join(data_dir, raylog_client.settings.cluster, f"{topic}-{p}") for p in range(2)]
    assert all(_os.listdir(d) for d in partition_dirs)
    for d in partition_dirs:
        assert _loose_modes(d) == []
    assert _loose_modes(_os.path.join(data_dir, raylog_client.settings.cluster)) == []
    # and nothing was lost for it
    assert sum(raylog_client.end_offsets(topic).values()) > 0
    consumer = raylog_client.consumer(topic, auto_offset_reset="earliest")
    got = []
    for _ in range(100):
        got += [m.value for m in consumer.poll(timeout_ms=200)]
        if len(got) >= 40:
            break
    consumer.close()
    assert sorted(got) == sorted(b"m-%d" % i for i in range(40))


KEEP_WRITE = _textwrap.dedent('''
    import sys
    import raylog
    client = raylog.connect(data_dir=sys.argv[1])
    client.create_topic("kept", partitions=2, flush_ms=10)
    producer = client.producer(acks="all")
    for i in range(30):
        producer.send("kept", b"k-%d" % i, partition=i % 2)
    producer.close()
    client.close()
''')

KEEP_READ = _textwrap.dedent('''
    import json, sys, time
    import raylog
    client = raylog.connect(data_dir=sys.argv[1])
    ends = client.end_offsets("kept")
    consumer = client.consumer("kept", auto_offset_reset="earliest")
    got, deadline = [], time.monotonic() + 120
    while any((consumer.position("kept", p) or 0) < end for p, end in ends.items()):
        assert time.monotonic() < deadline, "could not read to the end"
        got += [m.value.decode() for m in consumer.poll(timeout_ms=200)]
    consumer.close()
    client.close()
    print("RESULT " + json.dumps(got), flush=True)
''')


def test_at_rest_a_kept_data_dir_with_loose_modes_is_tightened_on_open(tmp_path):
    data_dir = str(tmp_path / "kept")
    first = _subprocess.run([_sys.executable, "-c", KEEP_WRITE, data_dir], capture_output=True, text=True,
                            env=_clean_env(), timeout=400)
    assert first.returncode == 0, first.stderr[-3000:]
    # a new embedded data dir is its owner's only, ZooKeeper's data in it included
    assert _loose_modes(data_dir) == []
    # as an older raylog (or a umask of 022) left it
    for root, dirs, files in _os.walk(data_dir):
        _os.chmod(root, 0o755)
        for name in files:
            if not _os.path.islink(_os.path.join(root, name)):
                _os.chmod(_os.path.join(root, name), 0o644)
    assert _loose_modes(data_dir)
    second = _subprocess.run([_sys.executable, "-c", KEEP_READ, data_dir], capture_output=True, text=True,
                             env=_clean_env(), timeout=400)
    assert second.returncode == 0, second.stderr[-3000:]
    result = [line for line in second.stdout.splitlines() if line.startswith("RESULT ")]
    assert sorted(_json.loads(result[0][len("RESULT "):])) == sorted(f"k-{i}" for i in range(30))
    # tightened, and said so once for the data directory
    assert _loose_modes(data_dir) == []
    said = [line for line in second.stderr.splitlines()
            if "readable by others" in line and f"the data directory {_os.path.abspath(data_dir)} " in line]
    assert len(said) == 1, second.stderr[-3000:]


TOKEN_READ = _textwrap.dedent('''
    import logging
    logging.basicConfig(level=logging.WARNING)
    from raylog import auth
    print("TOKEN", auth.cluster_token("c1").decode(), flush=True)
    print("TOKEN", auth.cluster_token("c1").decode(), flush=True)
''')


def test_at_rest_rays_token_file_is_made_its_owners_only_where_raylog_reads_it(tmp_path):
    from raylog import auth

    path = tmp_path / "auth_token"
    path.write_text("ab" * 32 + "\n")
    _os.chmod(path, 0o644)
    run = _subprocess.run([_sys.executable, "-c", TOKEN_READ], capture_output=True, text=True, timeout=120,
                          env=_clean_env(RAY_AUTH_TOKEN_PATH=str(path)))
    assert run.returncode == 0, run.stderr[-3000:]
    assert _stat.S_IMODE(_os.stat(path).st_mode) == 0o600
    # the token is the one derived from the file, which is intact
    tokens = [line.split()[1] for line in run.stdout.splitlines() if line.startswith("TOKEN ")]
    assert tokens == [auth.derive(("ab" * 32).encode(), "c1").decode()] * 2
    assert path.read_text() == "ab" * 32 + "\n"
    assert sum("readable by others" in line for line in run.stderr.splitlines()) == 1, run.stderr


def test_at_rest_the_default_data_dir_is_in_the_users_own_space(tmp_path):
    run = _subprocess.run([_sys.executable, "-c", "from raylog.client import DEFAULT_DATA_DIR as d; print(d)"],
                          capture_output=True, text=True, timeout=60,
                          env=_clean_env(HOME=str(tmp_path), XDG_DATA_HOME=""))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == _os.path.join(str(tmp_path), ".local", "share", "raylog")
    run = _subprocess.run([_sys.executable, "-c", "from raylog.client import DEFAULT_DATA_DIR as d; print(d)"],
                          capture_output=True, text=True, timeout=60,
                          env=_clean_env(XDG_DATA_HOME=str(tmp_path / "xdg")))
    assert run.stdout.strip() == str(tmp_path / "xdg" / "raylog")
