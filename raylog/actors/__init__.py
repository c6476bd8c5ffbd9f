"""Ray actors: the partition actor that owns one log and serves it, its placement on nodes, and the producer actor."""
