"""The fault run's report: a short table for people, JSON for machines, and a
PNG timeline (messages produced and consumed per second, faults marked).

The PNG needs matplotlib (the ``bench`` extra); :func:`timeline_png`
raises ``ImportError`` without it, and nothing else here needs it.
"""

from __future__ import annotations

import collections
import json

from raylog.testing.checker import ANOMALIES
from raylog.testing.history import OK


def table(report: dict) -> str:
    """The report as a few aligned lines."""
    if report.get("workload") == "compact":
        return compaction_table(report)
    if report.get("workload") == "txn":
        return txn_table(report)
    ops = report["operations"]
    lines = [
        f"verdict            {'VALID' if report['valid'] else 'INVALID: ' + ', '.join(sorted(report['forbidden']))}",
        f"sends              {ops['sends']}  " + "  ".join(f"{k} {v}" for k, v in ops["sends_by_outcome"].items()),
        f"polls              {ops['polls']}  reads {ops['reads']}  distinct values read {ops['distinct_values_read']}"
        f"  manual commits {ops['commits']}",
        "faults             " + ("  ".join(f"{k} {v}" for k, v in report["faults"].items()) or "none"),
    ]
    for name in ANOMALIES:
        n = report["counts"][name]
        extra = ""
        if name == "unseen" and report["unseen_by_acks"]:
            extra = "  (by acks: " + ", ".join(f"{k}: {v}" for k, v in report["unseen_by_acks"].items()) + ")"
        if name == "lost-write" and report.get("lost_by_acks"):
            extra = "  (by acks: " + ", ".join(f"{k}: {v}" for k, v in report["lost_by_acks"].items()) + ")"
        if name in ("unseen", "lost-write") and report.get("lossy_acks"):
            extra += f"  acks {', '.join(report['lossy_acks'])} allowed (replicated: a leader change drops them)"
        lines.append(f"{name:<21}{n}{extra}")
    dd = report["delivery_duplicates"]
    lines.append(f"delivery dups      {dd['values']} values, {dd['extra_deliveries']} extra deliveries (allowed)")
    flips = ", ".join(f"{k} {v}" for k, v in (report.get("flipped_bytes") or {}).items()) or "none"
    lines.append(f"flipped bytes      {flips}; acknowledged values destroyed {report['destroyed_by_faults']}")
    unread = report["longest_unread_s"]
    if unread["max"] is not None:
        lines.append(f"longest unread     {unread['max']:.1f} s ({unread['partition']})")
    held = report.get("longest_unacknowledged_s") or {}
    if held.get("max") is not None:
        lines.append(f"longest unacked    {held['max']:.1f} s ({held['producer']})")
    lat = report["latency_s"]
    if lat["max"] is not None:
        lines.append(f"send->read latency p50 {_seconds(lat['p50'])} s  p99 {_seconds(lat['p99'])} s  "
                     f"max {_seconds(lat['max'])} s")
    run = report.get("run") or {}
    diverted = run.get("ray_messages") or {}
    if diverted.get("lines"):
        lines.append(f"ray messages       {diverted['lines']} lines about the faults made, in {diverted['file']}")
    if run.get("nemesis_errors"):
        lines.append("faults not made   " + "; ".join(run["nemesis_errors"][:5]))
    if run.get("drained") and not run["drained"].get("complete"):
        lines.append("drain              INCOMPLETE: the group did not read every partition to its end")
    return "\n".join(lines)


def compaction_table(report: dict) -> str:
    """The compaction workload's report (:mod:`raylog.testing.compaction_checker`) as aligned lines."""
    ops, counts, keys = report["operations"], report["counts"], report["keys"]
    run = report.get("run") or {}
    cleaner = run.get("cleaner") or {}
    lines = [
        f"verdict            {'VALID' if report['valid'] else 'INVALID: ' + ', '.join(report['forbidden'])}",
        f"sends              {ops['sends']}  " + "  ".join(f"{k} {v}" for k, v in ops["sends_by_outcome"].items())
        + f"  (deletes {ops['deletes']}, acknowledged {ops['deletes_acknowledged']})",
        f"keys               {keys['acknowledged']} with an acknowledged write: latest a value {keys['latest_value']},"
        f" a delete {keys['latest_delete']} (kept {keys['delete_kept']}, gone after retention "
        f"{keys['delete_gone']}); a later unknown write last {keys['later_unknown_write']}",
        f"scans              {ops['partition_scans']} partition scans during the run; final read "
        f"{ops['final_reads']} records",
        f"cleaner passes     {cleaner.get('passes', 'not counted')}"
        + (f"  (partitions cleaned by their actor: {len(cleaner['partitions_cleaned_by_their_actor'])})"
           if cleaner else ""),
        "faults             " + ("  ".join(f"{k} {v}" for k, v in report["faults"].items()) or "none"),
        f"lost latest values {counts['lost-latest']}",
        f"resurrected keys   {counts['resurrected']}",
        f"offset anomalies   {counts['offset-anomaly']}",
        f"records back       {counts['record-back']}",
        f"unexpected records {counts['unexpected-record']}",
    ]
    if counts["final-incomplete"]:
        lines.append(f"final read         INCOMPLETE in {counts['final-incomplete']} partitions")
    diverted = run.get("ray_messages") or {}
    if diverted.get("lines"):
        lines.append(f"ray messages       {diverted['lines']} lines about the faults made, in {diverted['file']}")
    if run.get("nemesis_errors"):
        lines.append("faults not made   " + "; ".join(run["nemesis_errors"][:5]))
    return "\n".join(lines)


def txn_table(report: dict) -> str:
    """The transactional workload's report (:mod:`raylog.testing.txn_checker`) as aligned lines."""
    from raylog.testing.txn_checker import ANOMALIES as TXN_ANOMALIES

    ops, counts = report["operations"], report["counts"]
    run = report.get("run") or {}
    lines = [
        f"verdict            {'VALID' if report['valid'] else 'INVALID: ' + ', '.join(report['forbidden'])}",
        f"transactions       {ops['transactions']}  "
        + "  ".join(f"{k} {v}" for k, v in ops["transactions_by_outcome"].items())
        + f"  (with offsets {ops['with_offsets']}; dropped producers' commits refused "
        f"{ops['zombie_commits_refused']})",
        "unknown resolved   " + ("  ".join(f"{k} {v}" for k, v in ops["unknown_resolved"].items()) or "none"),
        f"sends              {ops['sends']}  acknowledged {ops['sends_acknowledged']}  committed values "
        f"{ops['committed_values']}",
        "reads              " + "  ".join(f"{k} {v}" for k, v in ops["reads_by_reader"].items())
        + f"  (final {ops['final_reads']}; offsets read {ops['offsets_reads']} times)",
        "faults             " + ("  ".join(f"{k} {v}" for k, v in report["faults"].items()) or "none"),
    ]
    for name in TXN_ANOMALIES:
        lines.append(f"{name:<21}{counts[name]}")
    lines.append(f"write cycles (G0 of concurrent transactions, allowed) {report['write_cycles_concurrent']}")
    diverted = run.get("ray_messages") or {}
    if diverted.get("lines"):
        lines.append(f"ray messages       {diverted['lines']} lines about the faults made, in {diverted['file']}")
    if run.get("nemesis_errors"):
        lines.append("faults not made   " + "; ".join(run["nemesis_errors"][:5]))
    return "\n".join(lines)


def _seconds(value: float) -> str:
    """A latency to the millisecond, never negative: the send and read
    times come from different processes' clocks, so a message read within a
    millisecond can measure a hair below zero (printed as ``-0.000``)."""
    return f"{max(0.0, value):.3f}"


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, sort_keys=True, default=str)


def per_second(ops: list[dict]) -> dict:
    """``{"start", "produced": [...], "consumed": [...], "faults": [(t0, t1, kind)]}``:
    acknowledged sends and reads per second since the first operation."""
    times = [op["t0"] for op in ops]
    if not times:
        return {"start": 0.0, "produced": [], "consumed": [], "faults": []}
    start = min(times)
    produced = collections.Counter()
    consumed = collections.Counter()
    faults = []
    for op in ops:
        second = int(op["t1"] - start)
        if op["type"] == "send" and op["outcome"] == OK:
            produced[second] += 1
        elif op["type"] == "poll":
            consumed[second] += len(op.get("reads") or ())
        elif op["type"] == "fault":
            faults.append((op["t0"] - start, op["t1"] - start, op["kind"]))
    end = max(max(produced, default=0), max(consumed, default=0)) + 1
    return {
        "start": start,
        "produced": [produced.get(s, 0) for s in range(end)],
        "consumed": [consumed.get(s, 0) for s in range(end)],
        "faults": faults,
    }


def timeline_png(ops: list[dict], path: str, title: str = "raylog fault run") -> str:
    """Write the timeline PNG to ``path`` (needs matplotlib); returns ``path``."""
    import matplotlib  # optional, for plots: imported when used

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional, for plots: imported when used

    series = per_second(ops)
    seconds = list(range(len(series["produced"])))
    fig, ax = plt.subplots(figsize=(12, 4.5))
    ax.plot(seconds, series["produced"], label="produced (acknowledged) / s", lw=1.2)
    ax.plot(seconds, series["consumed"], label="consumed (delivered) / s", lw=1.2)
    kinds = sorted({k for _, _, k in series["faults"]})
    colors = plt.get_cmap("tab10")
    color_of = {k: colors(i % 10) for i, k in enumerate(kinds)}
    seen = set()
    for t0, t1, kind in series["faults"]:
        ax.axvspan(t0, max(t1, t0 + 0.3), color=color_of[kind], alpha=0.25,
                   label=None if kind in seen else kind)
        seen.add(kind)
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("messages per second")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
