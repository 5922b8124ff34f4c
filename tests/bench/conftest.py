from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from hyla.models.loading import load_tokenizer

    try:
        return load_tokenizer("smollm2-135m")
    except (FileNotFoundError, ValueError) as err:
        pytest.skip(f"SmolLM2's tokenizer is not available: {err}")
