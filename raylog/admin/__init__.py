"""Topic and offset administration: the :class:`raylog.Client`'s parts
(docs/design.md section 1, ``raylog/admin/``).

Modules: :mod:`~raylog.admin.topics` (:class:`~raylog.admin.topics.TopicAdmin`:
create, delete, list, describe and repair topics, the partition actors that
serve them) and :mod:`~raylog.admin.offsets`
(:class:`~raylog.admin.offsets.OffsetAdmin`: what partitions hold, where
consumer groups stand, resets and drains). The client's methods of the same
names call them; nothing here is imported by the layers below.
"""
