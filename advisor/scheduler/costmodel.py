"""Step-time cost model of the simulator: seconds per decode step and per prefill batch, with every
coefficient in one place. All of them are ASSUMPTIONS (see CostModel), not measurements.
"""

# A memory-bound decode (fixed weight read + per-request state traffic + per-token KV read) and a
# compute-bound prefill. The defaults are calibrated loosely against the seed's TP8 B300 example
# (the `Decode batch` lines of `fixtures/logs/runtime-tp8.log`: ~2,200 tok/s at ~45 running and
# ~400k KV tokens), which gives tens of milliseconds per decode step at ~100 running requests.

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class CostModel:
    """Seconds per decode step and per prefill batch on one DP worker.

    Decode step (one token for every running request):
        (decode_base + decode_per_request * batch * spec_factor + decode_per_kv_token * kv_per_rank)
        / tokens_per_step
    where spec_factor = 1 + spec_verify_per_draft_token * draft_tokens and tokens_per_step is
    `spec_accept_length` with speculative decoding, 1 without.
    Prefill batch: prefill_base + prefill_per_token * new_tokens
        + prefill_per_token_context * sum(new_tokens x tokens already in the sequence).
    """

    # Weights read once per step (MoE experts, embeddings) plus launch overhead.
    decode_base_seconds: float = 0.012
    # Per running request: recurrent-state read/write of the linear layers and the extra experts
    # a bigger batch touches. This is the term that makes decode throughput grow sublinearly.
    decode_per_request_seconds: float = 0.00015
    # Per KV token held on this rank (attention reads the whole KV of the batch every step):
    # ~13.8 KB/token fp8 at ~7 TB/s of HBM.
    decode_per_kv_token_seconds: float = 2.0e-9
    prefill_base_seconds: float = 0.015
    prefill_per_token_seconds: float = 1.0 / 60000.0
    prefill_per_token_context_seconds: float = 2.0e-11
    # Speculative decoding: mean tokens accepted per verify step, and the verify overhead per
    # draft token as a fraction of the per-request decode cost.
    spec_accept_length: float = 2.5
    spec_verify_per_draft_token: float = 0.15

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if not isinstance(value, (int, float)) or value < 0 or value != value:
                raise ValueError(f"cost.{item.name} must be a number >= 0, got {value!r}")
        if self.spec_accept_length < 1:
            raise ValueError(f"cost.spec_accept_length must be >= 1, got {self.spec_accept_length}")
        if self.decode_base_seconds + self.decode_per_request_seconds <= 0:
            raise ValueError(
                "cost: a decode step must take some time (decode_base_seconds + decode_per_request_seconds > 0)"
            )

    def _tokens_per_step(self, draft_tokens: int) -> float:
        return self.spec_accept_length if draft_tokens > 0 else 1.0

    def decode_linear(
        self, batch: int, kv_tokens_per_rank: float, kv_growth_per_step: float, draft_tokens: int = 0
    ) -> tuple[float, float]:
        """(A, B) such that decode step j (0-based) of a run at constant batch takes A + B*j seconds.

        `kv_tokens_per_rank` is the KV read by the first step; it grows by `kv_growth_per_step`
        per step. With speculative decoding one simulated step is one accepted token per request,
        so the cost of a verify step is spread over `spec_accept_length` tokens.
        """
        spec_factor = 1.0 + self.spec_verify_per_draft_token * draft_tokens
        per_step = self.spec_accept_length if draft_tokens > 0 else 1.0  # _tokens_per_step (runs per decode run)
        first = (
            self.decode_base_seconds
            + self.decode_per_request_seconds * batch * spec_factor
            + self.decode_per_kv_token_seconds * kv_tokens_per_rank
        )
        return first / per_step, self.decode_per_kv_token_seconds * kv_growth_per_step / per_step

    def decode_step_seconds(self, batch: int, kv_tokens_per_rank: float, draft_tokens: int = 0) -> float:
        first, _ = self.decode_linear(batch, kv_tokens_per_rank, 0.0, draft_tokens)
        return first

    def prefill_seconds(self, new_tokens: int, context_token_products: float) -> float:
        """One prefill batch of `new_tokens` tokens; `context_token_products` = sum of
        new_tokens_i * (prefix_i + new_tokens_i / 2) over its requests (causal attention work)."""
        return (
            self.prefill_base_seconds
            + self.prefill_per_token_seconds * new_tokens
            + self.prefill_per_token_context_seconds * context_token_products
        )

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def cost_model_from_dict(data: dict[str, Any], where: str = "cost") -> CostModel:
    """A CostModel from a mapping of coefficient overrides; unknown keys are errors."""
    from advisor.errors import InputError

    if not isinstance(data, dict):
        raise InputError(f"{where} must be a mapping of coefficients, got {type(data).__name__}")
    known = {item.name for item in fields(CostModel)}
    values: dict[str, float] = {}
    for key, value in data.items():
        if key not in known:
            raise InputError(f"{where}.{key} is not a cost coefficient (known: {', '.join(sorted(known))})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{where}.{key} must be a number, got {value!r}")
        values[key] = float(value)
    try:
        return CostModel(**values)
    except ValueError as exc:
        raise InputError(str(exc)) from None
