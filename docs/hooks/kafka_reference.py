"""MkDocs hook: what the Kafka front door serves, read from the code at build time.

The page ``howto/kafka.md`` holds two markers. ``<!-- kafka-apis -->`` is
replaced with a table of every API the listener serves and its versions
(:data:`raylog.kafka.frames.SUPPORTED`); ``<!-- kafka-limits -->`` with the
listener's bounds (:mod:`raylog.kafka.frames`, :mod:`raylog.kafka.listener`).
Nothing is pasted: a version added in the code shows up at the next build.
"""

from __future__ import annotations

PAGE = "howto/kafka.md"
APIS = "<!-- kafka-apis -->"
LIMITS = "<!-- kafka-limits -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    for marker in (APIS, LIMITS):
        if marker not in markdown:
            raise ValueError(f"{PAGE} has lost its marker {marker!r}")
    return markdown.replace(APIS, render_apis()).replace(LIMITS, render_limits())


def api_rows() -> list[tuple[str, int, int, int]]:
    """``(name, api key, lowest version, highest version)`` of every API served, by key."""
    from raylog.kafka.frames import SUPPORTED

    return [(request.__name__.removesuffix("Request"), key, low, high)
            for key, (request, low, high) in sorted(SUPPORTED.items())]


def render_apis() -> str:
    lines = ["| API | key | versions |", "|---|---|---|"]
    lines += [f"| {name} | {key} | {low}–{high} |" if low != high else f"| {name} | {key} | {low} |"
              for name, key, low, high in api_rows()]
    return "\n".join(lines) + "\n"


def render_limits() -> str:
    from raylog.kafka.frames import MAX_REQUEST_BYTES, PRE_AUTH_MAX_REQUEST_BYTES
    from raylog.kafka.connections import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_STRANGERS_PER_ADDRESS
    from raylog.kafka.admin import MAX_PARTITIONS as MAX_DELETE_RECORDS_PARTITIONS
    from raylog.kafka.admin import MAX_TOPICS
    from raylog.kafka.group_admin import MAX_GROUPS, MAX_PARTITIONS, MAX_STATES
    from raylog.kafka.listener import DEFAULT_AUTH_TIMEOUT_S, DEFAULT_MAX_WORKERS, FRAME_TIMEOUT_S

    rows = [
        ("largest request frame", f"{MAX_REQUEST_BYTES:,} bytes (`raylog.kafka.frames.MAX_REQUEST_BYTES`)"),
        ("largest request before SASL completes", f"{PRE_AUTH_MAX_REQUEST_BYTES:,} bytes "
                                                  "(`raylog.kafka.frames.PRE_AUTH_MAX_REQUEST_BYTES`)"),
        ("time to finish a frame from its first byte", f"{FRAME_TIMEOUT_S:g} s (`raylog.kafka.listener.FRAME_TIMEOUT_S`)"),
        ("time to complete SASL after connecting", f"{DEFAULT_AUTH_TIMEOUT_S:g} s "
                                                   "(`raylog.kafka.listener.DEFAULT_AUTH_TIMEOUT_S`)"),
        ("connections per listener", f"{DEFAULT_MAX_CONNECTIONS:,} (`raylog.kafka.connections.DEFAULT_MAX_CONNECTIONS`), "
                                     "at most the process's open files limit (raised to its hard limit at start) "
                                     "less a quarter of it (`raylog.kafka.listener.connection_limit`)"),
        ("worker threads per listener", f"{DEFAULT_MAX_WORKERS} (`raylog.kafka.listener.DEFAULT_MAX_WORKERS`): "
                                        "idle connections hold none"),
        ("connections not yet authenticated per client address",
         f"{DEFAULT_MAX_STRANGERS_PER_ADDRESS} (`raylog.kafka.connections.DEFAULT_MAX_STRANGERS_PER_ADDRESS`)"),
        ("groups one DescribeGroups or DeleteGroups names", f"{MAX_GROUPS:,} (`raylog.kafka.group_admin.MAX_GROUPS`)"),
        ("topics and partitions, together, one OffsetDelete names", f"{MAX_PARTITIONS:,} (`raylog.kafka.group_admin.MAX_PARTITIONS`)"),
        ("states one ListGroups filter names", f"{MAX_STATES} (`raylog.kafka.group_admin.MAX_STATES`)"),
        ("topics one CreatePartitions names", f"{MAX_TOPICS:,} (`raylog.kafka.admin.MAX_TOPICS`)"),
        ("partitions, over all its topics, one DeleteRecords names",
         f"{MAX_DELETE_RECORDS_PARTITIONS:,} (`raylog.kafka.admin.MAX_PARTITIONS`)"),
    ]
    return "\n".join(["| bound | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]) + "\n"
