"""Registration with transformers' AutoConfig / AutoModel / AutoModelForCausalLM under model_type "hypenet", and what
makes a saved model folder load without `import hyla`.

A saved folder carries `auto_map` and a small module, `hypenet_hyla.py`, that imports hyla: transformers then
loads it with `trust_remote_code=True` (without the flag it asks for it), and says that hyla is needed when hyla is
not installed. After `import hyla` the registered classes are used and no flag is needed."""

from __future__ import annotations

import json
from pathlib import Path

REMOTE_CODE_MODULE = "hypenet_hyla"
AUTO_MAP = {
    "AutoConfig": f"{REMOTE_CODE_MODULE}.HypeNetConfig",
    "AutoModel": f"{REMOTE_CODE_MODULE}.HypeNetModel",
    "AutoModelForCausalLM": f"{REMOTE_CODE_MODULE}.HypeNetForCausalLM",
}
# Layer types that use `swa_window`; other models leave the field out of config.json.
SLIDING_WINDOW_LAYER_TYPES = ("swa", "hh_swa")

# transformers copies this file out of the folder and imports it. Its import of hyla sits in a try block, which
# transformers' check for missing packages skips, so that the error below is the one a user sees. The classes are
# subclasses, so that transformers' registration of remote classes leaves hyla's own classes as they are.
REMOTE_CODE = '''"""HypeNet (hyla) model classes for `trust_remote_code=True`: they are hyla's own. Without the flag,
run `import hyla` before `from_pretrained`."""

try:
    import hyla.models as _hyla_models
except ImportError as error:
    raise ImportError(
        "this is a HypeNet model folder: loading it needs the hyla package; install hyla, then `import hyla` "
        "before AutoModelForCausalLM.from_pretrained"
    ) from error


class HypeNetConfig(_hyla_models.HypeNetConfig):
    pass


class HypeNetModel(_hyla_models.HypeNetModel):
    config_class = HypeNetConfig


class HypeNetForCausalLM(_hyla_models.HypeNetForCausalLM):
    config_class = HypeNetConfig
'''


def register() -> None:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from hyla.models import HypeNetConfig, HypeNetForCausalLM, HypeNetModel

    AutoConfig.register("hypenet", HypeNetConfig, exist_ok=True)
    AutoModel.register(HypeNetConfig, HypeNetModel, exist_ok=True)
    AutoModelForCausalLM.register(HypeNetConfig, HypeNetForCausalLM, exist_ok=True)


def complete_folder(folder: Path) -> None:
    """What `HypeNetPreTrainedModel.save_pretrained` adds to transformers' folder: `auto_map` and `hypenet_hyla.py`,
    so that the folder loads without `import hyla`; the layer types under their own key (SAVED_LAYER_TYPES_KEY), so
    that transformers' readers of config.json that do not know hyla (AutoTokenizer) accept it; and no `swa_window`
    for a model without sliding-window layers (the field would describe a window the model does not have)."""
    from hyla.models.configuration import SAVED_LAYER_TYPES_KEY
    from hyla.outputs import write_atomic

    folder = Path(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = AUTO_MAP
    if "layer_types" in config:
        config[SAVED_LAYER_TYPES_KEY] = config.pop("layer_types")
    if not set(config.get(SAVED_LAYER_TYPES_KEY) or ()) & set(SLIDING_WINDOW_LAYER_TYPES):
        config.pop("swa_window", None)
    write_atomic(config_path, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    write_atomic(folder / f"{REMOTE_CODE_MODULE}.py", REMOTE_CODE.encode())
