"""The compiled fast path of the message format (everything else is in pyproject.toml).

``raylog.storage._speedups`` is optional: if it does not build (no compiler,
no Python headers), the install goes on and raylog runs the pure-Python
message code, which is the reference anyway.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "raylog.storage._speedups",
            sources=["raylog/storage/_speedups.c"],
            optional=True,
        )
    ]
)
