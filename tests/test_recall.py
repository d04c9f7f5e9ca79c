"bench/recall.py: the MQAR rows are what the paper describes, and a tiny configuration learns above chance."
from pathlib import Path

import pytest
import torch

from conftest import load_bench
from legalnb.core import LegalnbError


@pytest.fixture
def bench(monkeypatch):
    "bench/recall.py as a module, with its own folder first on the path (as `python bench/recall.py` has it)."
    return load_bench('recall', monkeypatch)


def test_mqar_rows(bench):
    "Pairs first, every key asked once in the second half, the target at a query is that key's value."
    x, y = bench.mqar_batch(5, 64, 8, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 64)
    for r in range(5):
        keys, values = x[r, 0:16:2].tolist(), x[r, 1:16:2].tolist()
        assert len(set(keys)) == 8 and all(1 <= k <= 64 for k in keys) and all(65 <= v <= 128 for v in values)
        asked = (y[r] != -100).nonzero().flatten()
        assert len(asked) == 8 and asked.min() >= 32 and asked.max() < 63
        assert sorted(x[r, asked].tolist()) == sorted(keys)
        assert all(y[r, t] == values[keys.index(x[r, t])] for t in asked.tolist())
        rest = torch.ones(64, dtype=torch.bool); rest[:16] = False; rest[asked] = False
        assert (x[r, rest] == 0).all(), 'filler elsewhere'
    with pytest.raises(LegalnbError, match='8 pairs need seq_len >= 32'): bench.mqar_batch(2, 16, 8)


def test_model_names(bench):
    "A model is `name` or `name:field=value,...`; lists survive the commas inside them."
    assert bench.parse_model('gpt') == ('gpt', {})
    assert bench.parse_model('resonance:attention_layers=[0, 1],attention_window=64') == \
        ('resonance', {'attention_layers': [0, 1], 'attention_window': 64})
    with pytest.raises(LegalnbError, match='expected field=value'): bench.parse_model('gpt:dim')


def test_gpt_learns_single_key_recall(bench):
    "A few seconds of training: the gpt baseline recalls a key far above chance (12.5%); the table shows it."
    torch.set_num_threads(1)
    r = bench.train_and_score('gpt', 'single', 64, 1, 3e-3, steps=150, batch=16, dim=64, layers=2, frequencies=8)
    assert r['acc'] > 0.5, r
    results = {('single', 64, 1): {'gpt': r, 'resonance': dict(r, acc=r['acc'] / 2)}}
    t = bench.table(results, ['gpt', 'resonance'])
    assert '| resonance / gpt |' in t and '0.50 |' in t and '12.5%' in t


@pytest.mark.parametrize('model,least', [('resonance', 0.5), ('resonance:attention_layers=[0]', 0.5),
                                         ('resonance:linear_layers=[0]', 0.3)])
def test_hybrids_recall(bench, model, least):
    "Issue 19: the default (the recall branch in block 0) and the switches, softmax attention or linear attention "
    "(Based) as block 0's mixer, learn to recall the key (chance 12.5%)."
    torch.set_num_threads(1)
    r = bench.train_and_score(model, 'single', 64, 1, 3e-3, steps=150, batch=16, dim=64, layers=2, frequencies=8)
    assert r['acc'] > least, r


def test_without_the_recall_branch_resonance_does_not_recall(bench):
    "The negative result that started issue 19, kept as a check that the task can fail: the plain resonance mixer "
    "(`recall_layers=[]`, every checkpoint before the branch) stays near chance (12.5%) in the same steps."
    torch.set_num_threads(1)
    r = bench.train_and_score('resonance:recall_layers=[]', 'single', 64, 1, 3e-3, steps=150, batch=16, dim=64,
                              layers=2, frequencies=8)
    assert r['acc'] < 0.3, r


FORMEX = Path(__file__).resolve().parents[2]/'shared'/'fixtures'/'formex'


@pytest.mark.skipif(not FORMEX.exists(), reason=f'real Formex fixtures not found at {FORMEX} (../shared beside the repo)')
def test_real_text_holds_out_the_newest_act_whole(bench):
    "`--loss-data`: the real acts packed as bytes, the newest (Regulation (EU) 2024/903) only in the held-out part."
    train, val = bench.formex_bytes(str(FORMEX))
    text = lambda t: bytes(t.tolist()).decode('utf-8')
    assert text(val).startswith('THE EUROPEAN PARLIAMENT AND THE COUNCIL OF THE EUROPEAN UNION,\nHaving regard to '
                                'the Treaty on the Functioning of the European Union, and in particular Article 172')
    assert 'Having regard to the Treaty establishing the European Community' in text(train)
    assert text(val)[:500] not in text(train)
    assert (val == 0).sum() == 1 and len(val) > 50_000 and len(train) > 100_000

