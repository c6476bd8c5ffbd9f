"""Finding the JDK's tools (``java`` for ZooKeeper and Spark, ``javac`` for
the Spark reader): ``$JAVA_HOME/bin/<tool>`` when it is there, else the
tool on ``PATH``. Callers raise their own error, which says what the tool
is needed for."""

from __future__ import annotations

import os
import shutil


def jdk_tool(name: str) -> str | None:
    """The path of the JDK tool ``name`` (``"java"``, ``"javac"``), or None."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", name)
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)
