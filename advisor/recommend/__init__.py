"""recommend: turns the workload picture plus the dual-pool model into a decision with its reason (pure)."""
