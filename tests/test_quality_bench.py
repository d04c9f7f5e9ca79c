"bench/quality.py at toy size: acts held out whole, the sweep grows past an edge, intervals, the table, continuing."
import json, math
from types import SimpleNamespace

import pytest
import torch

from conftest import load_bench
from legalnb.core import LegalnbError


@pytest.fixture
def bench(monkeypatch):
    return load_bench('quality', monkeypatch)


def doc(celex, lang='en', text='x'):
    return SimpleNamespace(celex=celex, lang=lang, text=text)


def test_acts_held_out_whole(bench):
    "Every language and consolidated version of an act falls on one side; one act at least on each side."
    docs = [doc('32016R0679'), doc('32016R0679', 'fr'), doc('02016R0679-20160504'), doc('32008R1137'),
            doc('32024R0903'), doc('32011L0083')]
    train, val = bench.split_acts(docs, held_out=0.5)
    assert len(val) == 2 and len(train) + sum(map(len, val.values())) == len(docs)
    held = {bench.act_of(d) for ds in val.values() for d in ds}
    assert held.isdisjoint({bench.act_of(d) for d in train})
    if '32016R0679' in val: assert len(val['32016R0679']) == 3, 'its version and its translation go with it'
    assert bench.split_acts(docs, held_out=0.5) == (train, val), 'deterministic'
    assert len(bench.split_acts(docs[:4], held_out=0.0)[1]) == 1 and len(bench.split_acts(docs[:4], 1.0)[0]) >= 1
    with pytest.raises(LegalnbError, match='need two, one to hold out'): bench.split_acts(docs[:3], 0.2)


def test_bootstrap_and_bits_per_byte(bench):
    "bits per byte weight acts by their bytes; the interval holds the estimate and narrows with agreeing acts."
    acts = {'a': [100 * math.log(2), 100], 'b': [300 * math.log(2), 100]}   # 1 and 3 bits per byte
    assert bench.bpb(acts) == pytest.approx(2.0)
    lo, hi = bench.bootstrap(acts, n=500)
    assert 1.0 <= lo <= 2.0 <= hi <= 3.0 and hi - lo > 0.5
    same = {'a': [110 * math.log(2), 100], 'b': [310 * math.log(2), 100]}   # 0.1 worse on every act
    dlo, dhi = bench.bootstrap(same, acts, n=500)
    assert dlo == pytest.approx(0.1) and dhi == pytest.approx(0.1), 'paired by act: no spread'
    assert bench.bpb({}) == math.inf and math.isnan(bench.bootstrap({}, n=10)[0])


def test_sweep_grows_past_the_edge(bench, monkeypatch):
    "A best rate at an end of the sweep adds the next rate past it (x2) until the best is inside."
    score = lambda lr: abs(math.log2(lr / 0.016))               # best at 0.016, beyond the starting sweep
    made = []
    def fake_one(runs, name, L, lr, steps, batch, seed, args, log):
        made.append(lr)
        return dict(lr=lr, acts={'a': [(1 + score(lr)) * math.log(2), 1]}, diverged=False)
    monkeypatch.setattr(bench, 'one', fake_one)
    best, swept = bench.sweep(None, 'gpt', 64, [1e-3, 2e-3, 4e-3], 1, 1, {}, print)
    assert best == pytest.approx(0.016) and [r['lr'] for r in swept] == pytest.approx([1e-3, 2e-3, 4e-3, 8e-3, .016,
                                                                                     .032])
    assert len(made) == len(set(made)), 'no rate trained twice'


def test_windows_and_lists(bench):
    assert bench.eval_windows(torch.zeros(1001), 100, 10_000) == list(range(0, 901, 100))
    assert bench.eval_windows(torch.zeros(1001), 100, 300) == [0, 400, 900]
    assert bench.parse_list('512,2k') == [512.0, 2000.0] and bench.per_length([1], [5, 6], 'x') == {5: 1, 6: 1}
    with pytest.raises(LegalnbError, match='--tokens: expected one value or one per length'):
        bench.per_length([1, 2, 3], [5, 6], 'tokens')


def test_toy_table_runs_and_continues(bench, tmp_path, capsys):
    "The whole command on the generated sample at toy size: both budgets, both seeds, a table; run again, nothing is "
    "retrained (the runs are kept in runs.json) and the same table comes out; other settings are refused."
    torch.set_num_threads(1)
    flags = dict(data='sample', models=['gpt', 'resonance'], lengths=[64, 128], tokens='6k', step_tokens='512',
                 lrs=[3e-3, 1e-2], seeds=2, dim=16, layers=1, frequencies=4, sample_docs=12, eval_bytes=512,
                 speed_steps=2, boot=200, out=str(tmp_path/'q'))
    assert bench.main(**flags) == 0
    out = capsys.readouterr().out
    table = out[out.index('| L '):].strip().splitlines()
    assert len(table) == 2 + 2 * 2 * 2, 'per length: two models x equal tokens and equal time'
    rows = [[c.strip() for c in line.split('|')[1:-1]] for line in table[2:]]
    assert {r[1].split(' (')[0] for r in rows} == {'equal tokens', 'equal time'}
    for r in rows:
        est, lo, hi = map(float, r[7].replace('[', '').replace(']', '').replace(',', '').split())
        assert 0 < lo <= est <= hi < 9, r
        assert len(r[8].split(' / ')) == 2, 'both seeds'
    res = [r for r in rows if r[2] == 'resonance' and r[1] == 'equal tokens']
    assert all(r[9].startswith(('+', '-')) for r in res), 'the difference to the baseline with its interval'
    saved = json.loads((tmp_path/'q'/'runs.json').read_text())
    n = len(saved['runs'])
    assert n >= 2 * 2 * 3, 'a sweep of at least 2 rates and a second seed per model and length'
    assert bench.main(**flags) == 0 and len(json.loads((tmp_path/'q'/'runs.json').read_text())['runs']) == n
    again = capsys.readouterr().out
    assert again[again.index('| L '):] == out[out.index('| L '):], 'the same table from the kept runs'
    assert (tmp_path/'q'/'quality.md').read_text().strip().endswith(table[-1])
    with pytest.raises(LegalnbError, match='other settings'): bench.main(**{**flags, 'dim': 24})
