from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from app.deps import EngineDep
from app.schemas import ModelOut, ModelsOut

router = APIRouter(prefix="/api", tags=["models"])


@router.get("/models", response_model=ModelsOut, summary="The models this server offers")
def list_models(engine: EngineDep) -> ModelsOut:
    out = []
    for name, lm in engine.models.items():
        out.append(ModelOut(**asdict(lm.info), default=name == engine.default,
                            max_tokens=engine.token_limit(lm),
                            induction_scores=lm.probe.get("induction", [])))
    return ModelsOut(models=out)
