"""The verifier options every stage that scores shares (profile, evaluate, the GRPO reward):
declared once here and embedded in each stage's config."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class VerifierOptions(BaseModel):
    verifier: str = Field("toolcall", description="Verifier that scores an action against the expert's "
                          "(pivotrl.verifiers registry; paper: functional equivalence, 'exact' is the "
                          "string-match ablation).")
    verifier_config: dict[str, Any] = Field(default_factory=dict, description="The verifier's options "
                                            "(its YAML keys).")

    def build_verifier(self):
        from pivotrl.verifiers import get_verifier

        return get_verifier(self.verifier, **self.verifier_config)

    def verifier_options(self) -> dict[str, Any]:
        """These fields as keyword arguments of another config (one config feeds the next)."""
        return {name: getattr(self, name) for name in VerifierOptions.model_fields}
