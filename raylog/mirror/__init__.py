"""Mirroring between raylog clusters (docs/design.md section 9).

One concept per module:

* :mod:`~raylog.mirror.spec`: what a mirror copies (source, topic regex,
  rename) and where its state lives in the target's ZooKeeper;
* :mod:`~raylog.mirror.progress`: the per-partition progress record (the
  write-ahead intent of the next set, with its producer sequence) and the
  offset checkpoints;
* :mod:`~raylog.mirror.copier`: one source partition copied into its target
  partition, exactly once, under a stable producer identity;
* :mod:`~raylog.mirror.member`: the Ray actor that is a member of the
  mirror's consumer group on the source and runs the copiers;
* :mod:`~raylog.mirror.controller`: the named detached actor that creates
  target topics, starts the members and answers ``status`` and ``stop``;
* :mod:`~raylog.mirror.translate`: a consumer group's offsets moved from the
  source to the mirror;
* :mod:`~raylog.mirror.audit`: a mirrored topic counted per time window on
  both sides and compared (the audit across tiers).

See docs/mirroring.md for the design.
"""

from raylog.mirror.audit import compare_topic  # noqa: E402
from raylog.mirror.handle import MirrorHandle, list_mirrors  # noqa: E402
from raylog.mirror.translate import translate_group  # noqa: E402

__all__ = ["MirrorHandle", "compare_topic", "list_mirrors", "translate_group"]
