"""estimate: running, recency-weighted pictures of a server's workload (pure; `now` is passed in)."""
