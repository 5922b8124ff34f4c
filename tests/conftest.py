import os

import pytest
import torch

pytest_plugins = ["report_log"]  # HYLA_TEST_REPORT=FILE: outcomes and failures written as they happen

# Determinism and a small thread count: the test machine has 2 cores.
torch.set_num_threads(min(2, os.cpu_count() or 1))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def smollm2_teacher():
    """The offline SmolLM2-135M teacher (de-quantized from its GGUF once per test session)."""
    from hyla.models.loading import load_teacher

    try:
        teacher = load_teacher("smollm2-135m")
    except (FileNotFoundError, ValueError) as err:
        pytest.skip(f"SmolLM2 teacher not available: {err}")
    teacher.model.eval()
    return teacher
