"""The venvs of the stream-processor apps (``apps/<app>/``, one venv each in
``.venv-apps/<app>``, made by ``make venv-<app>``): a venv is used only when
made from the app's constraints as they are, and the Makefile's stamp check
agrees with the tests' (:func:`tests.kafka.stream_apps.venv_unavailable`).
One module for every app, so the rule is written once."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest

pytest.importorskip("confluent_kafka")

from tests.kafka.stream_apps import venv_unavailable  # noqa: E402 (needs confluent_kafka)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: app folder -> (what the skip message calls it, its make target, the Makefile's venv variable, the
#: target's words when it cannot make the venv)
APPS = {
    "quix": ("Quix Streams", "venv-quix", "QUIX_VENV", "the Quix tests will skip"),
    "faust": ("Faust", "venv-faust", "FAUST_VENV", "the Faust tests will skip"),
}


def constraints(app: str) -> str:
    return os.path.join(ROOT, "apps", app, "constraints.txt")


def stamp(venv, app: str, digest: str | None = None) -> None:
    if digest is None:
        with open(constraints(app), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    (venv / ".constraints-sha256").write_text(digest + "\n")


@pytest.mark.parametrize("app", sorted(APPS))
def test_an_app_venv_is_used_only_when_made_from_the_constraints_as_they_are(tmp_path, app):
    what, target, _, _ = APPS[app]
    venv = tmp_path / app

    def unavailable():
        return venv_unavailable(str(venv), constraints(app), what, target)

    assert f"is absent: `make {target}` makes it" in unavailable()
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    assert f"run `make {target}`" in unavailable()  # no stamp
    stamp(venv, app, "0" * 64)
    assert f"run `make {target}`" in unavailable()  # another file's
    stamp(venv, app)
    assert unavailable() is None


@pytest.mark.parametrize("app", sorted(APPS))
def test_make_keeps_an_app_venv_whose_stamp_is_the_constraints_hash(tmp_path, app):
    """The Makefile's stamp check and the tests' agree: a venv stamped with
    the sha256 of the constraints is kept as it is (nothing installed; with
    PYTHON=false any attempt to make it again would say so)."""
    _, target, variable, skip_words = APPS[app]
    venv = tmp_path / app
    venv.mkdir()
    stamp(venv, app)
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    command = [make, "-s", target, f"{variable}={venv}", "PYTHON=false"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout == "" and run.stderr == "", (run.stdout, run.stderr)
    stamp(venv, app, "0" * 64)  # stale: made again (and here it fails, said so)
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "setting up" in run.stdout and skip_words in run.stdout, run.stdout
    assert not venv.exists() or not (venv / ".constraints-sha256").exists()
