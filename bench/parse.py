"""Parsing speed of `legalnb parse` next to a bare XML parse of the same files, in one and in N processes.

    python bench/parse.py [--docs 5000] [--num-proc N] [--repeat 1]

Writes `--docs` synthetic Formex publications with `legalnb sample` (ten languages, Formex 4 and 6 layouts,
wrappers, acts, annexes, tables of contents) to a temporary folder, then times, on the same files:
  etree (floor)   `xml.etree.ElementTree.parse` of every .xml file, nothing else: the least any reader pays;
  parse, 1 proc   `parse_documents(..., num_proc=1)`: group the files into publications, read the text, check,
                  deduplicate, write the JSONL and its report;
  parse, N procs  the same with `num_proc=N` (default: all cores), whose output must be byte-identical.
Times are wall seconds (the parallel run spends its CPU in worker processes); each step runs `--repeat` times,
interleaved, and the fastest is kept. The ratio column is publications/s of the step over the floor's.
"""
from __future__ import annotations
import os, sys, tempfile, time
import xml.etree.ElementTree as ET
from pathlib import Path

from common import header, markdown_table, run
from legalnb.core import LegalnbError, format_duration
from legalnb.sources import parse_documents
from legalnb.sample import write_sample

def etree_floor(files: list[Path]) -> int:
    "Parse every file with xml.etree and drop the tree; return the number of files."
    for p in files: ET.parse(p)
    return len(files)

def main(docs: int = 5_000,           # publications to generate (legalnb sample)
         num_proc: int | None = None,  # processes of the parallel run (without it: all cores)
         seed: int = 0,               # seed of the sample
         repeat: int = 1):            # runs of each step (the fastest is kept)
    "publications/s of legalnb parse in 1 and N processes, next to a bare xml.etree parse of the same files."
    n_proc = num_proc or os.cpu_count() or 1
    if docs < 1 or n_proc < 1: raise LegalnbError('--docs and --num-proc must be at least 1')
    header(__file__)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        t0 = time.perf_counter(); write_sample(d/'sample', docs, seed)
        files = sorted((d/'sample').rglob('*.xml')); size = sum(p.stat().st_size for p in files)
        print(f'{docs:,} publications ({len(files):,} XML files, {size / 1e6:,.0f} MB) written by legalnb sample '
              f'in {format_duration(time.perf_counter() - t0)}; {n_proc} processes for the parallel run')
        steps = {'etree (floor)': lambda: etree_floor(files),
                 'parse, 1 proc': lambda: parse_documents([d/'sample'], d/'one'/'parsed.jsonl', False, num_proc=1),
                 f'parse, {n_proc} procs': lambda: parse_documents([d/'sample'], d/'many'/'parsed.jsonl', False,
                                                                  num_proc=n_proc)}
        best = dict.fromkeys(steps, float('inf'))
        for _ in range(repeat):   # interleaved, fastest kept
            for name, f in steps.items():
                t = time.perf_counter(); f(); best[name] = min(best[name], time.perf_counter() - t)
        same = (d/'one'/'parsed.jsonl').read_bytes() == (d/'many'/'parsed.jsonl').read_bytes()
    floor = docs / best['etree (floor)']
    rows = [[name, f'{s:.2f}', f'{docs / s:,.0f}', f'{docs / s / floor:.2f}'] for name, s in best.items()]
    print(markdown_table(['step', 'wall s', 'publications/s', 'ratio to floor'], rows))
    one, many = best['parse, 1 proc'], best[f'parse, {n_proc} procs']
    print(f'parse in {n_proc} processes: {one / many:.2f}x one process; output byte-identical: {same}')
    return 0 if same else 1


if __name__ == '__main__': sys.exit(run(main))
