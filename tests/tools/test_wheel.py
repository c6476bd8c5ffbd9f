"""raylog as users install it: a wheel built from the sources
(``pip wheel --no-deps``), installed (not editable) into a fresh virtualenv,
used from a folder outside the checkout.

To keep it quick the virtualenv takes raylog's dependencies (Ray, kazoo,
pyspark ...) from the project's own virtualenv through a ``.pth`` line
naming that site-packages directory; a plain path line adds the directory
to ``sys.path`` without running the ``.pth`` files inside it, so the
project's editable install (its import finder) stays off, and raylog and
raylog_spark come from the wheel alone, which the tests check first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
import uuid

import pytest

from tests.doc_blocks import OUR_VARS as _OUR_VARS
from tests.doc_blocks import marked_processes as _marked_processes
from tests.test_readme_examples import _assert_first_example_output, readme_block

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(900)

#: what a copy of the sources leaves out (a build writes build/ beside them)
_NOT_SOURCES = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "jars", ".pytest_cache")

#: run in the installed virtualenv: where raylog comes from, and every module imported
IMPORT_ALL = textwrap.dedent('''
    import importlib, json, pkgutil, sys
    import raylog, raylog_spark
    modules, failed = [], {}
    for package in (raylog, raylog_spark):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue  # runs the command line when imported
            try:
                importlib.import_module(info.name)
                modules.append(info.name)
            except Exception as err:
                failed[info.name] = f"{type(err).__name__}: {err}"
    finders = [type(f).__module__ + "." + type(f).__name__ for f in sys.meta_path]
    print("RESULT " + json.dumps({
        "raylog": raylog.__file__, "raylog_spark": raylog_spark.__file__, "modules": modules,
        "failed": failed, "finders": finders, "path": sys.path,
    }))
''')


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh virtualenv with the wheel of the sources installed in it."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src" / "raylog"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*_NOT_SOURCES))
    dist = root / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(source)],
                          capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (wheel,) = dist.glob("raylog-*.whl")

    env_dir = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies: the project's site-packages, after the venv's own
    with open(os.path.join(site, "_project_dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return {"dir": str(env_dir), "python": str(python), "site": site}


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _OUR_VARS and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def test_every_module_of_raylog_and_raylog_spark_imports_from_the_wheel(venv, tmp_path):
    proc = subprocess.run([venv["python"], "-c", IMPORT_ALL], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(lines[-1][len("RESULT "):])
    # from the wheel, not from the checkout, and no editable finder at work
    assert result["raylog"].startswith(venv["site"] + os.sep), result["raylog"]
    assert result["raylog_spark"].startswith(venv["site"] + os.sep), result["raylog_spark"]
    assert not any("editable" in finder.lower() for finder in result["finders"]), result["finders"]
    venv_of_project = os.path.join(REPO, ".venv") + os.sep  # the dependencies, and nothing else of the checkout
    assert not any((p + os.sep).startswith(REPO + os.sep) and not (p + os.sep).startswith(venv_of_project)
                   for p in result["path"]), result["path"]
    assert result["failed"] == {}
    # every package of the sources is in the wheel (a package list once missed raylog.replication)
    on_disk = {
        ".".join(os.path.relpath(d, base).split(os.sep))
        for base, top in ((REPO, "raylog"), (os.path.join(REPO, "integrations", "spark"), "raylog_spark"))
        for d, _, files in os.walk(os.path.join(base, top)) if "__init__.py" in files
    }
    imported = set(result["modules"]) | {"raylog", "raylog_spark"}
    assert on_disk <= imported, sorted(on_disk - imported)
    assert {"raylog.replication", "raylog.tools.cli", "raylog_spark.reader"} <= imported
    # the compiled modules are optional in setup.py (a build without a compiler falls back to
    # Python); on a machine with one, the wheel holds every one of them
    compiled = {"raylog.storage._speedups", "raylog.producer._fastsend", "raylog.kafka._kafkarecords"}
    assert compiled <= imported, sorted(compiled - imported)


def test_the_readme_first_example_runs_from_the_wheel_outside_the_checkout(venv, tmp_path):
    script = tmp_path / "example.py"
    script.write_text("import raylog, sys\n"
                      "assert raylog.__file__.startswith(sys.prefix), raylog.__file__  # the wheel's\n"
                      + readme_block("## Using it"))
    marker = uuid.uuid4().hex
    try:
        proc = subprocess.run([venv["python"], str(script)], cwd=tmp_path, env=_env(RAYLOG_TEST_MARKER=marker),
                              capture_output=True, text=True, timeout=600)
    finally:
        deadline = time.monotonic() + 30  # its Ray and ZooKeeper stop with it
        left = _marked_processes(marker)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = _marked_processes(marker)
        for pid in left:  # a failed run leaves nothing to the other runs of the machine
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    assert not left, f"processes left running after the example exited: {left}"
    _assert_first_example_output(proc)  # three messages and an empty stderr


def test_the_console_script_of_the_wheel_runs(venv, tmp_path):
    proc = subprocess.run([os.path.join(venv["dir"], "bin", "raylog"), "--version"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("raylog, version "), proc.stderr
    assert proc.stderr == ""
