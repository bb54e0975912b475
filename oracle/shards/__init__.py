"""One run's trials over many workers: `assign` (shard `i/N` of a seed's schedule), `results` (a shard's
raw results beside its report), `merge` (the shards -> the unsharded run's report)."""
