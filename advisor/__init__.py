"""sglang-pool-advisor: online advice on the state/KV pool split of hybrid SGLang servers."""

__version__ = "0.1.0"
