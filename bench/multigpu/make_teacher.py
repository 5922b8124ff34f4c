"""A random Llama teacher (~0.1B parameters) with a byte-level BPE tokenizer trained on standard-library text,
built offline on the GPU machine for the 1-GPU vs 2-GPU conversion comparison. Usage: make_teacher.py OUT_DIR"""

import sys
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1])
texts = [p.read_text(errors="ignore") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]]
backend = Tokenizer(models.BPE())
backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
backend.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=["<eos>", "<pad>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
backend.train_from_iterator(texts, trainer)
tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")
torch.manual_seed(0)
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                     num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=8192,
                     tie_word_embeddings=True, eos_token_id=0, pad_token_id=1, bos_token_id=None)
LlamaForCausalLM(config).save_pretrained(out)
tokenizer.save_pretrained(out)
print(f"teacher: {sum(p.numel() for p in LlamaForCausalLM(config).parameters()) / 1e6:.1f}M params -> {out}")
