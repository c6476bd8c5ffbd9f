"""The Spark integration tests share the session's local Ray (``ray_local``
in the root conftest); Spark sessions are started by the modules
themselves, one per module, and stopped at its end."""

from __future__ import annotations
