"""A third architecture, registered here and nowhere else: a one-layer Llama (transformers) behind legalnb's model
contract. Registered in this file only, it trains, resumes, is evaluated on held-out acts, is compared with the GPT
baseline and exports to a folder transformers loads: the registry is the whole contract (no other file names it)."""
import io, json, math, shutil
from contextlib import redirect_stdout
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from legalnb.cli import main
from legalnb.models import MODELS, ModelSpec, load_saved, next_token, register, save_model


@dataclass
class ToyConfig:
    vocab_size: int          # tokens
    max_seq_len: int = 64    # positions
    dim: int = 16            # width
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
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=config.max_seq_len,
            tie_word_embeddings=False))

    def forward(self, input_ids, targets=None, doc_starts=None):
        logits = self.net(input_ids=input_ids).logits
        if targets is None: return logits
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)

    def num_params(self, non_embedding=False):
        return sum(p.numel() for n, p in self.named_parameters() if not (non_embedding and 'embed' in n))

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens, temperature=1.0, top_k=None, generator=None, **_):
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


def run(*argv) -> str:
    "stdout of `legalnb ARGV`, which must succeed."
    out = io.StringIO()
    with redirect_stdout(out): assert main([str(a) for a in argv]) == 0
    return out.getvalue()


@pytest.fixture(scope='module')
def toy(tmp_path_factory):
    "The toy registered, and a corpus of the generated sample with its held-out acts, split for training."
    register(ModelSpec('toy', 'a one-layer Llama behind the contract', ToyConfig, Toy, {'small': {'dim': 16}},
                       lambda name, p: p.ndim < 2, export_toy, tiny={'dim': 16}))
    d = tmp_path_factory.mktemp('toy')
    run('sample', d/'sample', '--docs', '40', '--seed', '3')
    run('parse', d/'sample', '--out', d/'parsed.jsonl', '--no-progress')
    run('build-corpus', d/'parsed.jsonl', '--out', d/'corpus', '--train-tokenizer', '300', '--seq-len', '32',
        '--val-docs', '0.3', '--shards', '2', '--no-progress')
    run('split', d/'corpus', '--out', d/'split')
    yield d
    del MODELS['toy']


TRAIN = ['--model', 'toy', '--size', 'small', '--batch-size', '4', '--save-every', '5', '--eval-every', '5',
         '--eval-batches', '1', '--num-workers', '0', '--device', 'cpu', '--log-every', '1', '--lr', '3e-3',
         '--max-steps', '15']


@pytest.fixture(scope='module')
def trained(toy):
    "The toy trained 15 steps in one go."
    run('train', '--data', toy/'split', '--out', toy/'run', *TRAIN)
    return toy/'run'


def test_a_registered_architecture_trains_and_resumes_where_it_stopped(toy, trained):
    "Resumed from the checkpoint of step 10, the run ends with the weights of the run that never stopped."
    s = json.loads((trained/'summary.json').read_text())
    assert s['step'] == 15 and json.loads((trained/'model'/'config.json').read_text())['architecture'] == 'toy'
    again = toy/'again'
    shutil.copytree(trained, again, ignore=shutil.ignore_patterns('model', 'summary.json'))   # killed after step 12
    shutil.rmtree(again/'checkpoints'/'step-00000015')
    run('train', '--data', toy/'split', '--out', again, *TRAIN, '--resume')
    r = json.loads((again/'summary.json').read_text())
    assert (r['step'], r['steps'], r['resumed_from']) == (15, 5, 10)
    a, b = load_file(str(trained/'model'/'model.safetensors')), load_file(str(again/'model'/'model.safetensors'))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), 'resumed: the same weights'


def test_a_registered_architecture_is_evaluated_on_held_out_acts(toy, trained):
    run('evaluate', trained, '--data', toy/'corpus'/'heldout.jsonl', '--out', toy/'eval', '--citations', '5',
        '--samples', '0', '--rouge', '0', '--bootstrap', '0', '--no-progress')
    r = json.loads((toy/'eval'/'eval.json').read_text())
    assert r['model']['kind'] == 'native' and r['model']['params'] == Toy.load(trained/'model').num_params()
    bits_per_token_guessing = math.log2(300)   # a uniform guess over the 300-token vocabulary
    assert r['overall']['docs'] > 0 and 0 < r['overall']['bits_per_byte'] < 4 * bits_per_token_guessing


def test_a_registered_architecture_is_compared_with_the_gpt_baseline(toy):
    run('compare', '--data', toy/'split', '--out', toy/'compare', '--models', 'toy,gpt', '--budget', '4000',
        '--batch-size', '4', '--dim', '16', '--num-layers', '1', '--num-heads', '2', '--device', 'cpu',
        '--eval-batches', '1')
    models = json.loads((toy/'compare'/'compare.json').read_text())['models']
    assert set(models) == {'toy', 'gpt'} and all(math.isfinite(m['loss_at_tokens']) for m in models.values())
    assert models['toy']['params'] == Toy(ToyConfig(300, 32, 16)).num_params()


def test_a_registered_architecture_exports_to_a_folder_transformers_loads(toy, trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    run('export', trained, '--out', toy/'hf')
    hf, tok = AutoModelForCausalLM.from_pretrained(toy/'hf').eval(), AutoTokenizer.from_pretrained(toy/'hf')
    ids = torch.tensor([tok.encode('Article 1 This Regulation lays down rules')])
    with torch.no_grad(): want = Toy.load(trained/'model').eval()(ids)
    assert torch.allclose(hf(input_ids=ids).logits, want, atol=1e-5)
