"""Registration with transformers' AutoConfig / AutoModel / AutoModelForCausalLM under model_type "hypenet"."""

from __future__ import annotations


def register() -> None:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from hyla.models import HypeNetConfig, HypeNetForCausalLM, HypeNetModel

    AutoConfig.register("hypenet", HypeNetConfig, exist_ok=True)
    AutoModel.register(HypeNetConfig, HypeNetModel, exist_ok=True)
    AutoModelForCausalLM.register(HypeNetConfig, HypeNetForCausalLM, exist_ok=True)
