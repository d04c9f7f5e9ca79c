"""Selection speed next to merely reading the same JSONL: `python bench/select.py [--docs 30000] [--seed 0]`.

Writes synthetic documents (in-process, not Formex) to a temporary folder, then times, in one run:
  read+parse  every line read and `json.loads`-ed, nothing else (the cost any stage pays);
  select      `select_documents`: parse + score + count tokens, choose, write the selected lines;
  select-full the same with the topic search reading whole texts (`subject_scan_chars=None`), for the record.
Each is run `--repeat` times, interleaved, and the fastest kept. Target: select / read+parse >= 0.5 (documents/s ratio).
"""
from __future__ import annotations
import os, sys
# This file is named select.py: drop its folder from the import path so `import select` (stdlib) is not this file.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != os.path.dirname(os.path.abspath(__file__))]
import argparse, json, platform, resource, tempfile, time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from legalnb.scoring import ScoringRules, estimate_tokens, select_documents, synthetic_documents
from legalnb.sources import write_jsonl

def read_parse(path: Path) -> int:
    "Read and parse every line; return the number of documents."
    n = 0
    with open(path, 'rb') as f:
        for line in f: json.loads(line); n += 1
    return n

def timed(f, *args, **kwargs) -> tuple[float, object]:
    "Wall time of one call, and its result."
    t0 = time.perf_counter(); out = f(*args, **kwargs)
    return time.perf_counter() - t0, out

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--docs', type=int, default=30_000, help='synthetic documents to generate')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--repeat', type=int, default=3, help='runs of each measurement (the fastest is kept)')
    a = p.parse_args(argv)
    print(f'# bench/select.py  {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  {platform.platform()}  '
          f'{platform.processor() or platform.machine()}  {os.cpu_count()} CPUs  Python {platform.python_version()}')
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d)/'parsed.jsonl', Path(d)/'selected.jsonl'
        t0 = time.perf_counter()
        tokens = 0
        def records():
            nonlocal tokens
            for doc in synthetic_documents(a.docs, a.seed):
                tokens += estimate_tokens(doc.text); yield doc.to_json()
        write_jsonl(records(), src)
        size = src.stat().st_size
        print(f'generated {a.docs:,} documents, {size / 1e6:,.0f} MB, {tokens:,} tokens (estimated) in {time.perf_counter() - t0:.1f} s; target 40% of the tokens')
        t_read = t_sel = t_full = float('inf')
        for _ in range(a.repeat):   # interleaved, fastest kept: the machine is shared, so single timings are noisy
            t, n = timed(read_parse, src); t_read = min(t_read, t)
            t, report = timed(select_documents, src, out, int(tokens * 0.4)); t_sel = min(t_sel, t)
            t, _ = timed(select_documents, src, out, int(tokens * 0.4), replace(ScoringRules(), subject_scan_chars=None)); t_full = min(t_full, t)
    rows = [('read+parse', t_read), ('select', t_sel), ('select-full', t_full)]
    print(f'{"step":<14}{"seconds":>9}{"docs/s":>11}{"MB/s":>8}{"ratio":>7}')
    for name, t in rows: print(f'{name:<14}{t:>9.2f}{n / t:>11,.0f}{size / 1e6 / t:>8.0f}{t_read / t:>7.2f}')
    print(f'selected {report["counters"]["documents.selected"]:,} documents, {report["counters"]["tokens.selected"]:,} tokens; '
          f'peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB')
    ok = t_read / t_sel >= 0.5
    print(f'ratio select / read+parse = {t_read / t_sel:.2f} ({"meets" if ok else "misses"} the 0.5 target)')
    return 0

if __name__ == '__main__': sys.exit(main())
