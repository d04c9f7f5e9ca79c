"End-to-end, CLI, failure and multi-process tests of `legalnb build-corpus` (legalnb.corpus)."
import json, os, random, signal, subprocess, sys, textwrap, time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from legalnb.cli import main
from legalnb.corpus import CorpusConfig, build_corpus, iter_selected, load_tokenizer, split_text
from legalnb.core import LegalnbError
from legalnb.sources import write_jsonl

ROOT = Path(__file__).resolve().parents[1]


def word_tokenizer(dest: Path, words: list[str]) -> Path:
    "A word-level tokenizer: <|endoftext|> = 0, then each word in order, so ids are known by hand."
    vocab = {'<|endoftext|>': 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token='<|endoftext|>'))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(['<|endoftext|>'])
    tok.save(str(dest))
    return dest


def docs(path: Path, texts: list[str], langs=None) -> Path:
    "A selected.jsonl with these texts."
    langs = langs or ['en'] * len(texts)
    write_jsonl([dict(celex=f'3202{i}R0001', title=f't{i}', text=t, lang=l, date=None, doc_type='regulation', subjects=[], source='x')
                 for i, (t, l) in enumerate(zip(texts, langs))], path)
    return path


def synthetic(path: Path, n: int, seed: int = 0) -> Path:
    "`n` documents of random legal-ish words in three languages."
    rng = random.Random(seed)
    words = 'the member states shall ensure that commission data protection authority article paragraph annex regulation'.split()
    texts = ['\n\n'.join(' '.join(rng.choice(words) for _ in range(rng.randint(5, 80))) for _ in range(rng.randint(1, 5))) for _ in range(n)]
    return docs(path, texts, ['en', 'de', 'fr'] * (n // 3) + ['en'] * (n % 3))


def tree_bytes(d: Path) -> dict:
    "Every file of a corpus folder and its bytes."
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob('*')) if p.is_file()}


@pytest.fixture
def tok10(tmp_path):
    return word_tokenizer(tmp_path/'tok.json', [f'w{i}' for i in range(1, 20)])


def test_exact_packing_by_hand(tmp_path, tok10):
    # docs: [1 2 3] [4 5] [6 7 8 9 10] -> stream 1 2 3 0 | 4 5 0 6 | 7 8 9 10 | 0 (row_len 4: seq_len 3)
    sel = docs(tmp_path/'s.jsonl', ['w1 w2 w3', 'w4 w5', 'w6 w7 w8 w9 w10'], ['en', 'de', 'en'])
    m = build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=3, shards=1, tokenizer=tok10, progress=False))
    rows = np.load(tmp_path/'c'/'shard_00000.npy')
    assert rows.dtype == np.uint16 and rows.tolist() == [[1, 2, 3, 0], [4, 5, 0, 6], [7, 8, 9, 10]]
    assert np.load(tmp_path/'c'/'doc_starts'/'shard_00000.npy').tolist() == [0, 4, 7]
    assert (m['rows'], m['tokens'], m['dropped_tail_tokens'], m['eos_id'], m['documents']) == (3, 12, 1, 0, 3)
    assert m['tokens_per_lang'] == {'de': 3, 'en': 9} and m['row_len'] == 4 and m['seq_len'] == 3
    assert m['format'] == 'legalnb.corpus/1' and m['tokenizer'] == 'tokenizer.json' and m['special_ids'] == {'<|endoftext|>': 0}
    assert load_tokenizer(tmp_path/'c').encode('w1 w9').ids == [1, 9]


def test_saved_tokenizer_folder_and_its_eos(tmp_path, tok10):
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tok10), eos_token='w19')  # the folder's config names its EOS
    hf.save_pretrained(tmp_path/'hf')
    m = build_corpus(CorpusConfig(docs(tmp_path/'s.jsonl', ['w1 w2 w3', 'w4 w5 w6 w7']), tmp_path/'c', seq_len=4, shards=1, tokenizer=tmp_path/'hf', progress=False))
    assert m['eos_id'] == 19 and np.load(tmp_path/'c'/'shard_00000.npy').tolist() == [[1, 2, 3, 19, 4]]
    assert m['dropped_tail_tokens'] == 4 and (tmp_path/'c'/'tokenizer.json').is_file()
    m = build_corpus(CorpusConfig(tmp_path/'s.jsonl', tmp_path/'d', seq_len=4, shards=1, tokenizer=tmp_path/'hf', eos='<|endoftext|>', progress=False))
    assert m['eos_id'] == 0 and m['args']['eos'] == '<|endoftext|>'


def test_rows_continue_across_shards(tmp_path, tok10):
    # 12 one-word documents -> 24 tokens -> 6 rows of 4; 3 shards split the input bytes, the stream stays continuous
    sel = docs(tmp_path/'s.jsonl', [f'w{i % 9 + 1}' for i in range(12)])
    m = build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=3, shards=3, tokenizer=tok10, progress=False))
    flat = np.concatenate([np.load(tmp_path/'c'/s['file']).reshape(-1) for s in m['shards']])
    assert flat.tolist() == [t for i in range(12) for t in (i % 9 + 1, 0)] and m['dropped_tail_tokens'] == 0
    assert [s['rows'] for s in m['shards']] == [2, 2, 2] and sum(s['documents'] for s in m['shards']) == 12
    for s in m['shards']:  # every recorded start is right after an EOS (or at the shard's first token after one)
        starts, rows = np.load(tmp_path/'c'/s['doc_starts']), np.load(tmp_path/'c'/s['file']).reshape(-1)
        assert all(st == 0 or rows[st - 1] == 0 for st in starts) and len(starts) == s['documents']


@pytest.mark.parametrize('vocab,dtype', [(65_536, np.uint16), (65_537, np.uint32)])
def test_dtype_at_the_uint16_boundary(tmp_path, vocab, dtype):
    tok = word_tokenizer(tmp_path/'tok.json', [f'w{i}' for i in range(1, vocab)])
    top = f'w{vocab - 1}'  # the largest id: 65535 fits uint16, 65536 would wrap to 0
    m = build_corpus(CorpusConfig(docs(tmp_path/'s.jsonl', [f'w1 {top} w2']), tmp_path/'c', seq_len=3, shards=1, tokenizer=tok, progress=False))
    rows = np.load(tmp_path/'c'/'shard_00000.npy', mmap_mode='r')
    assert rows.dtype == dtype and m['dtype'] == np.dtype(dtype).name and m['vocab_size'] == vocab
    assert rows.tolist() == [[1, vocab - 1, 2, 0]]


def test_vocabulary_with_gaps_sizes_by_largest_id(tmp_path):
    tok = Tokenizer(models.WordLevel({'<|endoftext|>': 0, 'a': 1, 'b': 70_000}, unk_token='<|endoftext|>'))  # 3 tokens, largest id 70000
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path/'tok.json'))
    m = build_corpus(CorpusConfig(docs(tmp_path/'s.jsonl', ['a b a']), tmp_path/'c', seq_len=3, shards=1, tokenizer=tmp_path/'tok.json', progress=False))
    assert m['vocab_size'] == 70_001 and m['dtype'] == 'uint32'
    assert np.load(tmp_path/'c'/'shard_00000.npy').tolist() == [[1, 70_000, 1, 0]]


def test_determinism_and_num_proc(tmp_path):
    sel = synthetic(tmp_path/'s.jsonl', 400)
    a = build_corpus(CorpusConfig(sel, tmp_path/'a', seq_len=31, shards=4, train_tokenizer=300, progress=False))
    b = build_corpus(CorpusConfig(sel, tmp_path/'b', seq_len=31, shards=4, train_tokenizer=300, num_proc=2, progress=False), batch_chars=3000)
    assert tree_bytes(tmp_path/'a') == tree_bytes(tmp_path/'b') and a == b
    assert a['rows'] > 40 and all(s['rows'] > 0 for s in a['shards'])
    # the packed stream is the selection encoded document by document, one EOS after each
    tok = load_tokenizer(tmp_path/'a')
    expected = np.concatenate([np.append(tok.encode(r['text']).ids, a['eos_id']) for *_, r in iter_selected(sel)])
    got = np.concatenate([np.load(tmp_path/'a'/s['file']).reshape(-1) for s in a['shards']])
    assert (got == expected[:len(got)]).all() and len(expected) - len(got) == a['dropped_tail_tokens'] < 32


def test_rerun_is_up_to_date(tmp_path, tok10):
    sel = synthetic(tmp_path/'s.jsonl', 60)
    m = build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=2, train_tokenizer=300, progress=False))
    seen = []
    assert build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=2, train_tokenizer=300, progress=False), on_shard=seen.append) == m and seen == []
    (tmp_path/'c'/'shard_00001.npy').write_bytes(b'broken')  # a damaged shard is rebuilt, not trusted
    assert build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=2, train_tokenizer=300, progress=False)) == m
    assert np.load(tmp_path/'c'/'shard_00001.npy').shape[1] == 16


def test_resume_after_exception(tmp_path):
    sel = synthetic(tmp_path/'s.jsonl', 300)
    ref = build_corpus(CorpusConfig(sel, tmp_path/'ref', seq_len=15, shards=5, train_tokenizer=300, progress=False))

    def crash(rec):
        if rec['file'] == 'shard_00002.npy': raise RuntimeError('crash')
    with pytest.raises(RuntimeError): build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=5, train_tokenizer=300, progress=False), on_shard=crash)
    partial = json.loads((tmp_path/'c'/'manifest.partial.json').read_text())
    assert [s['file'] for s in partial['shards']] == ['shard_00000.npy', 'shard_00001.npy', 'shard_00002.npy']
    (tmp_path/'c'/'shard_00002.npy').write_bytes(b'corrupt')  # a shard that fails its checksum is redone
    seen = []
    m = build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=5, train_tokenizer=300, progress=False), on_shard=lambda r: seen.append(r['file']))
    assert seen == ['shard_00002.npy', 'shard_00003.npy', 'shard_00004.npy'] and m == ref
    assert tree_bytes(tmp_path/'c') == tree_bytes(tmp_path/'ref') and not (tmp_path/'c'/'manifest.partial.json').exists()


KILLER = '''
import os, signal, sys
from legalnb.corpus import CorpusConfig, build_corpus
def kill(rec):
    if rec['file'] == 'shard_00001.npy': os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no finally
build_corpus(CorpusConfig(sys.argv[1], sys.argv[2], seq_len=15, shards=4, train_tokenizer=300, num_proc=2, progress=False), batch_chars=2000, on_shard=kill)
'''


def test_resume_after_sigkill(tmp_path):
    sel = synthetic(tmp_path/'s.jsonl', 300)
    ref = build_corpus(CorpusConfig(sel, tmp_path/'ref', seq_len=15, shards=4, train_tokenizer=300, progress=False))
    r = subprocess.run([sys.executable, '-c', KILLER, str(sel), str(tmp_path/'c')], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not (tmp_path/'c'/'manifest.json').exists() and (tmp_path/'c'/'shard_00001.npy').exists()
    seen = []
    m = build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=4, train_tokenizer=300, progress=False), on_shard=lambda r: seen.append(r['file']))
    assert seen == ['shard_00002.npy', 'shard_00003.npy'] and m == ref and tree_bytes(tmp_path/'c') == tree_bytes(tmp_path/'ref')


@pytest.mark.parametrize('extra', [[], ['--val-docs', '0.05']])
def test_resume_after_kill_at_any_moment(tmp_path, extra):
    "Kill the CLI at an arbitrary moment (maybe mid-shard, maybe mid-document); the rerun gives the same bytes."
    sel = synthetic(tmp_path/'s.jsonl', 3000, seed=1)
    cmd = [sys.executable, '-m', 'legalnb.cli', 'build-corpus', str(sel), '--seq-len', '15', '--shards', '8', '--train-tokenizer', '300', '--no-progress', *extra]
    p = subprocess.Popen(cmd + ['--out', str(tmp_path/'c')], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not (tmp_path/'c'/'manifest.partial.json').exists() and p.poll() is None and time.time() < deadline: time.sleep(0.02)
    p.kill(); p.wait()
    assert subprocess.run(cmd + ['--out', str(tmp_path/'c')], capture_output=True).returncode == 0
    assert subprocess.run(cmd + ['--out', str(tmp_path/'ref')], capture_output=True).returncode == 0
    assert tree_bytes(tmp_path/'c') == tree_bytes(tmp_path/'ref')
    assert not [p for p in (tmp_path/'c').rglob('.*tmp')], 'no temporary file left behind'


def test_long_documents_split_and_no_whitespace(tmp_path, tok10):
    # a 3 MB document with no paragraph breaks is split at spaces; ids equal encoding it whole
    text = ' '.join(f'w{i % 19 + 1}' for i in range(1_000_000))
    assert max(map(len, split_text(text, 100_000))) <= 100_000
    m = build_corpus(CorpusConfig(docs(tmp_path/'s.jsonl', [text, 'w1 w2']), tmp_path/'c', seq_len=999, shards=2, tokenizer=tok10, progress=False))
    got = np.concatenate([np.load(tmp_path/'c'/s['file']).reshape(-1) for s in m['shards']])
    want = np.array([i % 19 + 1 for i in range(1_000_000)] + [0, 1, 2, 0])
    assert (got == want[:len(got)]).all() and m['documents_read'] == 2
    # no whitespace at all: cut at max_chars
    assert split_text('x' * 250_000, 100_000) == ['x' * 100_000] * 2 + ['x' * 50_000]


def test_50_mb_document(tmp_path):
    "A 50 MB document is split at its paragraph breaks and packed like any other (long words keep the token count small)."
    words = [f'{w}{"x" * 36}' for w in ('member', 'states', 'shall', 'ensure')]
    tok = word_tokenizer(tmp_path/'tok.json', words + ['Article'])
    para = ' '.join(words * 25) + '\n\n'  # 100 words, one paragraph
    big = para * (50_000_000 // len(para))
    sel = docs(tmp_path/'s.jsonl', ['Article', big, 'Article'])
    assert sel.stat().st_size > 50_000_000
    m = build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=4095, shards=4, tokenizer=tok, num_proc=2, progress=False))
    n = 1 + 1 + big.count(' ') + big.count('\n\n') + 1 + 2  # Article EOS, the big one's words and EOS, Article EOS
    assert m['documents_read'] == 3 and m['tokens'] + m['dropped_tail_tokens'] == n and all(s['rows'] > 0 for s in m['shards'])
    row = np.load(tmp_path/'c'/'shard_00000.npy', mmap_mode='r')[0]
    assert row[:6].tolist() == [5, 0, 1, 2, 3, 4]


def error(capsys, *argv) -> str:
    "Run the CLI, expect exit code 2 and one line on stderr; return it."
    assert main(['build-corpus', *map(str, argv), '--no-progress']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith('legalnb build-corpus: error: ')
    return err


def test_bad_input(tmp_path, tok10, capsys):
    sel = synthetic(tmp_path/'s.jsonl', 30)
    (tmp_path/'empty.jsonl').write_text('\n')
    assert 'empty.jsonl: empty selection' in error(capsys, tmp_path/'empty.jsonl', '--out', tmp_path/'o1', '--train-tokenizer', 300)
    assert 'nope: no tokenizer there' in error(capsys, sel, '--out', tmp_path/'o2', '--tokenizer', tmp_path/'nope')
    assert '--seq-len must be at least 2' in error(capsys, sel, '--out', tmp_path/'o3', '--seq-len', 1, '--tokenizer', tok10)
    err = error(capsys, sel, '--out', tmp_path/'o4', '--seq-len', 4000, '--shards', 8, '--tokenizer', tok10)
    assert 'no rows for this shard' in err and 'shard_00000.npy' in err
    bad = tmp_path/'bad.jsonl'
    bad.write_text(sel.read_text() + '{"text": "w1 w2"\n')
    assert 'bad.jsonl, line 31: not JSON' in error(capsys, bad, '--out', tmp_path/'o5', '--seq-len', 3, '--shards', 1, '--tokenizer', tok10)
    bad.write_text('{"celex": "x", "text": 5}\n')
    assert 'bad.jsonl, line 1: the document has "text": 5; expected a string' in error(capsys, bad, '--out', tmp_path/'o6', '--tokenizer', tok10)
    bad.write_text(sel.read_text() * 3 + 'oops\n')  # broken after two shards were finished: they are removed too
    assert 'bad.jsonl, line 91: not JSON' in error(capsys, bad, '--out', tmp_path/'o7', '--seq-len', 3, '--shards', 4, '--tokenizer', tok10)
    assert not (tmp_path/'o7').exists(), 'a folder the failed build created is removed'
    (tmp_path/'garbage.json').write_text('{"model": 1}')
    assert 'garbage.json: not a Hugging Face tokenizer.json' in error(capsys, sel, '--out', tmp_path/'o8', '--tokenizer', tmp_path/'garbage.json')
    for i in range(1, 9):  # nothing new: no folder, no shard, partial or temporary file anywhere
        assert not (tmp_path/f'o{i}').exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.')], 'no hidden sibling or temporary file'
    with pytest.raises(LegalnbError, match='either a tokenizer'): build_corpus(CorpusConfig(sel, tmp_path/'o9'))


def test_cli_subprocess_summary(tmp_path, tok10):
    sel = docs(tmp_path/'s.jsonl', ['w1 w2 w3', 'w4 w5', 'w6 w7 w8 w9 w10'])
    r = subprocess.run([sys.executable, '-m', 'legalnb.cli', 'build-corpus', str(sel), '--out', str(tmp_path/'c'), '--seq-len', '3',
                        '--shards', '1', '--tokenizer', str(tok10), '--num-proc', '2'], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert 'wrote 1 shards: 3 rows x 4 tokens (uint16), 12 tokens from 3 documents' in r.stdout and 'dropped tail 1 tokens' in r.stdout
    r = subprocess.run([sys.executable, '-m', 'legalnb.cli', 'build-corpus', str(sel), '--out', str(tmp_path/'d'), '--seq-len', '0',
                        '--tokenizer', str(tok10)], capture_output=True, text=True)
    assert r.returncode == 2 and 'Traceback' not in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ---- nothing lost (issue 11): rebuilds, folders of the user, outputs that are inputs ------------------------------

def snapshot(d: Path) -> dict:
    "Every path under `d` with its bytes and mode."
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None, p.stat().st_mode) for p in sorted(d.rglob('*'))}


@pytest.fixture
def good(tmp_path):
    "A selection and a finished corpus built from it (seq_len 15, 3 shards, trained tokenizer)."
    sel = synthetic(tmp_path/'s.jsonl', 120)
    build_corpus(CorpusConfig(sel, tmp_path/'C', seq_len=15, shards=3, train_tokenizer=300, progress=False))
    return sel, tmp_path/'C'


def test_failed_rebuild_leaves_the_old_corpus_byte_identical(tmp_path, good, capsys):
    sel, c = good
    before = snapshot(c)
    err = error(capsys, sel, '--out', c, '--seq-len', 15, '--shards', 5000, '--train-tokenizer', 300)
    assert f'{c}/shard_' in err and 'no rows for this shard' in err and '.rebuild' not in err
    assert snapshot(c) == before
    bad = tmp_path/'bad.jsonl'
    bad.write_text(sel.read_text() + '{"text": "broken\n')
    assert 'bad.jsonl, line 121: not JSON' in error(capsys, bad, '--out', c, '--seq-len', 15, '--shards', 3, '--tokenizer', c)
    write_jsonl([dict(celex='x', text='', lang='en')] * 4, tmp_path/'blank.jsonl')
    assert 'blank.jsonl: no text to tokenize' in error(capsys, tmp_path/'blank.jsonl', '--out', c, '--train-tokenizer', 300)
    assert snapshot(c) == before and sorted(p.name for p in tmp_path.iterdir()) == ['C', 'bad.jsonl', 'blank.jsonl', 's.jsonl']


def test_rebuild_replaces_the_corpus_only_when_finished(tmp_path, good):
    sel, c = good
    ref = build_corpus(CorpusConfig(sel, tmp_path/'ref', seq_len=7, shards=3, train_tokenizer=300, progress=False))
    m = build_corpus(CorpusConfig(sel, c, seq_len=7, shards=3, train_tokenizer=300, progress=False))
    assert m == ref and tree_bytes(c) == tree_bytes(tmp_path/'ref') and not (tmp_path/'.C.rebuild').exists()


REBUILD_KILLER = KILLER.replace('seq_len=15, shards=4', 'seq_len=7, shards=4')


def test_killed_rebuild_keeps_the_old_corpus_and_resumes(tmp_path, good):
    sel, c = good
    before = snapshot(c)
    r = subprocess.run([sys.executable, '-c', REBUILD_KILLER, str(sel), str(c)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert snapshot(c) == before and (tmp_path/'.C.rebuild'/'manifest.partial.json').is_file()
    seen = []
    m = build_corpus(CorpusConfig(sel, c, seq_len=7, shards=4, train_tokenizer=300, progress=False), on_shard=lambda r: seen.append(r['file']))
    ref = build_corpus(CorpusConfig(sel, tmp_path/'ref', seq_len=7, shards=4, train_tokenizer=300, progress=False))
    assert seen == ['shard_00002.npy', 'shard_00003.npy'] and m == ref and tree_bytes(c) == tree_bytes(tmp_path/'ref')
    assert not (tmp_path/'.C.rebuild').exists()


@pytest.mark.parametrize('name,data', [('shard_00007.npy', b'mine'), ('manifest.json', b'{"mine": 1}'),
                                       ('notes/readme.txt', b'my notes'), ('doc_starts/shard_00000.npy', b'x')])
def test_folder_of_the_user_is_refused(tmp_path, capsys, name, data):
    sel = synthetic(tmp_path/'s.jsonl', 30)
    (tmp_path/'mine'/name).parent.mkdir(parents=True, exist_ok=True); (tmp_path/'mine'/name).write_bytes(data)
    before = snapshot(tmp_path/'mine')
    err = error(capsys, sel, '--out', tmp_path/'mine', '--train-tokenizer', 300)
    assert f'--out {tmp_path/"mine"} holds files legalnb did not write ({name})' in err
    assert snapshot(tmp_path/'mine') == before


def test_files_added_to_a_corpus_are_refused(tmp_path, good, capsys):
    sel, c = good
    (c/'split').mkdir(); (c/'split'/'split.json').write_text('{}')
    before = snapshot(c)
    assert 'holds files legalnb did not write (split/split.json)' in error(capsys, sel, '--out', c, '--seq-len', 7, '--train-tokenizer', 300)
    assert snapshot(c) == before


def test_output_that_is_an_input_is_refused(tmp_path, capsys):
    sel = synthetic(tmp_path/'s.jsonl', 30)
    before = sel.read_bytes()
    assert f'--out {sel} is also an input' in error(capsys, sel, '--out', sel, '--train-tokenizer', 300)
    assert 'holds files legalnb did not write (s.jsonl)' in error(capsys, sel, '--out', tmp_path, '--train-tokenizer', 300)
    (tmp_path/'f.txt').write_text('x')
    assert 'is a file; expected a folder' in error(capsys, sel, '--out', tmp_path/'f.txt', '--train-tokenizer', 300)
    assert sel.read_bytes() == before and (tmp_path/'f.txt').read_text() == 'x'


def test_killed_before_the_first_shard_is_resumed(tmp_path):
    "A build killed in its first second (only its partial manifest and tokenizer exist) is the build's own folder."
    sel = synthetic(tmp_path/'s.jsonl', 60)
    ref = build_corpus(CorpusConfig(sel, tmp_path/'ref', seq_len=15, shards=2, train_tokenizer=300, progress=False))
    def crash(rec): raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt): build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=2, train_tokenizer=300, progress=False), on_shard=crash)
    partial = json.loads((tmp_path/'c'/'manifest.partial.json').read_text())
    assert partial['command'] == f'legalnb build-corpus {sel} --out {tmp_path/"c"} --seq-len 15 --shards 2 --train-tokenizer 300 --max-chars 100000'
    (tmp_path/'c'/'manifest.partial.json').write_text(json.dumps({**partial, 'shards': []}))  # as if killed before shard 0
    assert build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=2, train_tokenizer=300, progress=False)) == ref
    assert tree_bytes(tmp_path/'c') == tree_bytes(tmp_path/'ref')


@pytest.mark.parametrize('umask', [0o022, 0o002])
def test_files_get_the_mode_of_a_plain_open(tmp_path, umask):
    old = os.umask(umask)
    try: build_corpus(CorpusConfig(synthetic(tmp_path/'s.jsonl', 30), tmp_path/'c', seq_len=15, shards=2, train_tokenizer=300, progress=False))
    finally: os.umask(old)
    modes = {str(p.relative_to(tmp_path/'c')): p.stat().st_mode & 0o777 for p in (tmp_path/'c').rglob('*')}
    assert modes == {**{k: 0o666 & ~umask for k in modes}, 'doc_starts': 0o777 & ~umask}, modes


def test_command_flags_are_declared_once(capsys, monkeypatch):
    monkeypatch.setenv('COLUMNS', '200')  # one line per flag
    with pytest.raises(SystemExit): main(['build-corpus', '--help'])
    out = capsys.readouterr().out
    assert '--seq-len SEQ_LEN' in out and '(default: 3072)' in out and out.count('3072') == 1
    assert '--tokenizer TOKENIZER' in out and '--train-tokenizer TRAIN_TOKENIZER' in out and '--no-progress' in out


def test_rebuild_killed_at_any_moment_is_the_old_or_the_new_corpus(tmp_path):
    "Kill a rebuild over a finished corpus at arbitrary moments: the folder always holds one whole corpus, never a mix."
    sel = synthetic(tmp_path/'s.jsonl', 3000, seed=1)
    args = ['--seq-len', '7', '--shards', '8', '--train-tokenizer', '300', '--no-progress']
    cmd = [sys.executable, '-m', 'legalnb.cli', 'build-corpus', str(sel), *args]
    build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=8, train_tokenizer=300, progress=False))
    t0 = time.perf_counter()
    assert subprocess.run(cmd + ['--out', str(tmp_path/'new')], capture_output=True).returncode == 0
    took = time.perf_counter() - t0   # a whole build on this machine under its present load: the kills fall inside it
    old, new = tree_bytes(tmp_path/'c'), tree_bytes(tmp_path/'new')
    assert '.legalnb-owned.json' in old and '.legalnb-owned.json' in new, 'each corpus with its record'
    rng = random.Random(0)
    for _ in range(3):   # any moment (each record is inside its corpus, swapped with it): always one whole corpus
        p = subprocess.Popen(cmd + ['--out', str(tmp_path/'c')], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 1.1) * took); p.kill(); p.wait()
        assert tree_bytes(tmp_path/'c') in (old, new)
    assert subprocess.run(cmd + ['--out', str(tmp_path/'c')], capture_output=True).returncode == 0
    assert tree_bytes(tmp_path/'c') == new and not (tmp_path/'.c.rebuild').exists(), 'no temporary file carried over'


def test_a_rebuild_holds_its_record_before_the_swap(tmp_path):
    "The new corpus carries its ownership record before it is swapped in (issue 48): a rebuild whose swap is refused "
    "(a file of the user's appeared in the folder meanwhile) is whole in .C.rebuild, its record included: the bytes "
    "of the same corpus built by the command, so a swap at any moment swaps the record with the corpus."
    sel = synthetic(tmp_path/'s.jsonl', 300, seed=1)
    assert main(['build-corpus', str(sel), '--out', str(tmp_path/'new'), '--seq-len', '7', '--shards', '2',
                 '--train-tokenizer', '300', '--no-progress']) == 0
    build_corpus(CorpusConfig(sel, tmp_path/'C', seq_len=15, shards=2, train_tokenizer=300, progress=False))
    def users_file(_): (tmp_path/'C'/'notes.md').write_text('mine')
    with pytest.raises(LegalnbError, match='the new corpus is finished in .*: move it yourself'):
        build_corpus(CorpusConfig(sel, tmp_path/'C', seq_len=7, shards=2, train_tokenizer=300, progress=False),
                     on_shard=users_file)
    assert tree_bytes(tmp_path/'.C.rebuild') == tree_bytes(tmp_path/'new')
    assert '.legalnb-owned.json' in tree_bytes(tmp_path/'new')


def test_a_swap_killed_half_way_is_finished_by_the_next_run(tmp_path, good):
    sel, c = good
    before, seen = tree_bytes(c), []
    c.rename(tmp_path/'.C.trash')  # killed after the old corpus was moved out, before the new one was moved in
    m = build_corpus(CorpusConfig(sel, c, seq_len=15, shards=3, train_tokenizer=300, progress=False), on_shard=seen.append)
    assert seen == [] and tree_bytes(c) == before and not (tmp_path/'.C.trash').exists(), 'the old corpus is back'
    (tmp_path/'.C.trash').mkdir(); (tmp_path/'.C.trash'/'shard_00002.npy').write_bytes(b'half deleted')
    assert build_corpus(CorpusConfig(sel, c, seq_len=15, shards=3, train_tokenizer=300, progress=False)) == m
    assert not (tmp_path/'.C.trash').exists() and tree_bytes(c) == before


# ---- held-out acts (issue 13): --val-docs ---------------------------------------------------------------------------

from legalnb.corpus import act_key, choose_heldout, heldout_acts, train_tokenizer, tokenizer_sha256
from legalnb.core import jsonl_records

ACT_WORDS = 'the member states shall ensure that commission data protection authority article paragraph annex'.split()


def acts_selection(path: Path, n_acts: int = 40, seed: int = 0) -> Path:
    "A selection of `n_acts` acts, each in 1-3 languages, some with a consolidated version or a corrigendum, shuffled."
    rng, recs = random.Random(seed), []
    for i in range(n_acts):
        base = f'3{2000 + i % 20}{"RLD"[i % 3]}{i:04d}'
        ids = [(base, lang) for lang in ['en', 'fr', 'de'][:rng.randint(1, 3)]]
        if i % 4 == 0: ids.append((f'0{base[1:]}-20200101', 'en'))   # a consolidated version
        if i % 5 == 0: ids.append((f'{base}R(01)', 'de'))            # a corrigendum
        for celex, lang in ids:
            text = ' '.join(rng.choice(ACT_WORDS) for _ in range(rng.randint(20, 120)))
            recs.append(dict(celex=celex, title=f'act {i}', text=text, lang=lang, date='2020-01-01', doc_type='regulation',
                             subjects=[], source='x'))
    rng.shuffle(recs)
    write_jsonl(recs, path)
    return path


def sides(sel: Path, c: Path) -> tuple[list[str], list[str]]:
    "The CELEX numbers of the training side (selection minus heldout.jsonl) and of the held-out side."
    held = [rec['celex'] for *_, rec in jsonl_records(c/'heldout.jsonl')]
    all_ = [rec['celex'] for *_, rec in jsonl_records(sel)]
    train = list(all_)
    for h in held: train.remove(h)
    return train, held


def base(celex: str) -> str:
    "The base CELEX by hand: drop a corrigendum and a consolidation date, sector 0 -> 3."
    celex = celex.split('-')[0].split('R(')[0]
    return '3' + celex[1:] if celex[0] == '0' else celex


def test_heldout_acts_are_celex_disjoint_with_every_version(tmp_path):
    sel = acts_selection(tmp_path/'s.jsonl')
    m = build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=2, train_tokenizer=300, val_docs=0.2, progress=False))
    train, held = sides(sel, tmp_path/'c')
    assert {base(c) for c in train}.isdisjoint({base(c) for c in held}), 'no act on both sides'
    assert sorted({base(c) for c in held}) == m['heldout_celex'] and len(m['heldout_celex']) == m['heldout']['acts'] >= 2
    every = [rec['celex'] for *_, rec in jsonl_records(sel)]
    assert sorted(held) == sorted(c for c in every if base(c) in m['heldout_celex']), 'every language and version held out'
    assert any(c.startswith('0') for c in held) and any('R(' in c for c in held), 'versions to hold out together'
    assert m['acts'] + m['heldout']['acts'] == 40 and m['documents_read'] + len(held) == len(every)
    assert m['heldout']['documents_read'] == len(held) and m['val_shards'][0]['file'] == 'val/shard_00000.npy'
    # the consolidated versions and corrigenda present in the selection sit with their act
    for c in every:
        if c.startswith('0') or 'R(' in c: assert (base(c) in m['heldout_celex']) == (c in held)


def test_heldout_lines_are_copied_and_the_shards_hold_the_other_documents(tmp_path, tok10):
    sel = docs(tmp_path/'s.jsonl', ['w1 w2', 'w3 w4 w5', 'w6', 'w7 w8 w9', 'w10 w11'])
    lines = sel.read_bytes().splitlines(keepends=True)
    held = {'32022R0001', '32023R0001'}  # documents 2 and 3 by their CELEX
    m = build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=3, shards=1, tokenizer=tok10, val_docs=2, seed=0, val_min_acts=0, progress=False))
    held = set(m['heldout_celex'])
    assert len(held) == 2
    kept = [l for l in lines if json.loads(l)['celex'] in held]
    assert (tmp_path/'c'/'heldout.jsonl').read_bytes() == b''.join(kept), 'the lines themselves, byte for byte'
    ids = lambda texts: [int(w[1:]) for t in texts for w in t.split() + ['w0']]  # w0 stands for EOS (id 0)
    train_texts = [json.loads(l)['text'] for l in lines if json.loads(l)['celex'] not in held]
    val_texts = [json.loads(l)['text'] for l in kept]
    got = np.load(tmp_path/'c'/'shard_00000.npy').reshape(-1).tolist()
    assert got == ids(train_texts)[:len(got)] and len(got) == m['tokens']
    val = np.load(tmp_path/'c'/'val'/'shard_00000.npy').reshape(-1).tolist()
    assert val == ids(val_texts)[:len(val)] and len(val) == m['heldout']['tokens']


def test_heldout_choice_is_a_function_of_the_seed_and_holds_the_share_of_the_text(tmp_path):
    sel = acts_selection(tmp_path/'s.jsonl', 60)
    # issue 52: a share of the text, not of the acts; a selection that gains acts may hold out other ones (stage 2 of
    # `legalnb run` names the first corpus's acts with --val-acts)
    a = build_corpus(CorpusConfig(sel, tmp_path/'a', seq_len=15, shards=2, train_tokenizer=300, val_docs=0.1, val_min_acts=0, progress=False))
    b = build_corpus(CorpusConfig(sel, tmp_path/'b', seq_len=15, shards=2, train_tokenizer=300, val_docs=0.1, val_min_acts=0, num_proc=2,
                     progress=False))
    assert tree_bytes(tmp_path/'a') == tree_bytes(tmp_path/'b'), 'same seed, same bytes'
    assert heldout_acts(sel, 0.1, seed=1, min_acts=0)[0] != set(a['heldout_celex'])
    more = tmp_path/'more.jsonl'
    more.write_bytes(sel.read_bytes() + acts_selection(tmp_path/'x.jsonl', 80, seed=5).read_bytes())
    for path, m in ((sel, a), (more, None)):
        h = choose_heldout(path, 0.1, min_acts=0)
        assert abs(h.chars / h.total_chars - 0.1) < 0.01 and (m is None or sorted(h.acts) == m['heldout_celex'])


def test_tokenizer_is_trained_on_the_training_side_only(tmp_path):
    sel = acts_selection(tmp_path/'s.jsonl')
    m = build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=1, train_tokenizer=300, val_docs=0.3, progress=False))
    train = [rec['text'] for *_, rec in jsonl_records(sel) if act_key(rec) not in set(m['heldout_celex'])]
    assert m['tokenizer_sha256'] == tokenizer_sha256(train_tokenizer(train, 300))


def test_heldout_build_resumes_in_each_part(tmp_path):
    sel = acts_selection(tmp_path/'s.jsonl', 60)
    kw = dict(seq_len=15, shards=3, train_tokenizer=300, val_docs=0.2, progress=False)
    ref = build_corpus(CorpusConfig(sel, tmp_path/'ref', **kw))
    for stop in ('shard_00001.npy', 'val/shard_00000.npy'):
        def crash(rec):
            if rec['file'] == stop: raise RuntimeError('crash')
        c = tmp_path/stop.replace('/', '_')
        with pytest.raises(RuntimeError): build_corpus(CorpusConfig(sel, c, **kw), on_shard=crash)
        assert (c/'heldout.jsonl').is_file() and not (c/'manifest.json').exists()
        seen = []
        assert build_corpus(CorpusConfig(sel, c, **kw), on_shard=lambda r: seen.append(r['file'])) == ref
        assert seen == (['shard_00002.npy', 'val/shard_00000.npy'] if stop == 'shard_00001.npy' else [])
        assert tree_bytes(c) == tree_bytes(tmp_path/'ref')
    (tmp_path/'ref'/'heldout.jsonl').write_bytes(b'damaged')  # not up to date any more: rebuilt to the same bytes
    c2 = tmp_path/'shard_00001.npy'
    assert build_corpus(CorpusConfig(sel, tmp_path/'ref', **kw)) == ref and tree_bytes(tmp_path/'ref') == tree_bytes(c2)


HELD_KILLER = KILLER.replace('progress=False', 'val_docs=0.2, progress=False')


def test_killed_heldout_build_resumes_and_its_files_are_its_own(tmp_path):
    sel = acts_selection(tmp_path/'s.jsonl', 60)
    r = subprocess.run([sys.executable, '-c', HELD_KILLER, str(sel), str(tmp_path/'c')], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert (tmp_path/'c'/'heldout.jsonl').is_file() and not (tmp_path/'c'/'manifest.json').exists()
    kw = dict(seq_len=15, shards=4, train_tokenizer=300, val_docs=0.2, progress=False)
    seen = []
    m = build_corpus(CorpusConfig(sel, tmp_path/'c', **kw), on_shard=lambda r: seen.append(r['file']))
    assert seen == ['shard_00002.npy', 'shard_00003.npy', 'val/shard_00000.npy']
    assert m == build_corpus(CorpusConfig(sel, tmp_path/'ref', **kw))
    assert tree_bytes(tmp_path/'c') == tree_bytes(tmp_path/'ref')
    m2 = build_corpus(CorpusConfig(sel, tmp_path/'c', seq_len=15, shards=2, train_tokenizer=300, progress=False))  # a rebuild without
    assert m2['heldout'] is None and not (tmp_path/'c'/'heldout.jsonl').exists() and not (tmp_path/'c'/'val').exists()


def test_heldout_bad_input_is_one_line_and_leaves_nothing(tmp_path, good, capsys):
    sel, c = good
    before = snapshot(c)
    for argv, expect in [(['--val-docs', '2.5'], '--val-docs must be a share of the acts below 1 (0.01 = 1%) or a whole '
                                                  'number of acts (50), got 2.5'),
                         (['--val-docs', '-1'], 'got -1'),
                         (['--val-docs', '120'], f'--val-docs 120 holds out all 120 acts of {sel} and leaves none'),
                         (['--val-docs', '0.9999999'], '--val-docs 0.9999999 would hold out more than half of the selection')]:
        err = error(capsys, sel, '--out', c, '--shards', 1, '--train-tokenizer', 300, *argv)
        assert expect in err, (argv, err)
    assert snapshot(c) == before and sorted(p.name for p in tmp_path.iterdir()) == ['C', 's.jsonl']


def test_heldout_acts_under_one_row_give_a_corpus_without_val_rows_and_say_so(tmp_path, good, capsys):
    "One held-out act shorter than a row of 4,001 tokens: no val/ shard (it would be empty), heldout.jsonl kept for "
    "evaluate, one line that says so; split then takes its validation rows from the training rows."
    sel, _ = good
    out = tmp_path/'short'
    assert main(['build-corpus', str(sel), '--out', str(out), '--shards', '1', '--train-tokenizer', '300', '--val-docs',
                 '1', '--val-min-acts', '0', '--seq-len', '4000', '--no-progress']) == 0
    said = capsys.readouterr().out
    assert 'the held-out acts give less than one row of 4001 tokens: no held-out rows' in said, said
    m = json.loads((out/'manifest.json').read_text())
    assert m['val_shards'] == [] and len(m['heldout_celex']) == 1 and m['heldout']['rows'] == 0
    assert (out/'heldout.jsonl').read_text().count('\n') >= 1 and not list((out/'val').glob('*.npy'))
    assert main(['split', str(out), '--out', str(tmp_path/'split'), '--val-ratio', '0.5', '--by', 'rows']) == 0


def test_a_heldout_file_of_the_user_is_refused(tmp_path, good, capsys):
    sel, c = good  # built without --val-docs: a heldout.jsonl there is the user's
    (c/'heldout.jsonl').write_text('{"text": "mine"}\n')
    before = snapshot(c)
    err = error(capsys, sel, '--out', c, '--seq-len', 7, '--train-tokenizer', 300, '--val-docs', 0.1)
    assert 'holds files legalnb did not write (heldout.jsonl)' in err and snapshot(c) == before


def test_cli_prints_the_heldout_side_and_the_command_to_resume(tmp_path, capsys):
    sel = acts_selection(tmp_path/'s.jsonl')
    assert main(['build-corpus', str(sel), '--out', str(tmp_path/'c'), '--seq-len', '15', '--shards', '2',
                 '--train-tokenizer', '300', '--val-docs', '4', '--seed', '3', '--no-progress']) == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path/'c'/'manifest.json').read_text())
    held = m['heldout_celex']   # 4 asked for, the floor of 20 held out, listed
    assert f'held out 20 acts of 40 (--val-docs 4 (at least 20 acts)): {m["heldout"]["documents_read"]} documents -> heldout.jsonl' in out
    assert f'held-out acts: {", ".join(held)}' in out and len(held) == 20
    assert m['args']['val_docs'] == 4 and m['args']['seed'] == 3 and m['val_docs'] == 4 and m['heldout_rule']['val_min_acts'] == 20
    assert set(held) == heldout_acts(sel, 4, seed=3)[0]


# ---- issue 27: held-out acts worth scoring: a floor, acts after a day, acts by name ------------------------------------

def test_val_after_holds_out_the_newest_acts_and_val_acts_the_named_ones(tmp_path, capsys):
    "--val-after: every act whose earliest document is dated after the day; --val-acts: the acts another manifest held out."
    recs = [json.loads(l) for l in acts_selection(tmp_path/'s.jsonl').read_text().splitlines()]
    for r in recs:   # acts from 2000 to 2019, dated in their year; a consolidated version keeps its own, later date
        r['date'] = r['date'] if r['celex'].startswith('0') else f'{r["celex"][1:5]}-06-01'
    sel = tmp_path/'dated.jsonl'; write_jsonl(recs, sel)
    assert main(['build-corpus', str(sel), '--out', str(tmp_path/'c'), '--seq-len', '15', '--shards', '2',
                 '--train-tokenizer', '300', '--val-after', '2016-12-31', '--no-progress']) == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path/'c'/'manifest.json').read_text())
    newest = sorted({act_key(r) for r in recs if not r['celex'].startswith('0') and r['date'] > '2016-12-31'})
    assert m['heldout_celex'] == newest and len(newest) == 6 and '(--val-after 2016-12-31)' in out
    assert m['heldout_rule'] == {'val_after': '2016-12-31'} and m['val_docs'] == 0
    # a second corpus from another selection holds out the same acts by name, and its own share, without a floor
    more = tmp_path/'more.jsonl'; more.write_bytes(sel.read_bytes() + acts_selection(tmp_path/'x.jsonl', 80, seed=5).read_bytes())
    assert main(['build-corpus', str(more), '--out', str(tmp_path/'c2'), '--seq-len', '15', '--shards', '2',
                 '--train-tokenizer', '300', '--val-acts', str(tmp_path/'c'/'manifest.json'), '--val-docs', '0.05',
                 '--val-min-acts', '0', '--no-progress']) == 0
    m2 = json.loads((tmp_path/'c2'/'manifest.json').read_text())
    assert set(newest) <= set(m2['heldout_celex']) and set(m2['heldout_celex']) == set(newest) | heldout_acts(more, 0.05, min_acts=0)[0]
    err = error(capsys, sel, '--out', tmp_path/'c3', '--train-tokenizer', 300, '--val-after', '2021-01-01')
    assert 'no act of' in err and 'is dated after that day' in err
    err = error(capsys, sel, '--out', tmp_path/'c3', '--train-tokenizer', 300, '--val-after', 'yesterday')
    assert "--val-after: date 'yesterday' is not a valid yyyy-mm-dd date" in err and not (tmp_path/'c3').exists()


# ---- issue 52: shards by the rows kept, a held-out set of the size asked --------------------------------------------

def long_acts_selection(d: Path) -> tuple[Path, list[str]]:
    "The generated Formex sample parsed (49 acts), with three very long acts of four documents each (three languages "
    "and a consolidated version, 60k characters a document) together in its middle, as a selection by score can put them."
    from legalnb.sample import write_sample
    from legalnb.sources import parse_documents
    write_sample(d/'formex', docs=60); parse_documents([d/'formex'], d/'parsed.jsonl', progress=False)
    recs = [json.loads(l) for l in (d/'parsed.jsonl').read_text().splitlines()]
    body, long = '\n\n'.join(r['text'] for r in recs), []
    for i, lang in ((i, l) for i in range(3) for l in ('en', 'fr', 'de', 'en')):
        celex, start = f'32019R09{i:02d}', 37_000 * len(long) % len(body)
        long.append(dict(recs[0], celex=celex if len(long) % 4 < 3 else f'0{celex[1:]}-20210101', lang=lang,
                         title=f'long act {i}', text=(body[start:] + body)[:60_000]))
    write_jsonl(recs[:len(recs) // 2] + long + recs[len(recs) // 2:], d/'selected.jsonl')
    return d/'selected.jsonl', sorted({r['celex'] for r in long if r['celex'].startswith('3')})


def test_default_shards_hold_rows_when_long_heldout_acts_sit_together(tmp_path, capsys):
    "Item 1: the three long acts held out by name fill 58% of the file in one run; with the default --shards 16 every "
    "shard has rows (before: 'shard_00004.npy: no rows for this shard ... lower --shards or --seq-len')."
    sel, names = long_acts_selection(tmp_path)
    (tmp_path/'long.txt').write_text('\n'.join(names) + '\n')
    assert main(['build-corpus', str(sel), '--out', str(tmp_path/'c'), '--train-tokenizer', '300', '--val-acts',
                 str(tmp_path/'long.txt'), '--no-progress']) == 0
    m = json.loads((tmp_path/'c'/'manifest.json').read_text())
    rows = [s['rows'] for s in m['shards']]
    assert m['args']['shards'] is None and len(rows) == 16 and min(rows) >= 1 and m['heldout_celex'] == names
    assert max(rows) < m['rows'] / 4, f'the rows spread over the shards, not piled in a few: {rows}'
    assert 'share held out: 58' in capsys.readouterr().out
    # a shard that would still be empty: the real cause (the rows of the training side) and the --shards that fits
    err = error(capsys, sel, '--out', tmp_path/'d', '--tokenizer', tmp_path/'c', '--val-acts', tmp_path/'long.txt',
                '--shards', 200)
    assert 'shard_00042.npy: no rows for this shard: the selection without its held-out acts gives fewer rows than ' \
           '--shards 200: 127 rows of 3073 tokens, up to 11 in one shard; use --shards 11 or fewer' in err, err
    assert main(['build-corpus', str(sel), '--out', str(tmp_path/'d'), '--tokenizer', str(tmp_path/'c'), '--val-acts',
                 str(tmp_path/'long.txt'), '--shards', '11', '--no-progress']) == 0


def test_val_docs_share_holds_out_that_share_of_the_text_with_the_default_flags(tmp_path, capsys):
    "Item 2: --val-docs 0.1 on the same selection holds out 10% of the text with its 20 acts (before: the floor of "
    "20 acts by number took the long acts and half of the text, and shard 10 got no rows)."
    sel, names = long_acts_selection(tmp_path)
    assert main(['build-corpus', str(sel), '--out', str(tmp_path/'c'), '--train-tokenizer', '300', '--val-docs', '0.1',
                 '--no-progress']) == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path/'c'/'manifest.json').read_text())
    h = m['heldout']
    share = h['tokens'] / (h['tokens'] + m['tokens'])
    assert abs(share - 0.1) < 0.02 and abs(h['characters_share'] - 0.1) <= 0.02 and h['acts'] == 20 and 'notice' not in h
    assert f'share held out: {share:.1%} of the tokens, {h["characters_share"]:.1%} of the characters; asked 10%' in out
    assert not set(names) & set(m['heldout_celex']) and min(s['rows'] for s in m['shards']) >= 1
    # a share the floor cannot keep: lowered, and the line says why; above half: refused with the fix
    assert main(['build-corpus', str(sel), '--out', str(tmp_path/'d'), '--tokenizer', str(tmp_path/'c'), '--val-docs',
                 '0.1', '--val-min-acts', '45', '--seq-len', '511', '--no-progress']) == 0
    out = capsys.readouterr().out
    assert 'the floor of 45 acts is lowered to ' in out and 'smallest acts hold' in out
    err = error(capsys, sel, '--out', tmp_path/'e', '--tokenizer', tmp_path/'c', '--val-docs', 30)
    assert '--val-docs 30 would hold out' in err and 'more than half (30 acts); ask for fewer acts' in err
