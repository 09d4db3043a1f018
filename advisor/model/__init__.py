"""The dual-pool model: pure arithmetic of SGLang's state pool and KV pool (no I/O, no clock)."""
