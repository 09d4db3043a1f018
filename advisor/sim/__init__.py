"""sim: a simulator of SGLang's two pools under a workload, and an emulated SGLang server over it."""
