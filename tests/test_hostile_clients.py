"""Strangers at every door: one module, every listener and every server.

Each test is one row of the attack list below, tried as an attacker would
try it, against real sockets, a real ZooKeeper and a real Ray cluster (the
module's ``raylog_client``, an embedded cluster with a data directory of its
own). A door added later gets its rows here, so that every door is held to
the same locks.

The attack list (door: what a stranger tries → what it gets):

* data channel: no AUTH, plaintext AUTH, a 4 GiB frame before AUTH, replayed
  proofs, 300 idle strangers, a HELLO every few seconds to stay past the
  authentication deadline → refused, shed or closed; nothing allocated of a
  claimed size.
* Kafka listener: idle connections that never authenticate, large frames
  before SASL, a compressed Produce that inflates past the partition's bound
  → deadline from accept, small frames before SASL, strangers shed first at
  the limit, a per-address bound, decompression bounded as it runs.
* ZooKeeper: writes without the token anywhere (the root included), large
  znodes, many connections, four-letter words, a squatted cluster path, a
  killed server → refused or bounded; a squatted path reported as such; the
  client that launched it restarts it or says so once.
* At rest: data directories and files, the token and the Ray token file →
  readable by their owner only.
"""

from __future__ import annotations

# -- data channel -----------------------------------------------------------------


# -- Kafka listener ---------------------------------------------------------------


# -- ZooKeeper --------------------------------------------------------------------


# -- at rest and edges ------------------------------------------------------------
