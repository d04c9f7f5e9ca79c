"""The test toy architecture: a one-layer Llama (transformers) behind legalnb's model contract. Everything about it is
in this file (config, module, decay rule, save/load, Hugging Face export); a test makes it a legalnb model with one
line, `register(TOY)`, and no other file names it. tests/test_models.py, test_train.py and
test_third_architecture.py all use this one toy."""
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from legalnb.models import ModelSpec, load_saved, next_token, save_model


@dataclass
class ToyConfig:
    vocab_size: int          # tokens
    max_seq_len: int = 64    # positions
    dim: int = 16            # width
    num_heads: int = 2       # attention heads (dim / num_heads even: rotary positions)

    def to_dict(self): return asdict(self)
    @classmethod
    def from_dict(cls, d): return cls(**d)
    def matmul_flops_per_token(self): return 6.0 * (12 * self.dim ** 2 + self.vocab_size * self.dim)
    def flops_per_token(self, seq_len): return self.matmul_flops_per_token() + 12 * seq_len * self.dim


class Toy(nn.Module):
    "A one-layer Llama from transformers, with the contract's forward, generate, save and load."
    def __init__(self, config: ToyConfig):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM
        self.config = config
        self.net = LlamaForCausalLM(LlamaConfig(
            vocab_size=config.vocab_size, hidden_size=config.dim, intermediate_size=2 * config.dim, num_hidden_layers=1,
            num_attention_heads=config.num_heads, num_key_value_heads=config.num_heads,
            max_position_embeddings=config.max_seq_len, tie_word_embeddings=False))

    def forward(self, input_ids, targets=None, doc_starts=None):
        logits = self.net(input_ids=input_ids).logits
        if targets is None: return logits
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)

    def num_params(self, non_embedding=False):
        return sum(p.numel() for n, p in self.named_parameters() if not (non_embedding and 'embed' in n))

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens, temperature=1.0, top_k=None, generator=None, **_):
        "The rule every model samples with, over the whole (cropped) context each token."
        if isinstance(generator, int): generator = torch.Generator().manual_seed(generator)
        for _ in range(max_new_tokens):
            logits = self(input_ids[:, -self.config.max_seq_len:])[:, -1].float()
            input_ids = torch.cat([input_ids, next_token(logits, temperature, top_k, generator)], dim=1)
        return input_ids

    save = save_model                 # legalnb's one rule: weights, and config.json recording the architecture
    load = classmethod(load_saved)    # its reader, which refuses another architecture's folder


def export_toy(model: Toy, out: Path, eos_id: int) -> list[str]:
    "The Hugging Face export: the Llama inside, as transformers saves it."
    model.net.save_pretrained(out)
    return sorted(p.name for p in Path(out).iterdir())


def no_decay(name: str, p) -> bool: return p.ndim < 2   # norms' gains: not decayed


TOY = ModelSpec('toy', 'a one-layer Llama behind the contract', ToyConfig, Toy, {'small': {'dim': 16}}, no_decay,
                export_toy, tiny={'dim': 16})
