"""End-to-end, CLI, failure and multi-process tests of the data stage (legalnb.data)."""
import json, os, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch

from legalnb.cli import main as cli
from legalnb.data import (PretokenizedDataset, StepSampler, make_loader, validate, split, find_segments, recommend,
                          open_rows, read_npy_header)
from legalnb.core import LegalnbError

REPO = Path(__file__).resolve().parents[1]


def rows_file(folder: Path, name: str, rows: int, row_len: int, seed: int = 0, vocab: int = 1000, dtype=np.uint16) -> np.ndarray:
    "Write random ids of shape (rows, row_len) as .npy or .pt; return the array written."
    a = np.random.default_rng(seed).integers(0, vocab, size=(rows, row_len)).astype(dtype)
    path = folder/name
    if path.suffix == '.pt': torch.save(torch.from_numpy(a), path)
    else: np.save(path, a)
    return a


@pytest.fixture
def shards(tmp_path):
    "A folder of 3 .npy shards and 1 .pt file, rows of 17 ids, and the concatenated rows."
    d = tmp_path/'data'; d.mkdir()
    parts = [rows_file(d, f'shard_{k:05d}.npy', rows=5 + k, row_len=17, seed=k) for k in range(3)]
    parts.append(rows_file(d, 'shard_00003.pt', rows=4, row_len=17, seed=9, dtype=np.int32))
    return d, np.concatenate([p.astype(np.int64) for p in parts])


# ---- dataset ---------------------------------------------------------------------------------------------------

def test_shifted_pairs_match_hand_computation(tmp_path):
    np.save(tmp_path/'a.npy', np.array([[7, 1, 2, 3], [9, 8, 7, 6]], dtype=np.uint32))
    ds = PretokenizedDataset(tmp_path)
    x, y = ds[1]
    assert x.tolist() == [9, 8, 7] and y.tolist() == [8, 7, 6] and x.dtype == y.dtype == torch.int64
    assert ds.seq_len == 3 and len(ds) == 2


def test_every_row_of_npy_and_pt_files(shards):
    d, want = shards
    ds = PretokenizedDataset(d)
    assert len(ds) == len(want) == 22 and ds.seq_len == 16
    for i in range(len(ds)):
        x, y = ds[i]
        assert x.tolist() == want[i, :-1].tolist() and y.tolist() == want[i, 1:].tolist()
    xb, yb = ds[[21, 0, 7, 7]]  # a batch across files, unsorted, with a repeat
    assert torch.equal(xb, torch.from_numpy(want[[21, 0, 7, 7], :-1])) and torch.equal(yb, torch.from_numpy(want[[21, 0, 7, 7], 1:]))
    with pytest.raises(IndexError): ds[22]


def test_list_of_files_and_single_file(shards):
    d, want = shards
    ds = PretokenizedDataset([d/'shard_00002.npy', d/'shard_00003.pt'])
    assert len(ds) == 11 and ds[0][0].tolist() == want[11, :-1].tolist()
    assert len(PretokenizedDataset(d/'shard_00003.pt')) == 4


def test_lru_cache_of_size_one_with_three_files(shards):
    d, want = shards
    ds = PretokenizedDataset(d, cache_size=1)
    order = [0, 21, 6, 12, 1, 20]  # hops between the four files
    assert [ds[i][0].tolist() for i in order] == [want[i, :-1].tolist() for i in order]
    assert len(ds._cache) == 1 and ds.opens == 6


def test_dataset_errors_name_the_file(tmp_path):
    (tmp_path/'empty').mkdir()
    with pytest.raises(LegalnbError, match='empty: no .npy or .pt files'): PretokenizedDataset(tmp_path/'empty')
    d = tmp_path/'mixed'; d.mkdir()
    rows_file(d, 'a.npy', 2, 17); rows_file(d, 'b.npy', 2, 65)
    with pytest.raises(LegalnbError, match=r'b.npy: mixed lengths: rows of 65 tokens'): PretokenizedDataset(d)
    np.save(tmp_path/'f.npy', np.zeros((2, 17), np.float64))
    with pytest.raises(LegalnbError, match=r'f.npy: float64 dtype'): PretokenizedDataset(tmp_path/'f.npy')


def test_manifest_gives_vocab_and_files(tmp_path):
    rows_file(tmp_path, 'shard_00000.npy', 3, 9)
    np.save(tmp_path/'shard_00000.docs.npy', np.array([0, 5, 11]))  # document starts: not rows
    (tmp_path/'manifest.json').write_text(json.dumps({'vocab_size': 4096, 'row_len': 9, 'shards': [{'file': 'shard_00000.npy', 'rows': 3}]}))
    ds = PretokenizedDataset(tmp_path)
    assert ds.vocab_size == 4096 and len(ds) == 3 and [s.file.name for s in ds.segments] == ['shard_00000.npy']


def _rss_anon_kb() -> int:
    return int(next(l for l in Path('/proc/self/status').read_text().splitlines() if l.startswith('RssAnon')).split()[1])


@pytest.mark.skipif(not Path('/proc/self/status').exists(), reason='needs /proc to read resident memory')
def test_reading_everything_keeps_anonymous_memory_flat(tmp_path):
    rows_file(tmp_path, 'big.npy', rows=600, row_len=32769)  # 39 MB of uint16
    ds = PretokenizedDataset(tmp_path, cache_size=1)
    ds[0]; before = _rss_anon_kb()
    for i in range(len(ds)): ds[i]
    assert _rss_anon_kb() - before < 8_000, 'rows read through the memory map must not be kept'


# ---- batch order -----------------------------------------------------------------------------------------------

def test_resume_equals_uninterrupted_without_replay(monkeypatch):
    full = list(StepSampler(101, 8, seed=42, max_steps=40))  # 12 steps per epoch: crosses 3 epoch boundaries
    calls = []
    for k in (0, 5, 12, 13, 35):
        s = StepSampler(101, 8, seed=42, max_steps=40)
        s.set_position(k)
        orig = s.batch
        monkeypatch.setattr(s, 'batch', lambda step, orig=orig: (calls.append(step), orig(step))[1])
        assert list(s) == full[k:]
        assert min(calls) == k, 'no step before the resume point is computed'
        calls.clear()
    assert StepSampler(101, 8, seed=42, start_step=13).batch(13) == full[13]


def test_ranks_are_disjoint_and_cover_the_epoch():
    n, b, w = 103, 4, 4
    ranks = [StepSampler(n, b, seed=3, rank=r, world_size=w) for r in range(w)]
    spe = ranks[0].steps_per_epoch
    assert spe == n // (b * w)
    for epoch in range(2):
        seen = [i for k in range(epoch * spe, (epoch + 1) * spe) for r in ranks for i in r.batch(k)]
        assert len(seen) == len(set(seen)) == spe * b * w and set(seen) <= set(range(n))
    wrap = [StepSampler(n, b, seed=3, rank=r, world_size=w, drop_last=False) for r in range(w)]
    covered = {i for k in range(wrap[0].steps_per_epoch) for r in wrap for i in r.batch(k)}
    assert covered == set(range(n)) and all(len(r.batch(k)) == b for r in wrap for k in range(wrap[0].steps_per_epoch))


def test_order_is_a_pure_function_of_seed_epoch_step():
    a, b = StepSampler(50, 5, seed=7), StepSampler(50, 5, seed=7)
    assert [a.batch(k) for k in range(30)] == [b.batch(k) for k in reversed(range(30))][::-1]
    assert StepSampler(50, 5, seed=8).batch(0) != a.batch(0)
    assert StepSampler(50, 5, seed=0).batch(10) != StepSampler(50, 5, seed=1).batch(0), 'seed 0 epoch 1 differs from seed 1 epoch 0'


def test_loader_with_workers_matches_in_process_reads(shards):
    d, want = shards
    ds = PretokenizedDataset(d, cache_size=2)
    sampler = StepSampler(len(ds), 3, seed=1, max_steps=14, start_step=4)
    expect = [(torch.from_numpy(want[b, :-1]), torch.from_numpy(want[b, 1:])) for b in sampler.batches()]
    for workers in (0, 2):
        got = list(make_loader(ds, sampler, num_workers=workers, prefetch_factor=2))
        assert len(got) == 10
        assert all(torch.equal(x, ex) and torch.equal(y, ey) and x.shape == (3, 16) for (x, y), (ex, ey) in zip(got, expect))
    plain = torch.utils.data.DataLoader(ds, batch_sampler=sampler)  # also a standard batch_sampler, item by item
    assert all(torch.equal(x, ex) and torch.equal(y, ey) for (x, y), (ex, ey) in zip(plain, expect))


# ---- validate ----------------------------------------------------------------------------------------------------

def test_validate_statistics(tmp_path):
    np.save(tmp_path/'a.npy', np.array([[1, 1, 1, 2], [2, 3, 0, 1]], dtype=np.uint16))
    (tmp_path/'manifest.json').write_text(json.dumps({'vocab_size': 10}))
    rep = validate(tmp_path)
    assert rep.ok and rep.rows == 2 and rep.seq_len == 3 and rep.tokens == 8
    assert rep.vocab_size == 10 and rep.vocab_source == 'manifest.json' and rep.unique_tokens == 4
    assert rep.top_ids == [(1, 4), (2, 2), (0, 1), (3, 1)]


def test_validate_counts_in_chunks(tmp_path, monkeypatch):
    import legalnb.data as data
    monkeypatch.setattr(data, 'CHUNK_TOKENS', 200)  # 3 rows a chunk: 100 chunks
    a = rows_file(tmp_path, 'a.npy', 300, 65, vocab=50)
    a[250, 3] = 77
    np.save(tmp_path/'a.npy', a)
    rep = validate(tmp_path, vocab_size=50)
    assert rep.problems == [f'{tmp_path/"a.npy"}: id out of range: 1 ids outside [0, 50) (vocab_size), first 77 at row 250, column 3']
    a[250, 3] = 1; np.save(tmp_path/'a.npy', a)
    rep = validate(tmp_path, vocab_size=50)
    assert rep.top_ids[0] == (int(np.bincount(a.ravel()).argmax()), int(np.bincount(a.ravel()).max()))
    assert rep.unique_tokens == len(np.unique(a))


@pytest.fixture
def bad_folder(tmp_path):
    d = tmp_path/'bad'; d.mkdir()
    rows_file(d, 'good.npy', 6, 17, vocab=50)
    (d/'truncated.npy').write_bytes((d/'good.npy').read_bytes()[:-5])
    np.save(d/'wrong_shape.npy', np.zeros(17, np.uint16))
    np.save(d/'floats.npy', np.zeros((3, 17), np.float32))
    np.save(d/'out_of_range.npy', np.concatenate([np.full((1, 17), 77, np.uint16), np.full((2, 17), 100, np.uint16)]))
    rows_file(d, 'mixed.npy', 3, 65, vocab=100)
    torch.save({'input_ids': torch.zeros(2, 17, dtype=torch.long)}, d/'dict.pt')
    torch.save(torch.zeros(2, 17), d/'float_tensor.pt')
    (d/'cut.pt').write_bytes(b'PK\x03\x04 not really a zip')
    return d


EXPECTED = {'truncated.npy': 'truncated', 'wrong_shape.npy': 'wrong shape', 'floats.npy': 'float32 dtype',
            'out_of_range.npy': 'id out of range', 'mixed.npy': 'mixed lengths', 'dict.pt': '.pt holds a dict',
            'float_tensor.pt': 'torch.float32 dtype', 'cut.pt': 'unreadable .pt'}


def test_validate_names_each_bad_file(bad_folder):
    rep = validate(bad_folder, vocab_size=100)
    found = {Path(f.file).name: f.problems for f in rep.files if f.problems}
    assert set(found) == set(EXPECTED)
    for name, what in EXPECTED.items(): assert found[name][0].startswith(what), (name, found[name])
    assert rep.rows == 6 and rep.files[[Path(f.file).name for f in rep.files].index('good.npy')].problems == []
    good = np.load(bad_folder/'good.npy')
    assert rep.unique_tokens == len(np.unique(good)), 'statistics come from the good file only'


def test_validate_cli_exit_codes_and_json(bad_folder, tmp_path, capsys):
    assert cli(['validate', str(bad_folder), '--vocab-size', '100']) == 1
    err = capsys.readouterr().err
    for name, what in EXPECTED.items(): assert f'{name}: {what}' in err
    good = tmp_path/'good'; good.mkdir(); rows_file(good, 'a.npy', 40, 17)
    r = subprocess.run([sys.executable, '-m', 'legalnb.cli', 'validate', str(good), '--vocab-size', '1000', '--json', '--recommend'],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res['ok'] and res['rows'] == 40 and res['tokens'] == 40 * 17 and res['seq_len'] == 16
    assert [x['size'] for x in res['recommend']] == ['small', 'medium', 'large', 'xlarge']
    assert all(x['verdict'] == 'too little data' for x in res['recommend'])  # 640 tokens fit no model
    r = subprocess.run([sys.executable, '-m', 'legalnb.cli', 'validate', str(tmp_path/'nowhere')], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'nowhere: no such file or folder' in r.stderr


def test_recommend_follows_twenty_tokens_per_parameter():
    recs = {r['size']: r for r in recommend(tokens=10**12, vocab_size=32768, seq_len=3072)}
    assert all(r['verdict'] == 'fits' for r in recs.values())
    small = recs['small']
    assert small['tokens_wanted'] == 20 * small['params'] and small['epochs'] == pytest.approx(small['tokens_wanted'] / 1e12)


# ---- split -------------------------------------------------------------------------------------------------------

def _no_copies(split_dir: Path) -> bool:
    "Every .npy/.pt under split_dir is a link; the real files there are small JSON."
    data = [p for p in split_dir.rglob('*') if p.suffix in ('.npy', '.pt')]
    return all(os.path.islink(p) for p in data) and all(p.stat().st_size < 10_000 for p in split_dir.rglob('*.json') if not p.is_symlink())


def test_split_by_files_makes_links_not_copies(tmp_path):
    corpus = tmp_path/'corpus'; corpus.mkdir()
    for k in range(10): rows_file(corpus, f'shard_{k:05d}.npy', 4, 17, seed=k)
    (corpus/'tokenizer.json').write_text('{"model": {}}')
    (corpus/'manifest.json').write_text(json.dumps({'vocab_size': 1000, 'tokenizer': 'tokenizer.json', 'row_len': 17,
                                                     'shards': [{'file': f'shard_{k:05d}.npy', 'rows': 4} for k in range(10)]}))
    assert cli(['split', str(corpus), '--out', str(tmp_path/'split'), '--val-ratio', '0.2', '--seed', '3']) == 0
    s = tmp_path/'split'
    train, val = sorted(os.listdir(s/'train')), sorted(os.listdir(s/'val'))
    assert len(train) == 8 and len(val) == 2 and not set(train) & set(val)
    assert _no_copies(s) and os.path.islink(s/'manifest.json') and os.path.islink(s/'tokenizer.json')
    assert all(os.path.realpath(s/'train'/n) == str((corpus/n).resolve()) for n in train)
    assert PretokenizedDataset(s/'train').vocab_size == 1000 and len(PretokenizedDataset(s/'val')) == 8
    assert cli(['split', str(corpus), '--out', str(tmp_path/'again'), '--val-ratio', '0.2', '--seed', '3']) == 0
    assert sorted(os.listdir(tmp_path/'again'/'val')) == val, 'same seed, same split'
    assert cli(['split', str(corpus), '--out', str(tmp_path/'other'), '--val-ratio', '0.2', '--seed', '4']) == 0


def test_split_single_file_by_rows(tmp_path):
    a = rows_file(tmp_path, 'fineweb.pt', 200, 65, dtype=np.int32)
    info = split(tmp_path/'fineweb.pt', tmp_path/'split', val_ratio=0.01, seed=5)
    assert info['mode'] == 'rows' and info['val']['rows'] == 2 and info['train']['rows'] == 198
    assert _no_copies(tmp_path/'split')
    train, val = PretokenizedDataset(tmp_path/'split'/'train'), PretokenizedDataset(tmp_path/'split'/'val')
    rows = [tuple(ds[i][0].tolist()) for ds in (train, val) for i in range(len(ds))]
    assert sorted(rows) == sorted(tuple(r) for r in a[:, :-1].tolist()), 'train + val are exactly the original rows'
    assert validate(tmp_path/'split'/'val', vocab_size=1000).rows == 2
    again = split(tmp_path/'fineweb.pt', tmp_path/'split2', val_ratio=0.01, seed=5)
    assert json.loads((tmp_path/'split2'/'val'/'rows.json').read_text())['segments'] == json.loads((tmp_path/'split'/'val'/'rows.json').read_text())['segments']


def test_split_refuses_bad_input(tmp_path, capsys):
    rows_file(tmp_path, 'one.npy', 1, 17)
    with pytest.raises(LegalnbError, match='1 row'): split(tmp_path/'one.npy', tmp_path/'s1')
    rows_file(tmp_path, 'two.npy', 4, 17)
    (tmp_path/'busy').mkdir(); (tmp_path/'busy'/'x').write_text('')
    assert cli(['split', str(tmp_path/'two.npy'), '--out', str(tmp_path/'busy')]) == 2
    assert f'--out {tmp_path/"busy"} exists and is not empty' in capsys.readouterr().err
    with pytest.raises(LegalnbError, match='--val-ratio'): split(tmp_path/'two.npy', tmp_path/'s2', val_ratio=1.5)
    assert not (tmp_path/'s1').exists() and not (tmp_path/'s2').exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.')], 'no temporary folder left behind'


# ---- end to end with the corpus stage ----------------------------------------------------------------------------

def test_corpus_to_validate_split_and_batches(tmp_path):
    corpus = pytest.importorskip('legalnb.corpus', reason='the corpus stage is not installed')
    from legalnb.sources import Document, write_jsonl
    words = 'the commission shall adopt implementing acts member states regulation article data processing controller'.split()
    rng = np.random.default_rng(0)
    docs = [Document(f'3201{i % 10}R{i:04d}', f'Act {i}', ' '.join(rng.choice(words, 120)) + '.', 'en').to_json() for i in range(40)]
    write_jsonl(docs, tmp_path/'selected.jsonl')
    m = corpus.build_corpus(corpus.CorpusConfig(tmp_path/'selected.jsonl', tmp_path/'corpus', seq_len=32, shards=4, train_tokenizer=300, progress=False))
    rep = validate(tmp_path/'corpus')
    assert rep.ok, rep.problems
    assert (rep.rows, rep.row_len, rep.vocab_size, rep.vocab_source) == (m['rows'], 33, m['vocab_size'], 'manifest.json')
    assert rep.tokens == m['rows'] * 33 and 0 < rep.unique_tokens <= m['vocab_size']
    assert cli(['split', str(tmp_path/'corpus'), '--out', str(tmp_path/'split'), '--val-ratio', '0.25']) == 0
    train, val = PretokenizedDataset(tmp_path/'split'/'train'), PretokenizedDataset(tmp_path/'split'/'val')
    assert len(train) + len(val) == m['rows'] and train.vocab_size == m['vocab_size'] and train.seq_len == 32
    assert os.path.realpath(tmp_path/'split'/'tokenizer.json') == str((tmp_path/'corpus'/'tokenizer.json').resolve())
    x, y = next(iter(make_loader(train, StepSampler(len(train), 2, seed=0), num_workers=0)))
    assert x.shape == y.shape == (2, 32) and torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < m['vocab_size']


# ---- bad input is one line, nothing lost (issue 11) ---------------------------------------------------------------

def one_line(capsys, *argv, code=2) -> str:
    "Run the CLI, expect `code` and exactly one line on stderr; return it."
    assert cli([str(a) for a in argv]) == code
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and 'Traceback' not in err, err
    return err


@pytest.fixture
def corpus(tmp_path):
    "A corpus folder of two shards with a manifest, as build-corpus writes it."
    c = tmp_path/'corpus'; c.mkdir()
    for k in range(2): rows_file(c, f'shard_{k:05d}.npy', 6, 9, seed=k, vocab=100)
    (c/'manifest.json').write_text(json.dumps({'format': 'legalnb.corpus/1', 'vocab_size': 100, 'row_len': 9,
                                                'shards': [{'file': f'shard_{k:05d}.npy', 'rows': 6} for k in range(2)]}))
    return c


def test_unfinished_build_is_reported_and_refused(corpus, tmp_path, capsys):
    (corpus/'manifest.json').rename(corpus/'manifest.partial.json')  # what a killed build leaves
    partial = json.loads((corpus/'manifest.partial.json').read_text())
    (corpus/'manifest.partial.json').write_text(json.dumps({**partial, 'command': 'legalnb build-corpus s.jsonl --out corpus'}))
    err = one_line(capsys, 'validate', corpus)
    assert f'{corpus}: an unfinished build (manifest.partial.json, no manifest.json): run `legalnb build-corpus s.jsonl --out corpus` again' in err
    assert 'an unfinished build' in one_line(capsys, 'split', corpus, '--out', tmp_path/'s')
    assert not (tmp_path/'s').exists()
    with pytest.raises(LegalnbError, match='an unfinished build'): PretokenizedDataset(corpus)


@pytest.mark.parametrize('text,expect', [
    ('{"vocab_size": 100, "shards": [', 'manifest.json: not valid JSON'),
    ('[1, 2]', 'manifest.json: expected a corpus manifest'),
    ('{"shards": [{"rows": 6}]}', 'manifest.json: shards[0] has no "file"'),
    ('{"shards": "shard_00000.npy"}', 'manifest.json: "shards" must be a list'),
    ('{"vocab_size": "big"}', 'manifest.json: "vocab_size" must be a whole number >= 1, got "big"'),
    ('{"shards": [{"file": "shard_00000.npy", "rows": 1.5}]}', 'manifest.json: shards[0] "rows" must be a whole number'),
])
def test_broken_manifest_is_one_line(corpus, capsys, text, expect):
    (corpus/'manifest.json').write_text(text)
    assert expect in one_line(capsys, 'validate', corpus)


@pytest.mark.parametrize('text,expect', [
    ('[]', 'rows.json: expected a rows.json index'),
    ('{"segments": []}', 'rows.json: lists no segments'),
    ('{"segments": [{"start": 0, "stop": 2}]}', 'rows.json: segments[0] has no "file"'),
    ('{"segments": [{"file": "a.npy", "start": 0, "stop": "2"}]}', 'rows.json: segments[0] "stop" must be a whole number of rows, got "2"'),
    ('{"segments": [{"file": "a.npy", "start": 0.5, "stop": 2}]}', 'rows.json: segments[0] "start" must be a whole number'),
])
def test_broken_rows_index_is_one_line(tmp_path, capsys, text, expect):
    rows_file(tmp_path, 'a.npy', 4, 9)
    (tmp_path/'rows.json').write_text(text)
    assert expect in one_line(capsys, 'validate', tmp_path)
    assert expect in one_line(capsys, 'split', tmp_path/'rows.json', '--out', tmp_path/'s')


def test_bad_vocab_size_and_headers(corpus, capsys):
    assert '--vocab-size must be at least 1, got -5' in one_line(capsys, 'validate', corpus, '--vocab-size', '-5')
    good = (corpus/'shard_00000.npy').read_bytes()
    (corpus/'shard_00000.npy').write_bytes(good.replace(b"(6, 9), }", b"(-6, 9),}"))
    err = one_line(capsys, 'validate', corpus, code=1)  # a bad file: validate names it and exits 1
    assert 'shard_00000.npy: the header gives a negative shape (-6, 9)' in err
    assert 'the header gives a negative shape' in one_line(capsys, 'split', corpus, '--out', corpus.parent/'s')
    np.save(corpus/'shard_00000.npy', np.array([[1, 'x']], dtype=object))
    assert 'shard_00000.npy: object dtype: expected integer token ids' in one_line(capsys, 'validate', corpus, code=1)
    with pytest.raises(LegalnbError, match='object dtype'): open_rows(corpus/'shard_00000.npy')


def test_split_output_is_never_an_input(corpus, tmp_path, capsys):
    before = {p.name: p.read_bytes() for p in corpus.iterdir()}
    assert f'--out {corpus} is also an input' in one_line(capsys, 'split', corpus, '--out', corpus)
    f = corpus/'shard_00000.npy'
    assert f'--out {f} is also an input' in one_line(capsys, 'split', f, '--out', f)
    assert '--out is required' in one_line(capsys, 'split', corpus)
    assert {p.name: p.read_bytes() for p in corpus.iterdir()} == before


@pytest.mark.parametrize('umask', [0o022, 0o002])
def test_split_files_get_the_mode_of_a_plain_open(corpus, tmp_path, umask):
    old = os.umask(umask)
    try: split(corpus, tmp_path/'new'/'split', val_ratio=0.25, by='rows')  # its parent is made too
    finally: os.umask(old)
    s = tmp_path/'new'/'split'
    assert (s/'split.json').stat().st_mode & 0o777 == (s/'train'/'rows.json').stat().st_mode & 0o777 == 0o666 & ~umask
    assert s.stat().st_mode & 0o777 == (s/'train').stat().st_mode & 0o777 == 0o777 & ~umask


def test_failed_split_leaves_no_folder(corpus, tmp_path):
    rows_file(corpus, 'extra.npy', 1, 9)
    with pytest.raises(LegalnbError, match='1 row'): split(corpus/'extra.npy', tmp_path/'a'/'b'/'split')
    assert not (tmp_path/'a').exists()


def test_validate_and_split_flags_are_declared_once(capsys, monkeypatch):
    monkeypatch.setenv('COLUMNS', '200')
    with pytest.raises(SystemExit): cli(['split', '--help'])
    out = capsys.readouterr().out
    assert '--val-ratio VAL_RATIO' in out and 'if not given 0.01' in out and out.count('0.01') == 1
    assert "{auto,documents,files,rows}" in out and '(default: auto)' in out
    with pytest.raises(SystemExit): cli(['validate', '--help'])
    out = capsys.readouterr().out
    assert all(f in out for f in ('--vocab-size', '--json', '--recommend'))


# ---- document boundaries and the held-out split (issue 13, issue 14) ---------------------------------------------

def word_corpus(tmp_path: Path, texts: list[str], seq_len: int, **kw) -> tuple[Path, dict]:
    "A corpus built from `texts` with a word-level tokenizer: <|endoftext|> = 0, word `wN` = N."
    from tokenizers import Tokenizer, models, pre_tokenizers
    from legalnb.corpus import CorpusConfig, build_corpus
    from legalnb.sources import write_jsonl
    tok = Tokenizer(models.WordLevel({'<|endoftext|>': 0, **{f'w{i}': i for i in range(1, 40)}}, unk_token='<|endoftext|>'))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(['<|endoftext|>'])
    tok.save(str(tmp_path/'tok.json'))
    write_jsonl([dict(celex=f'320{10 + i}R0001', title='t', text=t, lang='en') for i, t in enumerate(texts)],
                tmp_path/'s.jsonl')
    m = build_corpus(CorpusConfig(tmp_path/'s.jsonl', tmp_path/'corpus', seq_len=seq_len, tokenizer=tmp_path/'tok.json',
                     progress=False, **kw))
    return tmp_path/'corpus', m


def test_doc_starts_per_row_match_a_packing_by_hand(tmp_path):
    # documents [1 2] [3 4 5 6] [7] [8 9 10] [11 12 13 14 15 16] + EOS, rows of 5 (seq_len 4):
    # 1 2 0 3 4 | 5 6 0 7 0 | 8 9 10 0 11 | 12 13 14 15 16 | 0 (tail); starts at 0, 3, 8, 10, 14
    c, m = word_corpus(tmp_path, ['w1 w2', 'w3 w4 w5 w6', 'w7', 'w8 w9 w10', 'w11 w12 w13 w14 w15 w16'], 4, shards=2)
    rows = np.concatenate([np.load(c/s['file']) for s in m['shards']])
    assert rows.tolist() == [[1, 2, 0, 3, 4], [5, 6, 0, 7, 0], [8, 9, 10, 0, 11], [12, 13, 14, 15, 16]]
    T, F = True, False
    # row 0: starts at inputs 0 and 3; row 1: document [7] at input 3; row 2: [8 9 10] at input 0, and [11 ...] at
    # position 4, a target only, so not marked; row 3 begins inside document [11 ... 16]
    expected = [[T, F, F, T], [F, F, F, T], [T, F, F, F], [F, F, F, F]]
    ds = PretokenizedDataset(c, doc_starts=True)
    assert [ds[i][2].tolist() for i in range(4)] == expected and ds.missing_doc_starts == []
    x, y, s = ds[[3, 0, 2]]
    assert s.tolist() == [expected[3], expected[0], expected[2]] and s.dtype == torch.bool and s.shape == (3, 4)
    assert torch.equal(x, ds[[3, 0, 2]][0]) and len(PretokenizedDataset(c)[0]) == 2, 'off by default: pairs'
    for by in ('files', 'rows'):  # links and rows.json indexes find the same starts
        assert cli(['split', str(c), '--out', str(tmp_path/by), '--by', by, '--val-ratio', '0.5', '--seed', '1']) == 0
        both = [PretokenizedDataset(tmp_path/by/side, doc_starts=True) for side in ('train', 'val')]
        got = sorted((tuple(d[i][0].tolist()), tuple(d[i][2].tolist())) for d in both for i in range(len(d)))
        assert got == sorted((tuple(r[:-1]), tuple(e)) for r, e in zip(rows.tolist(), expected)), by


def test_rows_without_doc_starts_are_one_sequence(shards):
    d, rows = shards
    ds = PretokenizedDataset(d, doc_starts=True)
    assert len(ds.missing_doc_starts) == 4 and not ds[list(range(len(ds)))][2].any()
    assert torch.equal(ds[3][0], PretokenizedDataset(d)[3][0])


def test_doc_starts_through_loader_workers_keep_the_order(tmp_path):
    c, m = word_corpus(tmp_path, [' '.join(f'w{(i * 7 + j) % 39 + 1}' for j in range(i % 9 + 1)) for i in range(120)], 7,
                       shards=3)
    ds, order = PretokenizedDataset(c, doc_starts=True), StepSampler(m['rows'], batch_size=4, seed=2, max_steps=10)
    here = list(make_loader(ds, order, num_workers=0))
    there = list(make_loader(ds, order, num_workers=2))
    assert len(here) == 10 and all(len(a) == 3 and all(torch.equal(u, v) for u, v in zip(a, b)) for a, b in zip(here, there))
    x, _, s = here[0]
    assert (x[:, :-1][s[:, 1:]] == 0).all(), 'every marked start follows an EOS'
    assert s[:, 1:].sum() == (x[:, :-1] == 0).sum(), 'and every EOS inside a row is followed by a marked start'


def test_split_of_a_corpus_with_heldout_acts_is_by_documents(tmp_path, capsys):
    texts = [' '.join(f'w{(i * 5 + j) % 39 + 1}' for j in range(8 + i % 5)) for i in range(40)]
    c, m = word_corpus(tmp_path, texts, 7, shards=2, val_docs=0.25)
    assert cli(['split', str(c), '--out', str(tmp_path/'split')]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mode documents: val/ = the corpus's held-out acts (build-corpus --val-docs): no act on both")
    info = json.loads((tmp_path/'split'/'split.json').read_text())
    assert info['mode'] == 'documents' and info['val_ratio'] is None and info['val']['rows'] == m['heldout']['rows']
    assert info['linked'] == ['manifest.json', 'tokenizer.json', 'heldout.jsonl']
    assert (tmp_path/'split'/'heldout.jsonl').read_bytes() == (c/'heldout.jsonl').read_bytes()
    train, val = (PretokenizedDataset(tmp_path/'split'/side, doc_starts=True) for side in ('train', 'val'))
    assert len(train) == m['rows'] and val.vocab_size == m['vocab_size'] and val.missing_doc_starts == []
    assert torch.equal(val[0][0], torch.from_numpy(np.load(c/'val'/'shard_00000.npy')[0, :-1].astype(np.int64)))
    for folder in (tmp_path/'split'/'train', tmp_path/'split'/'val', c/'val', c):  # rows checked against the manifest
        rep = validate(folder)
        assert rep.ok and rep.vocab_size == m['vocab_size'], (folder, rep.problems)
    assert validate(c/'val').rows == m['heldout']['rows'] and PretokenizedDataset(c/'val').vocab_size == m['vocab_size']
    assert cli(['split', str(c), '--out', str(tmp_path/'by-docs'), '--by', 'documents']) == 0
    # asked for rows: the training shards are cut by rows, and it says so
    assert cli(['split', str(c), '--out', str(tmp_path/'rows'), '--by', 'rows', '--val-ratio', '0.2']) == 0
    out = capsys.readouterr().out
    assert 'mode rows: val/ = a block of rows, cut without regard to documents (data without held-out acts)' in out
    assert json.loads((tmp_path/'rows'/'split.json').read_text())['mode'] == 'rows'
    assert 'heldout.jsonl' in json.loads((tmp_path/'rows'/'split.json').read_text())['linked']
    err = one_line(capsys, 'split', c, '--out', tmp_path/'s', '--val-ratio', '0.1')
    assert f'--val-ratio does not apply to {c}: its held-out acts (build-corpus --val-docs) are the validation side' in err
    assert not (tmp_path/'s').exists()


def test_row_mode_still_splits_pretokenized_data_and_says_so(tmp_path, capsys):
    rows_file(tmp_path, 'fineweb.npy', 50, 17)
    assert cli(['split', str(tmp_path/'fineweb.npy'), '--out', str(tmp_path/'split'), '--val-ratio', '0.1']) == 0
    assert capsys.readouterr().out.startswith('mode rows: val/ = a block of rows, cut without regard to documents')
    assert json.loads((tmp_path/'split'/'split.json').read_text())['mode'] == 'rows'
    err = one_line(capsys, 'split', tmp_path/'fineweb.npy', '--out', tmp_path/'s2', '--by', 'documents')
    assert f'{tmp_path/"fineweb.npy"}: --by documents needs a corpus with held-out acts, and this one has none' in err


def test_broken_doc_starts_are_one_line(corpus):
    (corpus/'doc_starts').mkdir()
    np.save(corpus/'doc_starts'/'shard_00000.npy', np.array([5, 2]))
    with pytest.raises(LegalnbError, match=r'doc_starts/shard_00000.npy: the document starts of shard_00000.npy must '
                                           r'increase and lie in \[0, 54\)'):
        PretokenizedDataset(corpus, doc_starts=True)[0]
    np.save(corpus/'doc_starts'/'shard_00000.npy', np.array([1.5]))
    with pytest.raises(LegalnbError, match='must be a 1-D integer array'): PretokenizedDataset(corpus, doc_starts=True)[0]
    assert len(PretokenizedDataset(corpus, doc_starts=True)[6]) == 3, 'the other shard has no starts: all False'
