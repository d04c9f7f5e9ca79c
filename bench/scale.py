"""The data stages at scale: `legalnb parse`, `select` and `build-corpus` on a generated dump of 1 GB and 10 GB.

    python bench/scale.py [--sizes 1 10] [--num-proc N] [--work DIR] [--resume]

Generates one dump with `legalnb sample` as CELLAR delivers it (--xhtml 0.3 --versions 0.3 --copies 0.05: Formex and
OJ XHTML publications saved as .xml and .html, consolidated versions, near-copies; about 10 kB a file) of the largest
size (or keeps the one `--work` holds, if as large); each size, the largest too, is the first of its folders (sorted by
name, hard links: no copy), so the sizes are samples of one dump, and none holds the sample's manifest. Then, for each
size, the three stages run as a user runs them (one `legalnb` process each, `--num-proc N`):
  parse         the dump -> parsed.jsonl (batches of files, N processes);
  select        parsed.jsonl -> selected.jsonl, half the input's tokens, one version of each act, near-duplicates
                removed (N processes for the first pass and the MinHash signatures);
  build-corpus  selected.jsonl -> shards, with one tokenizer trained beforehand (on a small sample, not timed),
                --val-docs 0.01, N encoding processes.
Each process of a stage is watched every 0.2 s (psutil and /proc: its peak resident memory, VmHWM; its peak anonymous
memory, RssAnon, sampled; CPU time): the table gives the wall time, the CPU time of all processes, the peak memory of
the main process and of the largest worker (resident, and anonymous in brackets), and the throughput per process
(input MB / wall s / processes). Against the smallest size: time per GB, wall and CPU (linear: 1.00; the target is
within 1.15; on a shared machine the CPU time is the steadier of the two) and peak memory (flat: 1.00), resident and
anonymous. The two differ by the files a stage maps into memory (shared libraries; select's MinHash signatures until it
read them back with pread): their pages count as resident, but they are page cache the kernel drops under pressure.
--resume: a parse of the smallest dump killed (SIGKILL) half-way through its batches, then run again: the batches it
kept, its time, and whether the output is the bytes of an uninterrupted run.
"""
from __future__ import annotations
import json, os, shutil, signal, subprocess, sys, tempfile, threading, time
from pathlib import Path

import psutil

from common import header, markdown_table, run
from legalnb.core import LegalnbError, format_duration
from legalnb.sample import write_sample

BYTES_PER_PUBLICATION = 27_700   # measured: 8.20 GB of files for 295,857 publications of these shares
DUMP = dict(xhtml=0.3, versions=0.3, copies=0.05)


def tree_bytes(folder: Path) -> tuple[int, int]:
    "(bytes, files) under `folder`."
    n = size = 0
    for root, _, files in os.walk(folder):
        for f in files: size += os.stat(os.path.join(root, f)).st_size; n += 1
    return size, n


def generate(dest: Path, gb: float, seed: int) -> tuple[int, int, float]:
    "Write a dump of about `gb` GB to `dest` (one `--work` already holds, as large or larger, is kept); (bytes, files, s)."
    t0, docs = time.perf_counter(), max(10, int(gb * 1e9 / BYTES_PER_PUBLICATION))
    try: kept = json.loads((dest/'sample.json').read_text())['docs'] >= docs
    except (OSError, ValueError, KeyError): kept = False
    if not kept: write_sample(dest, docs=docs, seed=seed, **DUMP)
    return (*tree_bytes(dest), time.perf_counter() - t0)


def subset(dump: Path, dest: Path, share: float) -> tuple[int, int]:
    "Hard-link the first `share` of the dump's folders (sorted) into `dest`; (bytes, files)."
    folders = sorted(p for p in dump.iterdir() if p.is_dir())
    dest.mkdir(parents=True)
    for p in folders[:max(1, round(len(folders) * share))]: shutil.copytree(p, dest/p.name, copy_function=os.link)
    return tree_bytes(dest)


def _status(pid: int, *keys: str) -> list[int]:
    "Fields of /proc/PID/status in bytes (VmHWM: peak resident memory; RssAnon: resident memory not backed by a file)."
    found = {l.split(':')[0]: int(l.split()[1]) * 1024 for l in open(f'/proc/{pid}/status') if l.startswith(keys)}
    return [found[k] for k in keys]

class Watch:
    "Follow a process and its children: the peak resident memory of each (VmHWM), its peak anonymous memory (RssAnon,"
    "sampled: the memory-mapped files a stage reads are page cache the kernel can drop, not memory it needs), CPU time."
    def __init__(self, pid: int):
        self.root, self.peaks, self.anon, self.cpu, self.done = psutil.Process(pid), {}, {}, {}, False
        self.thread = threading.Thread(target=self.loop, daemon=True); self.thread.start()

    def loop(self):
        while not self.done:
            try: procs = [self.root] + self.root.children(recursive=True)
            except psutil.NoSuchProcess: break
            for p in procs:
                try:
                    hwm, anon = _status(p.pid, 'VmHWM', 'RssAnon')
                    t = p.cpu_times(); self.cpu[p.pid] = t.user + t.system
                    self.peaks[p.pid] = max(self.peaks.get(p.pid, 0), hwm)
                    self.anon[p.pid] = max(self.anon.get(p.pid, 0), anon)
                except (OSError, psutil.Error, KeyError): pass
            time.sleep(0.2)

    def stop(self) -> dict:
        "Peaks (resident, anonymous) of the main process and of the largest worker, CPU seconds of all, workers seen."
        self.done = True; self.thread.join()
        others = lambda d: [v for pid, v in d.items() if pid != self.root.pid]
        return dict(main=self.peaks.get(self.root.pid, 0), worker=max(others(self.peaks), default=0),
                    main_anon=self.anon.get(self.root.pid, 0), worker_anon=max(others(self.anon), default=0),
                    cpu=sum(self.cpu.values()), workers=len(others(self.peaks)))


def stage(argv: list, log: Path) -> dict:
    "Run one `legalnb` command, watched; its wall seconds, CPU seconds and peaks."
    t0 = time.perf_counter()
    with open(log, 'w') as out:
        p = subprocess.Popen([sys.executable, '-m', 'legalnb.cli', *map(str, argv)], stdout=out, stderr=subprocess.STDOUT,
                             env={**os.environ, 'OMP_NUM_THREADS': '1'})
        w = Watch(p.pid)
        code = p.wait()
    watched = w.stop()
    if code: raise LegalnbError(f'{argv[0]} failed ({code}); see {log}')
    return dict(wall=time.perf_counter() - t0, **watched)


def tokenizer(work: Path, seed: int) -> Path:
    "A tokenizer trained once on a small sample of its own (the stages load it; training it is not what scales)."
    small = work/'tok'
    shutil.rmtree(small, ignore_errors=True)
    write_sample(small/'sample', docs=600, seed=seed + 1, **DUMP)
    stage(['parse', small/'sample', '--out', small/'parsed.jsonl', '--no-progress'], work/'tok.log')
    stage(['select', small/'parsed.jsonl', '--out', small/'selected.jsonl', '--target-tokens', '5M', '--near-dup', '0'],
          work/'tok.log')
    stage(['build-corpus', small/'selected.jsonl', '--out', small/'corpus', '--train-tokenizer', 8000, '--seq-len', 1024,
           '--shards', 1, '--no-progress'], work/'tok.log')
    return small/'corpus'/'tokenizer.json'


def tokens_of(parsed: Path) -> int:
    "Estimated tokens of a parsed.jsonl (characters / 4)."
    n = 0
    with open(parsed, 'rb') as f:
        for line in f: n += len(json.loads(line)['text'])
    return n // 4


def run_size(work: Path, dump: Path, gb: float, n_proc: int, tok: Path) -> list[dict]:
    "The three stages on one dump; a row per stage."
    out, rows = work/f'{gb:g}gb', []
    shutil.rmtree(out, ignore_errors=True); out.mkdir()
    size, files = tree_bytes(dump)
    s = stage(['parse', dump, '--out', out/'parsed.jsonl', '--num-proc', n_proc, '--no-progress'], out/'parse.log')
    rows.append(dict(stage='parse', input=size, files=files, **s))
    target = tokens_of(out/'parsed.jsonl') // 2
    s = stage(['select', out/'parsed.jsonl', '--out', out/'selected.jsonl', '--target-tokens', target, '--num-proc', n_proc,
               '--report', out/'select.json'], out/'select.log')
    rows.append(dict(stage='select', input=(out/'parsed.jsonl').stat().st_size, **s))
    s = stage(['build-corpus', out/'selected.jsonl', '--out', out/'corpus', '--tokenizer', tok, '--seq-len', 1024,
               '--shards', 16, '--val-docs', '0.01', '--num-proc', n_proc, '--no-progress'], out/'build.log')
    rows.append(dict(stage='build-corpus', input=(out/'selected.jsonl').stat().st_size, **s))
    for r in rows: r['gb'] = gb
    return rows


def resume(work: Path, dump: Path, whole: Path, n_proc: int) -> str:
    "Kill a parse of `dump` half-way (SIGKILL), run it again; what was kept, and whether the bytes are `whole`'s."
    out, parts = work/'resume', work/'resume'/'.parsed.jsonl.parts'
    shutil.rmtree(out, ignore_errors=True)
    files = tree_bytes(dump)[1]
    batches = -(-files // 256)
    p = subprocess.Popen([sys.executable, '-m', 'legalnb.cli', 'parse', str(dump), '--out', str(out/'parsed.jsonl'),
                          '--num-proc', str(n_proc), '--no-progress'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.perf_counter()
    while p.poll() is None and len(list(parts.glob('0*.json'))) < batches // 2: time.sleep(0.05)
    p.send_signal(signal.SIGKILL); p.wait()
    killed, kept = time.perf_counter() - t0, len(list(parts.glob('0*.json')))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, '-m', 'legalnb.cli', 'parse', str(dump), '--out', str(out/'parsed.jsonl'),
                        '--num-proc', str(n_proc), '--no-progress'], capture_output=True, text=True)
    again = time.perf_counter() - t0
    line = next((l for l in r.stdout.splitlines() if 'resumed:' in l), '(no resume line)').strip()
    same = (out/'parsed.jsonl').read_bytes() == whole.read_bytes()
    return (f'resume: a parse of {files:,} files ({batches:,} batches of 256) killed after {killed:.0f} s with {kept:,} '
            f'batches finished; run again: {again:.0f} s, "{line}"; output byte-identical to an uninterrupted run: {same}')


def main(sizes: list[float] = [1, 10],   # dump sizes in GB (the largest is generated, the others are its first folders)
         num_proc: int | None = None,    # processes of each stage (without it: all cores)
         work: str | None = None,        # folder to work in (default: a temporary one, removed after)
         seed: int = 0,                  # seed of the dump
         resume_check: bool = True):     # also kill a parse of the smallest dump half-way and resume it
    "Time, peak memory and throughput per process of parse, select and build-corpus on dumps of growing size."
    n_proc = num_proc or os.cpu_count() or 1
    sizes = sorted(sizes)
    header(__file__, 'datasketch', 'lxml', 'tokenizers')
    base = Path(work) if work else Path(tempfile.mkdtemp(prefix='legalnb-scale-'))
    try:
        base.mkdir(parents=True, exist_ok=True)
        size, files, secs = generate(base/'dump', sizes[-1], seed)
        print(f'dump: {size / 1e9:.2f} GB, {files:,} files (Formex, OJ XHTML as .xml and .html, consolidated versions, '
              f'near-copies), written in {format_duration(secs)}; {n_proc} processes per stage')
        dumps = {}
        for gb in sizes:
            share = min(1.0, gb * 1e9 / size)
            dumps[gb] = base/f'dump-{gb:g}gb'; shutil.rmtree(dumps[gb], ignore_errors=True)
            b, f = subset(base/'dump', dumps[gb], share)
            print(f'  {gb:g} GB: the first {share:.1%} of its folders: {b / 1e9:.2f} GB, {f:,} files')
        tok = tokenizer(base, seed)
        rows = [r for gb in sizes for r in run_size(base, dumps[gb], gb, n_proc, tok)]
        first = {r['stage']: r for r in rows if r['gb'] == sizes[0]}
        table, ratios = [], []
        mb = lambda r, k: f'{r[k] / 2**20:,.0f} ({r[k + "_anon"] / 2**20:,.0f})'
        for r in rows:
            f = first[r['stage']]
            per_gb = lambda k: (r[k] / r['input']) / (f[k] / f['input'])
            peak = lambda x, k='': max(x['main' + k], x['worker' + k])
            ratios.append((per_gb('wall'), per_gb('cpu'), peak(r) / peak(f), peak(r, '_anon') / peak(f, '_anon')))
            table.append([f'{r["gb"]:g} GB', r['stage'], f'{r["input"] / 1e9:.2f}', f'{r["wall"]:,.0f}', f'{r["cpu"]:,.0f}',
                          mb(r, 'main'), mb(r, 'worker') if r['workers'] else '-',
                          f'{r["input"] / 1e6 / r["wall"] / n_proc:.1f}', *(f'{x:.2f}' for x in ratios[-1])])
        print(markdown_table(['dump', 'stage', 'input GB', 'wall s', 'CPU s', 'peak MB main (anon)',
                              'peak MB worker (anon)', 'MB/s per process', 'wall/GB vs first', 'CPU/GB vs first',
                              'peak vs first', 'anon vs first'], table, 'llrrrrrrrrrr'))
        worst_w, worst_c, worst_m, worst_a = (max(x[k] for x in ratios) for k in range(4))
        print(f'time per GB at most {worst_w:.2f}x the smallest dump\'s in wall time, {worst_c:.2f}x in CPU time (target: '
              f'within 1.15x of linear: {"met" if max(worst_w, worst_c) <= 1.15 else "missed"}); peak memory at most '
              f'{worst_m:.2f}x resident, {worst_a:.2f}x anonymous ({"flat" if worst_a <= 1.15 else "not flat"} '
              f'within 15%)')
        big = [r for r in rows if r['gb'] == sizes[-1]]
        per_byte = sum(r['cpu'] for r in big) / tree_bytes(dumps[sizes[-1]])[0]   # process-seconds a byte of dump
        hours = per_byte * 179e9 / 3600
        print(f'projection for all of EUR-Lex (179 GB of input of this mix), from the CPU time of the {sizes[-1]:g} GB run: '
              f'{hours:,.1f} process-hours: {hours / 16:,.1f} h on 16 cores, {hours / 64:,.1f} h on 64 '
              f'(parse {sum(r["cpu"] for r in big if r["stage"] == "parse") / sum(r["cpu"] for r in big):.0%} of it)')
        if resume_check: print(resume(base, dumps[sizes[0]], base/f'{sizes[0]:g}gb'/'parsed.jsonl', n_proc))
    finally:
        if not work: shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == '__main__': sys.exit(run(main))
