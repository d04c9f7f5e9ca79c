"bench/cpt.py's preparation (training takes minutes, it is the bench's own run): held-out text, caps, records."
import json

import pytest

from conftest import load_bench
from legalnb.core import LegalnbError
from legalnb.hf import train_tiny_tokenizer


@pytest.fixture
def bench(monkeypatch):
    "bench/cpt.py as a module, with its own folder first on the path (as `python bench/cpt.py` has it)."
    return load_bench('cpt', monkeypatch)


def test_general_split(bench):
    "Every language keeps about the asked bytes held out, at least 5 units; none of the held-out text is in the rest."
    pytest.importorskip('chatterbot_corpus', reason='pip install --no-deps chatterbot-corpus==1.3.3')
    train, held = bench.split_general(['en', 'fr', 'de'], 1200, seed=0)
    for lang in ('en', 'fr', 'de'):
        mine = [c for c in held if c['lang'] == lang]
        size = sum(len(c['text'].encode('utf-8')) for c in mine)
        assert len(mine) >= 5 and 1200 <= size < 1200 + max(len(c['text'].encode('utf-8')) for c in mine)
        assert any(c['lang'] == lang for c in train)
    assert not {c['text'] for c in held} & {c['text'] for c in train}
    assert len({c['id'] for c in held + train}) == len(held + train)
    assert bench.split_general(['fr'], 1200, seed=0) == bench.split_general(['fr'], 1200, seed=0)   # seeded
    assert bench.split_general(['fr'], 1200, seed=1)[1] != bench.split_general(['fr'], 1200, seed=0)[1]


def test_capped_heldout(bench, tmp_path):
    "The held-out acts cut to exactly N tokens in all: each act keeps its opening, a short one stays whole."
    texts = ['Article 1 This Regulation lays down rules. ' * 40, 'Short act.', 'Article 2 Member States shall. ' * 60]
    (tmp_path/'heldout.jsonl').write_text(''.join(json.dumps(dict(celex=f'3202{i}R000{i}', text=t)) + '\n'
                                                  for i, t in enumerate(texts)))
    tok = train_tiny_tokenizer(texts, 300).backend_tokenizer
    tok.save(str(tmp_path/'tokenizer.json'))
    out = bench.capped_heldout(tmp_path, tmp_path/'tokenizer.json', tmp_path/'capped.jsonl', 120)
    docs = [json.loads(l) for l in out.read_text().splitlines()]
    counts = [len(tok.encode(d['text'], add_special_tokens=False).ids) for d in docs]
    assert [d['celex'] for d in docs] == ['32020R0000', '32021R0001', '32022R0002'] and sum(counts) == 120
    assert docs[1]['text'] == 'Short act.' and counts[0] == counts[2] == (120 - counts[1]) // 2
    assert all(texts[i].startswith(d['text']) for i, d in enumerate(docs))


def test_model_record(bench, tmp_path):
    "A model folder counts as complete only when its record lists every file at its size."
    assert not bench.model_complete(tmp_path)
    (tmp_path/'config.json').write_text('{}')
    (tmp_path/bench.MODEL_RECORD).write_text(json.dumps(dict(files={'config.json': 2})))
    assert bench.model_complete(tmp_path)
    (tmp_path/'config.json').write_text('{"a": 1}')   # changed after the record: not the folder the bench wrote
    assert not bench.model_complete(tmp_path)


def test_settings_refused(bench):
    "Bad sizes, unknown languages and repeated shares stop the bench before anything runs."
    o = dict(steps=8, batch=4, seq_len=256, max_tokens=4096, general_bytes=1200, lr=3e-4, replay=[0.0], eval_every=2)
    bench.check_settings(o, ['en'])
    with pytest.raises(LegalnbError, match='must be above 0'): bench.check_settings(o | dict(steps=0), ['en'])
    with pytest.raises(LegalnbError, match='must be above 0'): bench.check_settings(o | dict(eval_every=0), ['en'])
    with pytest.raises(LegalnbError, match='xx not known'): bench.check_settings(o, ['en', 'xx'])
    with pytest.raises(LegalnbError, match='distinct shares'): bench.check_settings(o | dict(replay=[0.0, 0.0]), ['en'])
    with pytest.raises(LegalnbError, match='distinct shares'): bench.check_settings(o | dict(replay=[1.0]), ['en'])


def test_curves_from_step_0_and_where_the_guard_stopped(bench, tmp_path):
    "The during-training table reads each arm's eval records (step 0 first); the guard's line is found in the log."
    curve = lambda d: {s: {'step': s, 'tokens': s * 1024, 'legal/bpb': 1.0 - s / 100, 'general/bpb': 3.0 + s * d}
                       for s in (0, 2, 4)}
    arms = [dict(share=0.0, curve=curve(0.01), eval_shares=[0.04, 0.05], times=dict(guard='forgetting guard: x')),
            dict(share=0.05, curve=curve(-0.01), eval_shares=[0.045], times={})]
    table = bench.curves_table(arms).splitlines()
    cells = lambda row: [c.strip() for c in row.split('|')[1:-1]]
    assert len(table) == 5 and cells(table[2]) == ['0', '0', '1.0000', '3.0000', '1.0000', '3.0000']
    assert cells(table[4]) == ['4', '4,096', '0.9600', '3.0400', '0.9600', '2.9600']
    lines = bench.watch_lines(arms)
    assert '0% replay under --max-forgetting 0: forgetting guard: x' in lines and '4.0%, 5.0% of the training' in lines
    log = tmp_path/'arm.log'
    log.write_text('$ legalnb finetune\nforgetting guard: general (en) bits per byte rose +0.1 over the base at step 4\n')
    assert bench.guard_stop(log).startswith('forgetting guard: general (en)')
