"""Benchmark `legalnb build-corpus`: throughput against the tokenizer alone and a `datasets.map` baseline, and peak
memory for a corpus and one ten times larger. One run prints one table.
Usage: python bench/corpus.py [--mb 2] [--vocab 8192] [--seq-len 3072]

- encode_batch: the tokenizer's own batch encoding of the same texts, already in memory (the ceiling).
- build-corpus: the whole stage (read JSONL, split, encode, pack, write shards, checksums), each in a fresh process.
- datasets.map: Dataset.from_list(records).map(tokenize, batched=True) through transformers' fast tokenizer, then
  concatenation with EOS into rows of seq_len + 1 (the plain way to do it).
Peak RSS is each build process's own high-water mark (VmHWM), beside its RSS after imports; workers' ru_maxrss apart.
"""
import json, random, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np

from common import header, markdown_table, run
from legalnb.core import LegalnbError
from legalnb.corpus import iter_selected, train_tokenizer
from legalnb.sources import write_jsonl

SYLLABLES = ('ar be ca de el fi go he in jo ka le mi no or pa qu re si te un ve wa xe yo ze '
             'tion ment ung keit ité').split()


def make_selection(path: Path, mb: float, seed: int = 0) -> Path:
    "Legal-looking documents (Zipf-distributed pseudo-words, numbered articles, paragraphs) totalling about `mb` MB."
    rng = random.Random(seed)
    words = sorted({''.join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(6000)})
    weights = [1 / (i + 1) for i in range(len(words))]
    recs, size, i = [], 0, 0
    while size < mb * 1e6:
        n_articles = rng.choice([2, 5, 10, 40, 150])  # most acts are short, a few are very long
        body = []
        for a in range(1, n_articles + 1):
            paras = [' '.join(rng.choices(words, weights, k=rng.randint(20, 90))).capitalize()
                     + f', {rng.randint(1, 2030)}.' for _ in range(rng.randint(1, 4))]
            body.append(f'Article {a}\n\n' + '\n\n'.join(paras))
        text = '\n\n'.join(body)
        recs.append(dict(celex=f'3{2000 + i % 25}R{i:04d}', title=f'Act {i}', text=text, lang=['en', 'de', 'fr'][i % 3],
                         date=None, doc_type='regulation', subjects=[], source='bench', score=1.0, tokens=0))
        size += len(text.encode()); i += 1
    write_jsonl(recs, path)
    return path


CHILD = '''
import json, resource, sys, time
from legalnb.corpus import CorpusConfig, build_corpus
def status(key):  # from /proc: VmHWM is this process's own peak (ru_maxrss keeps the forking parent's peak across exec)
    return next(int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith(key + ':'))
sel, out, tok, num_proc, seq_len, shards = sys.argv[1:7]
base = status('VmRSS')
t = time.perf_counter()
m = build_corpus(CorpusConfig(sel, out, seq_len=int(seq_len), shards=int(shards), tokenizer=tok, num_proc=int(num_proc), progress=False))
dt = time.perf_counter() - t
print(json.dumps(dict(seconds=dt, tokens=m['tokens'] + m['dropped_tail_tokens'], docs=m['documents_read'],
                      rss_mb=status('VmHWM'), base_mb=base,
                      workers_rss_mb=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)))
'''


def build_in_subprocess(sel: Path, out: Path, tok: Path, num_proc: int, seq_len: int, shards: int) -> dict:
    "Run one build in a fresh Python process; its own timing, token count and peak RSS."
    args = [sel, out, tok, num_proc, seq_len, shards]
    r = subprocess.run([sys.executable, '-c', CHILD, *map(str, args)], capture_output=True, text=True)
    if r.returncode:
        raise LegalnbError(f'build-corpus of {sel.name} failed: {(r.stderr.strip().splitlines() or ["?"])[-1]}')
    return json.loads(r.stdout.strip().splitlines()[-1])


def encode_batch_rate(tok, texts: list[str], fast: bool = False) -> tuple[float, int]:
    "Tokens/s of the tokenizer's own batch encoding over the texts (1000 texts per call)."
    enc = tok.encode_batch_fast if fast else tok.encode_batch
    t, n = time.perf_counter(), 0
    for i in range(0, len(texts), 1000): n += sum(len(e.ids) for e in enc(texts[i:i + 1000], add_special_tokens=False))
    return n / (time.perf_counter() - t), n


def datasets_rate(tok_path: Path, sel: Path, seq_len: int) -> tuple[float, int]:
    "Tokens/s of the plain baseline: datasets.map with a fast tokenizer, then concatenation into rows."
    import datasets
    from transformers import PreTrainedTokenizerFast
    datasets.disable_progress_bars()
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tok_path), eos_token='<|endoftext|>')
    t = time.perf_counter()
    records = [json.loads(line) for line in open(sel, encoding='utf-8')]
    def tokenize(b):
        return {'ids': [x + [hf.eos_token_id] for x in hf(b['text'], add_special_tokens=False)['input_ids']]}
    ds = datasets.Dataset.from_list(records).map(tokenize, batched=True, remove_columns=list(records[0]))
    flat = np.concatenate([np.asarray(x, np.uint32) for x in ds['ids']])
    rows = flat[:len(flat) // (seq_len + 1) * (seq_len + 1)].reshape(-1, seq_len + 1).astype(np.uint16)
    dt = time.perf_counter() - t
    return len(flat) / dt, len(flat)


def main(mb: float = 2,         # size of the small selection in MB; the large one (10x) is the one timed
         vocab: int = 8192,     # vocabulary of the tokenizer trained on the small selection
         seq_len: int = 3072):  # tokens per packed row
    "Throughput of build-corpus against the tokenizer alone and datasets.map; its peak memory, small and 10x larger."
    header(__file__, 'tokenizers', 'numpy', 'datasets', 'transformers')
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        small, large = make_selection(d/'small.jsonl', mb), make_selection(d/'large.jsonl', mb * 10, seed=1)
        tok_path = d/'tokenizer.json'
        tok = train_tokenizer(small, vocab, tok_path, sample_chars=3_000_000)
        # throughput on the large selection (start-up costs and the tokenizer's word cache amortised), measured once
        texts = [r['text'] for *_, r in iter_selected(large)]
        rows, res = [], {}
        ceiling, n = encode_batch_rate(tok, texts)
        rows.append(('encode_batch (tokenizer alone, texts in memory)', 'large', ceiling, n, None, None))
        fast, _ = encode_batch_rate(tok, texts, fast=True)
        rows.append(('encode_batch_fast (tokenizer alone, texts in memory)', 'large', fast, n, None, None))
        del texts
        base, nb = datasets_rate(tok_path, large, seq_len)
        rows.append(('datasets.map + concatenate (baseline)', 'large', base, nb, None, None))
        for name, sel in (('large', large), ('small', small)):
            for num_proc in (1, 2):
                r = res[name, num_proc] = build_in_subprocess(sel, d/f'{name}{num_proc}', tok_path, num_proc, seq_len,
                                                              16)
                rows.append((f'build-corpus --num-proc {num_proc}', name, r['tokens'] / r['seconds'], r['tokens'],
                             f"{r['rss_mb']:,.0f} ({r['base_mb']:,.0f})",
                             f"{r['workers_rss_mb']:,.0f}" if num_proc > 1 else None))
        print(f'# small = {small.stat().st_size / 1e6:.1f} MB, large = {large.stat().st_size / 1e6:.1f} MB '
              f'({res["large", 1]["docs"]:,} documents); vocab {len(tok.get_vocab()):,}, seq_len {seq_len}, 16 shards')
        table = [[what, name, f'{rate:,.0f}', f'{n:,}', rss, wrss] for what, name, rate, n, rss, wrss in rows]
        columns = ['what', 'corpus', 'tokens/s', 'tokens', 'peak RSS MB (after imports)', "workers' peak MB"]
        print(markdown_table(columns, table, 'llrrrr'))
        rate = {p: res['large', p]['tokens'] / res['large', p]['seconds'] for p in (1, 2)}
        def vs(x): return f'{rate[1] / x:.2f} / {rate[2] / x:.2f}'
        print(f'build-corpus (large, --num-proc 1 / 2) / encode_batch = {vs(ceiling)} (target >= 0.8); '
              f'/ encode_batch_fast (what build-corpus calls) = {vs(fast)}; / datasets.map = {vs(base)}')
        for p in (1, 2):
            big, little = res['large', p]['rss_mb'], res['small', p]['rss_mb']
            print(f'peak RSS large / small, --num-proc {p}: {big:.0f} / {little:.0f} MB = {big / little:.2f} '
                  '(target <= 1.2)')


if __name__ == '__main__': sys.exit(run(main))
