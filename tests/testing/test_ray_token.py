"""Ray's token is made once, before any test cluster starts, as a local
``ray.init()`` would make it (raylog.testing.ray_token)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from raylog.testing.ray_token import ensure_ray_token

KEYS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def test_a_missing_token_is_made_once_and_then_kept(home):
    path = ensure_ray_token()
    assert path == str(home / ".ray" / "auth_token")
    token = open(path).read()
    assert len(token) == 64 and int(token, 16) >= 0
    assert ensure_ray_token() == path and open(path).read() == token
    assert os.listdir(home / ".ray") == ["auth_token"]  # no temporary file left


@pytest.mark.parametrize("key", KEYS)
def test_a_decided_environment_is_left_alone(home, monkeypatch, key):
    monkeypatch.setenv(key, "disabled" if key == "RAY_AUTH_MODE" else "x")
    assert ensure_ray_token() is None
    assert not (home / ".ray").exists()


def test_a_token_made_by_another_process_meanwhile_is_kept(home, monkeypatch):
    """Another process makes the file between this one's look and its write:
    the first file made is the one both keep."""
    path = home / ".ray" / "auth_token"
    path.parent.mkdir()
    path.write_text("theirs")
    looked = []
    real_exists = os.path.exists

    def exists_not_yet(p):  # this process looked before the other one wrote
        if p == str(path) and not looked:
            looked.append(p)
            return False
        return real_exists(p)

    monkeypatch.setattr(os.path, "exists", exists_not_yet)
    assert ensure_ray_token() == str(path) and looked
    assert path.read_text() == "theirs"
    assert os.listdir(path.parent) == ["auth_token"]


def test_processes_making_it_at_once_all_keep_one(home):
    code = "from raylog.testing.ray_token import ensure_ray_token; print(open(ensure_ray_token()).read())"
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(4)]
    seen = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert seen == {(home / ".ray" / "auth_token").read_text()}


def test_the_test_run_made_it_before_any_cluster():
    """tests/conftest.py makes it at configure time, in every process of the run."""
    if any(os.environ.get(k) for k in KEYS):
        pytest.skip("the environment decides Ray's token mode")
    assert os.path.exists(os.path.expanduser("~/.ray/auth_token"))
