"""Selection speed next to merely reading the same JSONL.

    python bench/selection.py [--docs 20000] [--realistic-docs 1500] [--repeat 3]


Writes synthetic documents (in-process, not Formex) to a temporary folder, then times, in one run and for two
corpora:
  realistic    the default corpus: lengths log-uniform from 3k to 700k characters, ~130 kB per document on average,
               the size of the production corpus (25 GB over 150-200k documents, ~125 kB each);
  short        300 to 30k characters (~6.7 kB each, like `legalnb sample`): the hard case, where the fixed cost per
               document weighs most against the cost of reading it.
Steps:
  read+parse   every line read (1 MB buffer) and `json.loads`-ed, nothing else (the least any stage pays to see them);
  read-docs    `legalnb.sources.read_jsonl_documents`: the project's reader, lines to validated `Document`s;
  select       `select_documents(SelectConfig(..., near_dup=0, num_proc=1))`: parse + validate + score + count tokens, choose, write the
               selected lines (no near-duplicate removal: what select cost before issue 27);
  +near-dups   the default `select_documents`: the same plus near-duplicate removal (a MinHash of every eligible
               document's 8-word shingles, read again by offset, and the LSH bands sorted on disk);
  minhash      `near_duplicates` alone on the eligible candidates of the first pass (its own cost, no scan);
  select-full  the same as select with the topic search reading whole texts (`subject_scan_chars=None`), for the record.
Times are CPU seconds of this process (the machine is shared, so wall time mostly measures the neighbours);
wall seconds are printed beside them. Each step runs `--repeat` times, interleaved, and the fastest is kept.
Target: documents/s of select / documents/s of read+parse >= 0.5 (the ratio column; vs read-docs printed after).
The near-duplicate line says what removal costs next to merely reading the input (MB/s of minhash vs read+parse).
"""
from __future__ import annotations
import json, resource, sys, tempfile, time
from dataclasses import replace
from pathlib import Path

from common import header, markdown_table, run
from legalnb.core import format_duration
from legalnb.scoring import (ScoringRules, SelectConfig, estimate_tokens, near_duplicates, scan_documents, select_documents,
                             synthetic_documents)
from legalnb.sources import read_jsonl_documents, write_jsonl

def read_parse(path: Path) -> int:
    "Read and parse every line; return the number of documents."
    n = 0
    # a buffer at least as large as `jsonl_records`' (256 kB): this stays the floor
    with open(path, 'rb', buffering=1 << 20) as f:
        for line in f: json.loads(line); n += 1
    return n

def timed(f, *args, **kwargs) -> tuple[float, float, object]:
    "CPU seconds and wall seconds of one call, and its result."
    c0, w0 = time.process_time(), time.perf_counter(); out = f(*args, **kwargs)
    return time.process_time() - c0, time.perf_counter() - w0, out

def generate(path: Path, docs: int, seed: int, chars: tuple[int, int]) -> int:
    "Write `docs` synthetic documents as JSON lines; return their estimated tokens."
    tokens = 0
    def records():
        nonlocal tokens
        for doc in synthetic_documents(docs, seed, chars=chars):
            tokens += estimate_tokens(doc.text); yield doc.to_json()
    write_jsonl(records(), path)
    return tokens

def measure(d: Path, name: str, docs: int, chars: tuple[int, int], seed: int, repeat: int, full: bool) -> list[tuple]:
    "Rows (corpus, step, cpu s, wall s, docs, MB) for one corpus."
    src, out = d/f'{name}.jsonl', d/f'{name}-selected.jsonl'
    t0 = time.perf_counter(); tokens = generate(src, docs, seed, chars); size = src.stat().st_size
    print(f'{name}: {docs:,} documents of {chars[0]:,} to {chars[1]:,} characters, {size / 1e6:,.0f} MB '
          f'({size / docs / 1e3:,.1f} kB per document), {tokens:,} tokens (estimated), '
          f'written in {format_duration(time.perf_counter() - t0)}; target 40% of the tokens')
    rules = ScoringRules()
    eligible = (found := scan_documents(src, rules)[0]).take(found.score >= rules.threshold)
    steps = {'read+parse': lambda: read_parse(src), 'read-docs': lambda: sum(1 for _ in read_jsonl_documents(src)),
             'select': lambda: select_documents(SelectConfig(src, out, int(tokens * 0.4), near_dup=0, num_proc=1)),
             '+near-dups': lambda: select_documents(SelectConfig(src, out, int(tokens * 0.4), num_proc=1)),
             'minhash': lambda: near_duplicates(src, eligible, 0.8, workdir=d)}
    if full:
        whole_texts = replace(ScoringRules(), subject_scan_chars=None)
        steps['select-full'] = lambda: select_documents(SelectConfig(src, out, int(tokens * 0.4), near_dup=0, num_proc=1), whole_texts)
    best = {k: (float('inf'), float('inf')) for k in steps}
    for _ in range(repeat):   # interleaved, fastest kept
        for k, f in steps.items():
            cpu, wall, _ = timed(f); best[k] = (min(best[k][0], cpu), min(best[k][1], wall))
            out.unlink(missing_ok=True)   # each run writes a new file, as a first run does (replacing frees pages)
    return [(name, k, cpu, wall, docs, size / 1e6) for k, (cpu, wall) in best.items()]

def main(realistic_docs: int = 1_500,  # documents of the realistic corpus (3k to 700k characters, ~130 kB each)
         docs: int = 20_000,           # documents of the short corpus (300 to 30k characters)
         seed: int = 0,                # seed of the synthetic documents
         repeat: int = 3):             # runs of each step (the fastest is kept)
    "Selection speed next to merely reading the same JSONL, for a realistic and a short-document corpus."
    header(__file__)
    print("corpora: realistic = documents the size of the production corpus's "
          '(25 GB over 150-200k documents, ~125 kB each); '
          'short = 300 to 30k characters, the hard case (the fixed cost per document weighs most)')
    with tempfile.TemporaryDirectory() as d:
        rows = measure(Path(d), 'realistic', realistic_docs, (3_000, 700_000), seed, repeat, full=False)
        rows += measure(Path(d), 'short', docs, (300, 30_000), seed, repeat, full=True)
    ratios, table = {}, []
    for name, step, cpu, wall, n, mb in rows:
        base = next(r[2] for r in rows if r[0] == name and r[1] == 'read+parse')
        ratios[name, step] = base / cpu
        table.append([name, step, f'{cpu:.2f}', f'{wall:.2f}', f'{n / cpu:,.0f}', f'{mb / cpu:.0f}',
                      f'{base / cpu:.2f}'])
    print(markdown_table(['corpus', 'step', 'cpu s', 'wall s', 'docs/s', 'MB/s', 'ratio'], table, 'llrrrrr'))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f'peak RSS {peak:,.0f} MB (no text is kept: both passes stream)')
    for name in ('realistic', 'short'):
        r, vs_docs = ratios[name, 'select'], ratios[name, 'select'] / ratios[name, 'read-docs']
        print(f'{name} documents: select / read+parse = {r:.2f} ({"meets" if r >= 0.5 else "misses"} the 0.5 target); '
              f'select / read-docs = {vs_docs:.2f}')
        cost = 1 / ratios[name, 'minhash']
        print(f'{name} documents: near-duplicate removal costs {cost:.1f}x reading the input (MinHash over the eligible '
              f'documents, CPU of one process; select with it / select without: {ratios[name, "select"] / ratios[name, "+near-dups"]:.2f}x)')


if __name__ == '__main__': sys.exit(run(main))
