"""Generation speed: ResonanceNet's recurrent path (prefill once, then O(1) per token) against recomputing the
whole context for every new token, after prompts of 1k, 8k and 32k tokens.

Each measurement (prompt length, path) runs in its own subprocess, so that its peak resident memory
(resource.getrusage maxrss, interpreter and torch included) is its own. The recurrent path times `prefill` once
and then `step` for each new token; the recompute path times one full forward pass over the growing context per
new token (what `generate(recurrent=False)` and a model without a state must do). Both take greedy tokens, and the
table says whether their tokens agree. A small model (dim 64, 2 blocks, K 16, byte vocabulary), so that the
recompute side finishes at 32k on a CPU.

    python bench/generate.py               # --quick: 48 recurrent and 3 recomputed tokens per prompt, ~2 minutes
    python bench/generate.py --no-quick    # 256 recurrent and 12 recomputed tokens per prompt
    python bench/generate.py --device cuda
"""
from __future__ import annotations
import json, os, resource, subprocess, sys, time

import torch

from common import header, markdown_table, run
from legalnb.resonance import ResonanceConfig, ResonanceLanguageModel


def sync(dev: torch.device):
    if dev.type == 'cuda': torch.cuda.synchronize()


def worker(spec: dict) -> dict:
    "One measurement in this process: `spec['path']` is 'recurrent' or 'recompute'; returns the timings."
    dev = torch.device(spec['device'])
    if dev.type == 'cpu': torch.set_num_threads(spec['threads'])
    torch.manual_seed(0)
    P, n = spec['prompt'], spec['new']
    m = ResonanceLanguageModel(ResonanceConfig(vocab_size=spec['vocab'], dim=spec['dim'], num_layers=spec['layers'],
                                               num_frequencies=spec['frequencies'], max_seq_len=P + 257,
                                               init_std=0.2)).to(dev).eval()
    ids = torch.randint(0, spec['vocab'], (1, P), generator=torch.Generator().manual_seed(1)).to(dev)
    out, tokens = dict(prompt=P, path=spec['path'], new=n), []
    with torch.no_grad():
        if spec['path'] == 'recurrent':
            sync(dev); t0 = time.perf_counter()
            logits, state = m.prefill(ids)
            nxt = logits[:, -1].argmax(-1)
            sync(dev); t1 = time.perf_counter()
            for _ in range(n):
                tokens.append(int(nxt)); nxt = m.step(nxt, state).argmax(-1)
            sync(dev); t2 = time.perf_counter()
            out.update(prefill_s=t1 - t0, ms_per_token=1e3 * (t2 - t1) / n)
        else:
            m(ids)                                              # warm-up: the first pass allocates
            sync(dev); t0 = time.perf_counter()
            for _ in range(n):
                nxt = m(ids)[:, -1].argmax(-1)
                tokens.append(int(nxt)); ids = torch.cat([ids, nxt[:, None]], 1)
            sync(dev); t1 = time.perf_counter()
            out.update(ms_per_token=1e3 * (t1 - t0) / n)
    out['tokens'] = tokens
    out['peak_mib'] = (torch.cuda.max_memory_allocated() / 2**20 if dev.type == 'cuda'
                       else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


WORKER = '--worker'   # `bench/generate.py --worker '{json}'`: one measurement, in the subprocess run_one starts


def run_one(spec: dict) -> dict:
    "Run `worker(spec)` in a fresh subprocess and return its result (or the error's last line)."
    r = subprocess.run([sys.executable, __file__, WORKER, json.dumps(spec)], capture_output=True, text=True,
                       env={**os.environ, 'MALLOC_MMAP_MAX_': '0', 'MALLOC_TRIM_THRESHOLD_': str(1 << 34)})
    if r.returncode != 0:
        return dict(prompt=spec['prompt'], path=spec['path'], error=(r.stderr.strip().splitlines() or ['?'])[-1][:100])
    return json.loads(r.stdout.strip().splitlines()[-1])


def fmt_table(rows: list[dict]) -> str:
    "One line per prompt length: both paths' ms and tokens/s per new token, the speed-up, peak memory."
    by = {(r['prompt'], r['path']): r for r in rows}
    lines = []
    for P in sorted({r['prompt'] for r in rows}):
        a, b = by.get((P, 'recurrent'), {}), by.get((P, 'recompute'), {})
        ok = 'ms_per_token' in a and 'ms_per_token' in b
        same = (a['tokens'][:len(b['tokens'])] == b['tokens']) if ok else None
        def ms(x): return f"{x['ms_per_token']:,.2f}" if 'ms_per_token' in x else x.get('error', '-')
        def tps(x): return f"{1e3 / x['ms_per_token']:,.1f}" if 'ms_per_token' in x else '-'
        def mib(x): return f"{x['peak_mib']:,.0f}" if 'peak_mib' in x else '-'
        lines.append([f'{P:,}', ms(a), tps(a), f"{a['prefill_s']:.2f}" if 'prefill_s' in a else '-', ms(b), tps(b),
                      f"{b['ms_per_token'] / a['ms_per_token']:,.0f}x" if ok else '-', mib(a), mib(b),
                      {True: 'yes', False: 'NO', None: '-'}[same]])
    return markdown_table(['prompt', 'recurrent ms/token', 'recurrent tok/s', 'prefill s', 'recompute ms/token',
                           'recompute tok/s', 'speed-up', 'recurrent peak MiB', 'recompute peak MiB', 'same tokens'],
                          lines, 'r' * 10)


def main(quick: bool = True,                                    # 48 recurrent / 3 recomputed new tokens (else 256 / 12)
         prompts: list[int] = (1024, 8192, 32768),              # prompt lengths in tokens
         device: str = 'cuda' if torch.cuda.is_available() else 'cpu',  # cpu or cuda
         dim: int = 64,                                         # model width
         layers: int = 2,                                       # blocks
         frequencies: int = 16,                                 # resonances per channel (K)
         vocab: int = 256,                                      # vocabulary
         threads: int = 1):                                     # CPU threads (1: steadier on a shared machine)
    "New tokens per second after long prompts: the recurrent state against recomputing the context."
    torch.set_num_threads(threads)
    header(__file__)
    new = (48, 3) if quick else (256, 12)
    print(f'ResonanceNet dim {dim}, {layers} blocks, K {frequencies}, vocabulary {vocab}, fp32, batch 1, '
          f'{threads} thread(s), {device}; new tokens: {new[0]} recurrent, {new[1]} recomputed; greedy')
    base = dict(device=device, dim=dim, layers=layers, frequencies=frequencies, vocab=vocab, threads=threads)
    rows = []
    for P in prompts:
        for path, n in zip(('recurrent', 'recompute'), new):
            rows.append(run_one({**base, 'prompt': P, 'path': path, 'new': n}))
            r = rows[-1]
            print(f"  {path:>9} prompt {P:>6}: " + (f"{r['ms_per_token']:.2f} ms/token" if 'ms_per_token' in r
                                                    else r['error']), file=sys.stderr, flush=True)
    print()
    print(fmt_table(rows))
    by = {(r['prompt'], r['path']): r for r in rows}
    lo, hi = min(prompts), max(prompts)
    for path in ('recurrent', 'recompute'):
        a, b = by.get((lo, path), {}), by.get((hi, path), {})
        if 'ms_per_token' in a and 'ms_per_token' in b:
            print(f"time per new token {lo:,} -> {hi:,}: {path} {b['ms_per_token'] / a['ms_per_token']:.2f}x")
    return 0


if __name__ == '__main__':
    if len(sys.argv) == 3 and sys.argv[1] == WORKER:
        print(json.dumps(worker(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(run(main))
