"""The model registry: lookups and their errors, configs and FLOPs through the specs, load_model, and a new
architecture (the test toy, tests/toy_model.py) registered by one line and trained through its spec alone."""
import json, subprocess, sys

import pytest
import torch

from legalnb.core import LegalnbError
from legalnb.models import MODELS, ModelSpec, get_model, load_model, register
from toy_model import TOY, Toy


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


# ---- a new architecture: the test toy (tests/toy_model.py), made a legalnb model by one registry line ----

@pytest.fixture
def toy():
    yield register(TOY)
    del MODELS['toy']


def test_toy_architecture_registers_builds_trains_and_loads(toy, tmp_path):
    spec = get_model('toy')                               # from here on, only the spec is used
    assert spec is toy and 'toy' in str(pytest.raises(LegalnbError, get_model, 'nope').value)
    cfg = spec.config('small', vocab_size=13, seq_len=16, dim=8, num_heads=4)   # num_heads: the toy's own field
    torch.manual_seed(0)
    model = spec.build(cfg)
    opt = torch.optim.AdamW(spec.param_groups(model, weight_decay=0.1), lr=0.05)
    ids = torch.arange(17).remainder(13)[None].repeat(4, 1)
    losses = []
    for _ in range(3):
        loss = model(ids[:, :-1], ids[:, 1:])[1]
        opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
    assert losses[2] < losses[0]
    assert cfg.num_heads == 4 and model.net.config.num_attention_heads == 4
    assert [len(g['params']) for g in opt.param_groups] == [9, 3]   # emb, q k v o, gate up down, head | 3 norms
    assert spec.flops_per_token(cfg, 16) == 6.0 * (12 * 8 * 8 + 13 * 8) + 12 * 16 * 8
    model.save(tmp_path)
    back = load_model(tmp_path)
    with torch.no_grad(): assert type(back) is Toy and torch.equal(back(ids), model(ids))
