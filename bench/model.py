"""Training-step speed and peak memory: ResonanceLanguageModel against a GPT of the same non-embedding size.

The GPT measured is the package's transformer baseline, `legalnb.gpt.GPTLanguageModel` (pre-norm, RoPE, SwiGLU,
scaled_dot_product_attention, tied head), the model `legalnb train --model gpt` and `legalnb compare` train; both
models are built through the registry (`legalnb.models.get_model`), at the registry's named sizes (whose
non-embedding parameters are matched) on a GPU, or at the same width and depth on the CPU. Until 2026-11 this
script measured its own copy (learned positions, GELU MLP); numbers recorded before then are for that copy.

Each measurement (model, sequence length) runs in its own subprocess, so that peak memory is that run's alone:
on the CPU the peak resident set (resource.getrusage maxrss; tracemalloc does not see torch's allocator), on a
GPU torch.cuda.max_memory_allocated. A step is forward + backward + AdamW step at batch 1.

    python bench/model.py                 # CPU: narrow models (dim 128, 2 layers), L = 512 .. 32768, ~2-4 minutes
    python bench/model.py --device cuda   # GPU: small and medium sizes in bf16, with MFU
    python bench/model.py --lengths 512 2048 --dim 64   # a quicker look
    python bench/model.py --attention-layers 1 --lengths 2048 8192   # the hybrid ResonanceNet (issue 19)
    python bench/model.py --linear-layers 0 --models resonance   # linear attention (Based) in block 0
    python bench/model.py --default-malloc   # CPU: glibc's default allocator (slower at 32k, see CPU_MALLOC_ENV)

MFU counts matrix-product FLOPs only (the tensor cores' peak is for matrix products): for ResonanceNet
6 * N_matmul per token (the spec's matmul_flops_per_token, Kaplan et al. 2020); for the GPT its
GPTConfig.flops_per_token: 6 * N_matmul plus the attention products QK^T and AV, 2 * 2 * L * D per layer per token
forward counted at half for the causal mask, times 3 for training: 6 * L * D per layer per token.
"""
from __future__ import annotations
import json, os, resource, subprocess, sys, time
from dataclasses import fields
from types import SimpleNamespace

import torch
import torch.nn as nn

from common import header, markdown_table, run
from legalnb.models import get_model


def build(kind: str, args) -> tuple[nn.Module, float, int]:
    "The package's model `kind` (registry), its training matmul FLOPs per token, its non-embedding parameters."
    spec = get_model(kind)
    has = {f.name for f in fields(spec.config_class)}
    shape = {} if args.size else dict(dim=args.dim, num_layers=args.layers, num_frequencies=args.frequencies,
                                      num_heads=max(1, args.dim // 64))  # CPU: the same width and depth for both
    if kind == 'resonance':   # the hybrid (issue 19): attention mixers in these blocks, optionally windowed
        shape.update(attention_layers=list(getattr(args, 'attention_layers', ())),
                     attention_window=getattr(args, 'attention_window', 0),
                     linear_layers=list(getattr(args, 'linear_layers', ())),
                     recall_layers=[0] if getattr(args, 'recall', True) else [])
        if getattr(args, 'resonance', ''):   # any other fields, 'delta_layers=[1],filter_heads=2' (bench/recall.py's)
            from recall import parse_model
            shape.update(parse_model('resonance:' + args.resonance)[1])
    cfg = spec.config(args.size or 'small', args.vocab, args.max_seq_len, checkpointing=args.checkpointing,
                      **{k: v for k, v in shape.items() if k in has})
    m = spec.build(cfg)
    # attention's QK^T and AV are matrix products too: the gpt counts them (flops_per_token), ResonanceNet's FFT not
    flops = spec.flops_per_token(cfg, args.seq_len) if kind == 'gpt' else spec.matmul_flops_per_token(cfg)
    return m, flops, m.num_params(non_embedding=True)


def worker(args) -> dict:
    "One measurement in this process: warm-up steps, then timed steps; prints one JSON line."
    torch.manual_seed(0)
    dev = torch.device(args.device)
    if dev.type == 'cpu': torch.set_num_threads(args.threads)
    model, mm_flops, n_nonemb = build(args.model, args)
    model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # fused: 8x faster on the 32k position table (CPU)
    if args.compile: model = torch.compile(model)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), device=dev)
    x, y = ids[:, :-1], ids[:, 1:]
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == 'cuda')
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB: interpreter, torch and weights

    def step():
        with amp: loss = model(x, y)[1]
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if dev.type == 'cuda' else (lambda: None)
    try:
        for _ in range(args.warmup): step()
        sync()
        if dev.type == 'cuda': torch.cuda.reset_peak_memory_stats()
        times = []
        while len(times) < args.reps:  # stop early past max_time: a slow baseline does not stall the run
            t0 = time.perf_counter(); loss = step(); sync(); times.append(time.perf_counter() - t0)
            if sum(times) > args.max_time: break
    except torch.cuda.OutOfMemoryError:
        return dict(model=args.model, seq_len=args.seq_len, error='out of memory')
    dt = sorted(times)[len(times) // 2]  # median step time
    tok = args.batch * args.seq_len
    out = dict(model=args.model, seq_len=args.seq_len, reps=len(times), step_s=dt, tokens_per_s=tok / dt,
               us_per_token=1e6 * dt / tok, non_embedding=n_nonemb, loss=float(loss.detach()),
               matmul_flops_per_token=mm_flops)
    if dev.type == 'cuda': out['peak_mib'] = torch.cuda.max_memory_allocated() / 2 ** 20
    else:
        out['peak_mib'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out['step_mib'] = out['peak_mib'] - rss_before  # what the step itself added to the peak
    return out


def gpu_peak_flops() -> float | None:
    "Dense bf16 tensor-core peak of this GPU in FLOP/s (from legalnb.presets), or None when unknown."
    try:
        from legalnb.presets import find_gpu
        return find_gpu(torch.cuda.get_device_name()).bf16_tflops * 1e12
    except Exception: return None


# glibc malloc serves every block over 32 MiB with a fresh mmap and unmaps it on free, so at 32k tokens each
# large activation or FFT buffer pays page faults and kernel zero-filling on first touch, every step: a cost
# that exists only at long lengths (measured: ResonanceNet 7.8k -> 11.8k tok/s at 32k, unchanged at 2k). Keeping
# freed memory in the heap (what jemalloc or tcmalloc do, as PyTorch's CPU tuning guide recommends) removes it.
# Both models get the same setting; --default-malloc measures without it.
CPU_MALLOC_ENV = {'MALLOC_MMAP_MAX_': '0', 'MALLOC_TRIM_THRESHOLD_': str(1 << 34)}


def run_one(spec: dict, env_extra: dict) -> dict:
    "Run one measurement (`worker`'s arguments as a dict) in a fresh subprocess and return its JSON line."
    r = subprocess.run([sys.executable, __file__, WORKER, json.dumps(spec)], capture_output=True, text=True,
                       env={**os.environ, **env_extra})
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ['failed'])[-1][:120]
        return dict(model=spec['model'], seq_len=spec['seq_len'], error=last)
    return json.loads(r.stdout.strip().splitlines()[-1])


def fmt_table(rows: list[dict], peak: float | None) -> str:
    "The comparison table: one line per length, ResonanceNet vs GPT, ratio of tokens/s."
    by = {(r['model'], r['seq_len']): r for r in rows}
    def tps(x): return f"{x['tokens_per_s']:,.0f}" if 'tokens_per_s' in x else x.get('error', '-')
    def mem(x):
        if 'peak_mib' not in x: return '-'
        return f"{x['peak_mib']:,.0f}" + (f" (+{x['step_mib']:,.0f})" if 'step_mib' in x else '')
    def mfu(x):
        if 'tokens_per_s' not in x: return '-'
        return f"{100 * x['tokens_per_s'] * x['matmul_flops_per_token'] / peak:.1f}%"
    columns = ['L', 'Resonance tok/s', 'GPT tok/s', 'ratio R/GPT', 'Resonance peak MiB', 'GPT peak MiB']
    if peak: columns += ['Resonance MFU', 'GPT MFU']
    lines = []
    for L in sorted({r['seq_len'] for r in rows}):
        r, g = by.get(('resonance', L), {}), by.get(('gpt', L), {})
        ratio = f"{r['tokens_per_s'] / g['tokens_per_s']:.2f}" if 'tokens_per_s' in r and 'tokens_per_s' in g else '-'
        lines.append([f'{L:,}', tps(r), tps(g), ratio, mem(r), mem(g)] + ([mfu(r), mfu(g)] if peak else []))
    return markdown_table(columns, lines, 'r' * len(columns))


def growth(rows: list[dict], model: str, a: int = 2048, b: int = 32768) -> str:
    "Time-per-token growth from length a to length b."
    by = {(r['model'], r['seq_len']): r for r in rows}
    ra, rb = by.get((model, a), {}), by.get((model, b), {})
    if 'us_per_token' not in ra or 'us_per_token' not in rb: return 'n/a'
    ua, ub = ra['us_per_token'], rb['us_per_token']
    return f'{ub / ua:.2f}x ({ua:.1f} -> {ub:.1f} us/token)'


WORKER = '--worker'   # `bench/model.py --worker '{json}'`: one measurement, in the subprocess that `run_one` starts


def main(device: str = 'cuda' if torch.cuda.is_available() else 'cpu',  # cpu or cuda
         lengths: list[int] = (512, 2048, 8192, 32768),  # sequence lengths to measure
         sizes: list[str] = ('small', 'medium'),         # GPU: model sizes to measure
         dim: int = 128,                                  # CPU: model width
         layers: int = 2,                                 # CPU: blocks
         frequencies: int = 16,                           # CPU: resonances per channel
         vocab: int | None = None,                        # vocabulary (default: 256 bytes on the CPU, 32768 on a GPU)
         max_seq_len: int = 32768,                        # the models' position table
         batch: int = 1,                                  # sequences per step
         reps: int = 3,                                   # timed steps per measurement (CPU at 32k: 1, no warm-up)
         threads: int = 1,                                # CPU threads (1: steadier timings on a shared machine)
         warmup: int = 1,                                 # untimed steps before the timed ones
         max_time: float = 60.0,                          # stop timing a measurement after this many seconds
         compile: bool = False,                           # torch.compile the model (GPU)
         checkpointing: bool = False,                     # activation checkpointing
         default_malloc: bool = False,                    # CPU: glibc malloc's defaults (slower at 32k; CPU_MALLOC_ENV)
         models: list[str] = ('resonance', 'gpt'),       # which models to measure
         attention_layers: list[int] = (),               # ResonanceNet: blocks with an attention mixer (the hybrid)
         attention_window: int = 0,                      # ResonanceNet: those blocks' window (0: full causal)
         linear_layers: list[int] = (),                  # ResonanceNet: blocks with a linear-attention mixer (Based)
         recall: bool = True,                            # ResonanceNet: the recall branch in block 0 (the default)
         resonance: str = ''):                           # ResonanceNet: more config fields, 'delta_layers=[1],...'
    "Training-step speed and peak memory: ResonanceLanguageModel against a GPT of the same non-embedding size."
    if vocab is None: vocab = 256 if device == 'cpu' else 32768
    common = dict(device=device, threads=threads, vocab=vocab, max_seq_len=max_seq_len, batch=batch, max_time=max_time,
                  compile=compile, checkpointing=checkpointing, size=None, dim=dim, layers=layers,
                  frequencies=frequencies, attention_layers=list(attention_layers), attention_window=attention_window,
                  linear_layers=list(linear_layers), recall=recall, resonance=resonance)
    if device == 'cpu': torch.set_num_threads(threads)   # as the workers do, so that the header says what they use
    header(__file__)
    if device == 'cpu':
        print(f'fp32, batch {batch}, fused AdamW, {threads} thread(s); a shared machine: timings vary; malloc: '
              + ('glibc defaults' if default_malloc else ' '.join(f'{k}={v}' for k, v in CPU_MALLOC_ENV.items())))
        print('GPU: run with --device cuda' if torch.cuda.is_available() else 'GPU: not measured (no GPU available)')
        hybrid = (f', ResonanceNet attention in blocks {list(attention_layers)} (window {attention_window or "full"})'
                  * bool(attention_layers) + f', linear attention in blocks {list(linear_layers)}' * bool(linear_layers)
                  + (', recall branch in block 0' if recall else ', no recall branch')
                  + (f', {resonance}' if resonance else ''))
        setups = [('dim %d, %d layers, K %d' % (dim, layers, frequencies) + hybrid, {})]
        peak = None
    else:
        print(f'bf16 autocast (FFT island fp32), batch {batch}, compile={compile}')
        setups = [(s, dict(size=s)) for s in sizes]
        peak = gpu_peak_flops()
        print(f'dense bf16 peak: {peak / 1e12:.0f} TFLOP/s' if peak else 'dense bf16 peak: unknown GPU, no MFU')
    env = CPU_MALLOC_ENV if device == 'cpu' and not default_malloc else {}
    for name, extra in setups:
        rows = []
        for L in lengths:
            for m in models:
                # on the CPU one GPT step at 32k takes 1-2 minutes: no warm-up step for it (its first-step overhead,
                # about a second, is ~1% of that step); ResonanceNet's ~10 s step gets its warm-up
                if device == 'cpu' and L >= 32768:
                    steps = dict(reps=1, warmup=1 if m == 'resonance' else 0)
                else: steps = dict(reps=reps, warmup=warmup)
                rows.append(run_one({**common, **extra, **steps, 'model': m, 'seq_len': L}, env))
                r = rows[-1]
                done = (f"{r['tokens_per_s']:,.0f} tok/s, peak {r['peak_mib']:,.0f} MiB, {r['reps']} reps"
                        if 'tokens_per_s' in r else r['error'])
                print(f'  {m:>9} L={L:>6}: {done}', file=sys.stderr, flush=True)
        nonemb = {r['model']: r['non_embedding'] for r in rows if 'non_embedding' in r}
        print(f"\n## {name}: non-embedding parameters " + ', '.join(f'{k} {v:,}' for k, v in nonemb.items()))
        print(fmt_table(rows, peak))
        print(f"time per token 2k -> 32k: ResonanceNet {growth(rows, 'resonance')}, GPT {growth(rows, 'gpt')}")


if __name__ == '__main__':
    if sys.argv[1:2] == [WORKER]: print(json.dumps(worker(SimpleNamespace(**json.loads(sys.argv[2])))))
    else: sys.exit(run(main))
