"""The code blocks of the README and of the docs/ pages, and how tests run them.

Every fenced block of ``README.md`` and of ``docs/**/*.md`` is a
:class:`CodeBlock`, known by its page, the heading above it and its place
under that heading; :func:`block` gives a test the code of one, read from the
page each run, so the page as it stands is what runs. :func:`run_example`
runs a script in a fresh interpreter and checks that every process it
started is gone after it exits (the embedded default starts a Ray and a
ZooKeeper of its own). ``tests/test_docs_site.py`` holds the list of every
block and which test runs it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import time
import uuid

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"
#: a bound on one example on a loaded machine; a hang is the failure
EXAMPLE_TIMEOUT_S = 600
#: a line Ray forwards from its own processes to the driver's stdout ("(raylet) WARNING: ...",
#: coloured or not): not an example's output
RAY_LOG_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?\(")


def printed_lines(out: str) -> list[str]:
    """The lines an example printed in ``out`` (captured stdout), without Ray's forwarded ones."""
    return [line for line in out.splitlines() if not RAY_LOG_LINE.match(line)]
#: the variables that point a process at a cluster: examples run without them
OUR_VARS = ("RAYLOG_ZOOKEEPER", "RAYLOG_RAY_ADDRESS", "RAYLOG_CLUSTER", "RAYLOG_TOKEN", "RAY_ADDRESS",
            "RAYLOG_LOG_LEVEL", "RAYLOG_DATA_DIR")

_FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<language>[\w-]*)[ ]*$")
_HEADING = re.compile(r"^#{1,6} (?P<title>.+?)\s*$")


@dataclasses.dataclass(frozen=True)
class CodeBlock:
    """One fenced code block of a page."""

    page: str      #: the page, relative to the repository: "README.md", "docs/howto/spark.md"
    heading: str   #: the title of the nearest heading above it (without the #s)
    index: int     #: its place among the blocks under that heading, from 0
    language: str  #: the fence's language tag ("" for none)
    code: str      #: its text, the fence's indentation removed
    line: int      #: the line of its opening fence, from 1

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.page, self.heading, self.index)


def pages() -> list[pathlib.Path]:
    """The README and every Markdown page of docs/ (docs/hooks holds code, not pages)."""
    found = [README] + sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)
    return found


def blocks_of(path: pathlib.Path) -> list[CodeBlock]:
    """Every fenced block of the page at ``path``, in order."""
    page = str(path.relative_to(REPO))
    lines = path.read_text().splitlines()
    out: list[CodeBlock] = []
    heading, counts = "", {}
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            title = _HEADING.match(lines[i])
            if title:
                heading = title.group("title")
            i += 1
            continue
        indent, start = len(fence.group("indent")), i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page}:{start + 1}: a code block that is never closed")
        index = counts.get(heading, 0)
        counts[heading] = index + 1
        out.append(CodeBlock(page, heading, index, fence.group("language"), "\n".join(body) + "\n", start + 1))
        i += 1
    return out


def all_blocks() -> list[CodeBlock]:
    return [b for path in pages() for b in blocks_of(path)]


def block(page: str, heading: str, language: str = "python", index: int = 0) -> str:
    """The code of block ``index`` under ``heading`` of ``page`` (e.g.
    ``block("docs/howto/spark.md", "Spark and Ray Data")``); asserts that it
    exists and has the ``language`` tag."""
    for found in blocks_of(REPO / page):
        if found.key == (page, heading, index):
            assert found.language == language, f"{page}: the block under {heading!r} is {found.language!r}"
            return found.code
    raise AssertionError(f"{page} has no block {index} under the heading {heading!r}")


def marked_processes(marker: str) -> list[int]:
    """PIDs of live processes whose environment holds ``marker``."""
    found = []
    needle = f"RAYLOG_TEST_MARKER={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def clean_env(**extra) -> dict:
    """This process's environment without the variables that name a cluster."""
    environment = {k: v for k, v in os.environ.items() if k not in OUR_VARS}
    environment.update(extra)
    return environment


def run_example(code: str, tmp_path, *, env: dict | None = None, command: list[str] | None = None,
                timeout_s: float = EXAMPLE_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``code`` as a script in a fresh interpreter (or, with ``command``,
    e.g. ``["bash", "-eo", "pipefail"]``, by that program) in ``tmp_path``,
    without the variables that name a cluster unless ``env`` sets them; assert
    that every process it started is gone within a few seconds of its exit."""
    script = tmp_path / "example"
    script.write_text(code)
    marker = uuid.uuid4().hex
    environment = clean_env(**(env or {}))
    environment["RAYLOG_TEST_MARKER"] = marker
    try:
        proc = subprocess.run(
            [*(command or [sys.executable]), str(script)],
            capture_output=True,
            text=True,
            env=environment,
            cwd=str(tmp_path),
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    finally:
        deadline = time.monotonic() + 30
        left = marked_processes(marker)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = marked_processes(marker)
        for pid in left:  # do not leave them to the other engineers' runs
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    assert not left, f"processes left running after the example exited: {left}"
    return proc
