"""The model registry: lookups and their errors, configs and FLOPs through the specs, load_model, and a new
architecture registered from this file and trained through its spec alone."""
import json, subprocess, sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from legalnb.core import LegalnbError
from legalnb.models import MODELS, ModelSpec, get_model, load_model, load_saved, next_token, register, save_model


def test_importing_the_registry_imports_no_model_code():
    code = ('import sys, legalnb.models; '
            'print([m for m in ("torch", "legalnb.gpt", "legalnb.resonance") if m in sys.modules])')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == '[]'


def test_unknown_model_is_one_line_listing_the_choices():
    with pytest.raises(LegalnbError, match=r"^unknown model 'mamba'; choose from resonance, gpt$") as e:
        get_model('mamba')
    assert '\n' not in str(e.value)


def test_register_refuses_duplicates_and_bad_names():
    with pytest.raises(LegalnbError, match="model 'gpt' is already registered; pass replace=True"):
        register(MODELS['gpt'])
    with pytest.raises(LegalnbError, match='register expects a ModelSpec'): register({'name': 'x'})
    with pytest.raises(LegalnbError, match='use letters, digits and underscores'):
        register(ModelSpec('two words', '', 'a:b', 'a:b', {}, lambda n, p: False))


@pytest.mark.parametrize('name', ['resonance', 'gpt'])
def test_config_and_flops_through_the_spec(name):
    spec = get_model(name)
    c = spec.config('medium', vocab_size=500, seq_len=1024, num_layers=3, dim=None)
    assert (c.vocab_size, c.max_seq_len, c.num_layers, c.dim) == (500, 1024, 3, spec.sizes['medium']['dim'])
    assert spec.matmul_flops_per_token(c) == c.matmul_flops_per_token()
    assert spec.flops_per_token(c, 1024) == c.flops_per_token(1024) > spec.matmul_flops_per_token(c)
    with pytest.raises(LegalnbError, match=f"model '{name}': unknown size 'tiny'; choose from small, medium"):
        spec.config('tiny', 500, 1024)
    with pytest.raises(LegalnbError, match=f"model '{name}' has no field heads; its fields: vocab_size, dim"):
        spec.config('small', 500, 1024, heads=2)


def test_num_frequencies_is_an_override_for_resonance_only():
    assert get_model('resonance').config('small', 100, 64, num_frequencies=4).num_frequencies == 4
    with pytest.raises(LegalnbError, match="model 'gpt' has no field num_frequencies"):
        get_model('gpt').config('small', 100, 64, num_frequencies=4)


def test_no_decay_rules():
    spec = get_model('resonance')
    m = spec.build(spec.config('small', 50, 32, dim=16, num_layers=2, num_frequencies=4))
    decay, rest = spec.param_groups(m, 0.1)
    # legalnb.train.make_optimizer's rule before the registry: decay matrices outside the resonance filters
    assert [id(p) for p in decay['params']] == [id(p) for n, p in m.named_parameters()
                                                if p.ndim >= 2 and '.filter.' not in n]
    names = {id(p): n for n, p in m.named_parameters()}
    assert {'norm.weight', 'backbone.blocks.0.mixer.filter.decay'} <= {names[id(p)] for p in rest['params']}
    assert len(decay['params']) + len(rest['params']) == len(list(m.parameters())) and rest['weight_decay'] == 0
    g = get_model('gpt')
    m = g.build(g.config('small', 50, 32, dim=16, num_layers=2, num_heads=2))
    decay, rest = g.param_groups(m, 0.1)
    names = {id(p): n for n, p in m.named_parameters()}
    assert {names[id(p)] for p in rest['params']} == {n for n, p in m.named_parameters() if 'norm' in n}
    assert 'tok_emb.weight' in {names[id(p)] for p in decay['params']} and decay['weight_decay'] == 0.1


@pytest.mark.parametrize('name', ['resonance', 'gpt'])
def test_load_model_round_trip(tmp_path, name):
    spec = get_model(name)
    extra = {'num_heads': 2} if name == 'gpt' else {'num_frequencies': 4}
    torch.manual_seed(0)
    m = spec.build(spec.config('small', 40, 24, dim=16, num_layers=2, **extra)).eval()
    m.save(tmp_path)
    back = load_model(tmp_path).eval()
    ids = torch.randint(0, 40, (2, 24))
    with torch.no_grad(): assert type(back) is type(m) and torch.equal(back(ids), m(ids))


def test_folder_without_architecture_is_resonance(tmp_path):
    spec = get_model('resonance')
    spec.build(spec.config('small', 40, 24, dim=16, num_layers=1, num_frequencies=4)).save(tmp_path)
    saved = json.loads((tmp_path/'config.json').read_text())   # a folder saved before the architecture was recorded
    (tmp_path/'config.json').write_text(json.dumps({k: v for k, v in saved.items() if k != 'architecture'}))
    assert 'architecture' not in json.loads((tmp_path/'config.json').read_text())
    assert type(load_model(tmp_path)).__name__ == 'ResonanceLanguageModel'


def test_load_model_errors(tmp_path):
    with pytest.raises(LegalnbError, match='config.json: not found; expected a model config'): load_model(tmp_path)
    (tmp_path/'config.json').write_text('{"architecture": "rwkv"}')
    with pytest.raises(LegalnbError, match="architecture 'rwkv' is not registered; choose from resonance, gpt"):
        load_model(tmp_path)
    (tmp_path/'config.json').write_text('[1, 2]')
    with pytest.raises(LegalnbError, match='config.json: expected a model config'): load_model(tmp_path)


# ---- a new architecture, defined here: a config, a model, and one registry line ----

@dataclass
class ToyConfig:
    vocab_size: int               # tokens
    max_seq_len: int = 32         # longest context (the convolution below does not need it)
    dim: int = 8                  # channels
    kernel: int = 3               # causal convolution taps

    def to_dict(self): return asdict(self)
    @classmethod
    def from_dict(cls, d): return cls(**d)
    def matmul_flops_per_token(self): return 6.0 * (self.dim * self.dim * self.kernel + self.vocab_size * self.dim)
    def flops_per_token(self, seq_len): return self.matmul_flops_per_token()


class ToyModel(nn.Module):
    "Embedding, one causal convolution, a norm and a head."
    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config, k = config, config.kernel
        self.emb = nn.Embedding(config.vocab_size, config.dim)
        self.conv = nn.Conv1d(config.dim, config.dim, k, padding=k - 1)
        self.norm, self.head = nn.LayerNorm(config.dim), nn.Linear(config.dim, config.vocab_size, bias=False)

    def forward(self, input_ids, targets=None, doc_starts=None):
        x = self.emb(input_ids).transpose(1, 2)
        logits = self.head(self.norm(self.conv(x)[..., :input_ids.shape[1]].transpose(1, 2)))
        if targets is None: return logits
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)

    def num_params(self, non_embedding=False):
        return sum(p.numel() for p in self.parameters()) - (self.emb.weight.numel() if non_embedding else 0)

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens, temperature=1.0, top_k=None, generator=None, **_):
        "The rule every model samples with, over the whole context each token."
        for _ in range(max_new_tokens):
            step = next_token(self(input_ids)[:, -1].float(), temperature, top_k, generator)
            input_ids = torch.cat([input_ids, step], dim=1)
        return input_ids

    save = save_model                 # legalnb's one rule: weights, and config.json recording the architecture
    load = classmethod(load_saved)


@pytest.fixture
def toy():
    sizes = {'tiny': {'dim': 8}, 'wide': {'dim': 32}}
    spec = register(ModelSpec('toy', 'a causal convolution', ToyConfig, ToyModel, sizes, lambda name, p: p.ndim < 2))
    yield spec
    del MODELS['toy']


def test_toy_architecture_registers_builds_trains_and_loads(toy, tmp_path):
    spec = get_model('toy')                               # from here on, only the spec is used
    assert spec is toy and 'toy' in str(pytest.raises(LegalnbError, get_model, 'nope').value)
    cfg = spec.config('tiny', vocab_size=13, seq_len=16, kernel=2)
    torch.manual_seed(0)
    model = spec.build(cfg)
    opt = torch.optim.AdamW(spec.param_groups(model, weight_decay=0.1), lr=0.05)
    ids = torch.arange(17).remainder(13)[None].repeat(4, 1)
    losses = []
    for _ in range(3):
        loss = model(ids[:, :-1], ids[:, 1:])[1]
        opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
    assert losses[2] < losses[0]
    assert [len(g['params']) for g in opt.param_groups] == [3, 3]   # emb, conv, head | conv bias, norm gain and bias
    assert spec.flops_per_token(cfg, 16) == 6.0 * (8 * 8 * 2 + 13 * 8)
    model.save(tmp_path)
    back = load_model(tmp_path)
    with torch.no_grad(): assert type(back) is ToyModel and torch.equal(back(ids), model(ids))
