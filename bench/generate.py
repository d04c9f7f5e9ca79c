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

Transformer rows (`--transformers`, on by default): a transformers Llama (a tiny one, and one of SmolLM2-135M's
shape, random weights built from a config) and the GPT baseline (tiny, and its `small` size), each continuing a
512-token prompt by 64 new tokens through `legalnb.evaluate.generate_ids`, the function `legalnb evaluate` and
`legalnb generate` use: through the model's KV cache (what the registry's `decoder_of` gives) against recomputing the
whole window for every token (`state=False`, what evaluation did before). The cached figure includes reading the
prompt once (prefill), spread over the 64 tokens; the recomputed side times 4 tokens (each costs the same).
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


def transformer(spec: dict) -> torch.nn.Module:
    "The model of a transformer row, random weights: a transformers Llama built from a config, or the GPT baseline."
    from legalnb.gpt import GPTLanguageModel, MODEL_SIZES
    if spec['family'] == 'gpt':
        shape = MODEL_SIZES['small'] if spec['size'] == 'small' else dict(dim=64, num_layers=2, num_heads=4)
        return GPTLanguageModel.from_kwargs(vocab_size=spec['vocab'], max_seq_len=spec['max_len'], init_std=0.1,
                                            **shape)
    from transformers import AutoConfig, AutoModelForCausalLM
    shape = (dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                  num_key_value_heads=3) if spec['size'] == 'small'   # SmolLM2-135M's shape
             else dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2))                        # legalnb.hf.tiny_config's
    cfg = AutoConfig.for_model('llama', vocab_size=spec['vocab'], max_position_embeddings=spec['max_len'],
                               tie_word_embeddings=True, **shape)
    return AutoModelForCausalLM.from_config(cfg)


def transformer_worker(spec: dict) -> dict:
    "One transformer measurement: `spec['path']` 'cached' (the model's KV cache) or 'recompute' (the whole window)."
    from legalnb.evaluate import EvalModel, generate_ids
    dev = torch.device(spec['device'])
    torch.manual_seed(0)
    m = transformer(spec).to(dev).eval()
    lm = EvalModel(m, None, spec['max_len'], eos_id=0)
    prompt = torch.randint(0, spec['vocab'], (spec['prompt'],), generator=torch.Generator().manual_seed(1)).tolist()
    state = spec['path'] == 'cached'
    generate_ids(lm, prompt, 2, 0, stop_at_eos=False, state=state)     # warm-up: the first passes allocate
    sync(dev); t0 = time.perf_counter()
    tokens = generate_ids(lm, prompt, spec['new'], 0, stop_at_eos=False, state=state)
    sync(dev); t1 = time.perf_counter()
    return dict(model=f"{spec['family']} {spec['size']}", params=sum(p.numel() for p in m.parameters()),
                prompt=spec['prompt'], path=spec['path'], new=spec['new'], ms_per_token=1e3 * (t1 - t0) / spec['new'],
                tokens=tokens, peak_mib=(torch.cuda.max_memory_allocated() / 2**20 if dev.type == 'cuda'
                                         else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def transformer_table(rows: list[dict]) -> str:
    "One line per transformer: cached and recomputed ms and tokens/s per new token, the speed-up, same tokens."
    by = {(r.get('model'), r['path']): r for r in rows}
    lines = []
    for name in dict.fromkeys(r.get('model') for r in rows):
        a, b = by.get((name, 'cached'), {}), by.get((name, 'recompute'), {})
        ok = 'ms_per_token' in a and 'ms_per_token' in b
        def ms(x): return f"{x['ms_per_token']:,.1f}" if 'ms_per_token' in x else x.get('error', '-')
        def tps(x): return f"{1e3 / x['ms_per_token']:,.1f}" if 'ms_per_token' in x else '-'
        same = {True: 'yes', False: 'NO'}[a['tokens'][:len(b['tokens'])] == b['tokens']] if ok else '-'
        lines.append([name, f"{a.get('params', b.get('params', 0)) / 1e6:,.2f}M", f"{a.get('prompt', '-'):,}", ms(a),
                      tps(a), ms(b), tps(b), f"{b['ms_per_token'] / a['ms_per_token']:,.1f}x" if ok else '-', same])
    return markdown_table(['model', 'params', 'prompt', 'cached ms/token', 'cached tok/s', 'recompute ms/token',
                           'recompute tok/s', 'speed-up', 'same tokens'], lines, 'lrrrrrrrr')


WORKER = '--worker'   # `bench/generate.py --worker '{json}'`: one measurement, in the subprocess run_one starts


def run_one(spec: dict) -> dict:
    "Run `worker(spec)` in a fresh subprocess and return its result (or the error's last line)."
    r = subprocess.run([sys.executable, __file__, WORKER, json.dumps(spec)], capture_output=True, text=True,
                       env={**os.environ, 'MALLOC_MMAP_MAX_': '0', 'MALLOC_TRIM_THRESHOLD_': str(1 << 34)})
    if r.returncode != 0:
        return dict(prompt=spec['prompt'], path=spec['path'], error=(r.stderr.strip().splitlines() or ['?'])[-1][:100],
                    **({'model': f"{spec['family']} {spec['size']}"} if 'family' in spec else {}))
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


def transformer_rows(device: str, threads: int, sizes: list[str], prompt: int = 512, new: tuple = (64, 4)):
    "The transformer table: each model's KV cache against recomputing the window, after a `prompt`-token prompt."
    print(f'Transformers, random weights, fp32, batch 1, {threads} thread(s), {device}; a {prompt}-token prompt, greedy, '
          f'{new[0]} new tokens through the cache (prefill included), {new[1]} recomputed; through '
          'legalnb.evaluate.generate_ids')
    rows = []
    for family in ('llama', 'gpt'):
        for size in sizes:
            for path, n in zip(('cached', 'recompute'), new):
                spec = dict(family=family, size=size, path=path, new=n, prompt=prompt, device=device, threads=threads,
                            vocab=49152 if (family, size) == ('llama', 'small') else 2048, max_len=2 * prompt)
                rows.append(run_one(spec))
                r = rows[-1]
                print(f"  {family} {size} {path:>9}: " + (f"{r['ms_per_token']:.1f} ms/token" if 'ms_per_token' in r
                                                           else r['error']), file=sys.stderr, flush=True)
    print()
    print(transformer_table(rows))
    print()
    return rows


def main(quick: bool = True,                                    # 48 recurrent / 3 recomputed new tokens (else 256 / 12)
         prompts: list[int] = (1024, 8192, 32768),              # prompt lengths in tokens
         device: str = 'cuda' if torch.cuda.is_available() else 'cpu',  # cpu or cuda
         dim: int = 64,                                         # model width
         layers: int = 2,                                       # blocks
         frequencies: int = 16,                                 # resonances per channel (K)
         vocab: int = 256,                                      # vocabulary
         threads: int = 1,                                      # CPU threads (1: steadier on a shared machine)
         resonance: bool = True,                                # the ResonanceNet rows (1k, 8k, 32k prompts)
         transformers: bool = True,                             # the transformer rows (512-token prompt)
         sizes: list[str] = ('tiny', 'small')):                 # the transformer rows' sizes
    "New tokens per second after long prompts: the recurrent state against recomputing the context."
    torch.set_num_threads(threads)
    header(__file__, 'transformers')
    if transformers: transformer_rows(device, threads, sizes)
    if not resonance: return 0
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
        spec = json.loads(sys.argv[2])
        torch.set_num_threads(spec['threads'])
        print(json.dumps((transformer_worker if 'family' in spec else worker)(spec)))
        sys.exit(0)
    sys.exit(run(main))
