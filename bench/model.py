"""Training-step speed and peak memory: ResonanceLanguageModel against a GPT of the same non-embedding size.

Each measurement (model, sequence length) runs in its own subprocess, so that peak memory is that run's alone:
on the CPU the peak resident set (resource.getrusage maxrss; tracemalloc does not see torch's allocator), on a
GPU torch.cuda.max_memory_allocated. A step is forward + backward + AdamW step at batch 1.

    python bench/model.py                 # CPU: narrow models (dim 128, 2 layers), L = 512 .. 32768, ~2-4 minutes
    python bench/model.py --device cuda   # GPU: small and medium sizes in bf16, with MFU
    python bench/model.py --lengths 512 2048 --dim 64   # a quicker look
    python bench/model.py --default-malloc   # CPU: glibc's default allocator settings (slower at 32k, see CPU_MALLOC_ENV)

MFU counts matrix-product FLOPs only (the tensor cores' peak is for matrix products): for ResonanceNet
6 * N_matmul per token (config.matmul_flops_per_token, Kaplan et al. 2020); for the GPT 6 * N_matmul plus the
attention products QK^T and AV, 2 * 2 * L * D per layer per token forward counted at half for the causal mask,
times 3 for training: 6 * L * D per layer per token.
"""
from __future__ import annotations
import os, sys
# run as a script, this folder comes first on sys.path: keep sibling benchmarks (bench/select.py) from
# shadowing standard modules of the same name
sys.path[:] = [p for p in sys.path if os.path.realpath(p or '.') != os.path.dirname(os.path.realpath(__file__))]
import argparse, json, math, os, platform, resource, subprocess, sys, time
from datetime import datetime, timezone

import torch
import torch.nn as nn
import torch.nn.functional as F

from legalnb.resonance import ResonanceConfig, ResonanceLanguageModel, config_for


class GPTBlock(nn.Module):
    "Pre-norm transformer block: causal self-attention (scaled_dot_product_attention), then a GELU MLP."
    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.heads = heads
        self.norm1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, int(mlp_ratio * dim), bias=False), nn.GELU(), nn.Linear(int(mlp_ratio * dim), dim, bias=False))

    def forward(self, x):
        B, L, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)  # (B, H, L, D/H) each
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, L, D)
        x = x + self.proj(a)
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    "The baseline: token + learned position embeddings, pre-norm blocks, final LayerNorm, head tied to the embedding."
    def __init__(self, vocab_size: int, dim: int, num_layers: int, heads: int, max_seq_len: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab_size, dim), nn.Embedding(max_seq_len, dim)
        self.blocks = nn.ModuleList(GPTBlock(dim, heads, mlp_ratio) for _ in range(num_layers))
        self.norm, self.lm_head = nn.LayerNorm(dim), nn.Linear(dim, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        self.dim, self.num_layers, self.vocab_size = dim, num_layers, vocab_size
        for n, p in self.named_parameters():
            if p.ndim == 2: nn.init.normal_(p, 0, 0.02 / math.sqrt(2 * num_layers) if n.endswith(('proj.weight', 'mlp.2.weight')) else 0.02)

    def forward(self, ids, targets):
        x = self.tok_emb(ids) + self.pos_emb.weight[:ids.shape[1]]
        for b in self.blocks: x = b(x)
        logits = self.lm_head(self.norm(x))
        return logits, F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    def non_embedding_params(self) -> int:
        return sum(p.numel() for p in self.parameters()) - self.tok_emb.weight.numel() - self.pos_emb.weight.numel()

    def matmul_flops_per_token(self, seq_len: int) -> float:
        n_matmul = self.num_layers * 12 * self.dim ** 2 + self.vocab_size * self.dim
        return 6.0 * n_matmul + 6.0 * self.num_layers * seq_len * self.dim


def build(kind: str, args) -> tuple[nn.Module, float, int]:
    "The model, its training matmul FLOPs per token at args.seq_len, and its non-embedding parameter count."
    if args.size: cfg = config_for(args.size, args.vocab, max_seq_len=args.max_seq_len)
    else: cfg = ResonanceConfig(vocab_size=args.vocab, dim=args.dim, num_layers=args.layers,
                                num_frequencies=args.frequencies, max_seq_len=args.max_seq_len)
    cfg.checkpointing = args.checkpointing
    if kind == 'resonance':
        m = ResonanceLanguageModel(cfg)
        return m, cfg.matmul_flops_per_token(), m.num_params(non_embedding=True)
    m = GPT(cfg.vocab_size, cfg.dim, cfg.num_layers, max(1, cfg.dim // 64), cfg.max_seq_len, cfg.mlp_ratio)
    return m, m.matmul_flops_per_token(args.seq_len), m.non_embedding_params()


def worker(args) -> dict:
    "One measurement in this process: warm-up steps, then timed steps; prints one JSON line."
    torch.manual_seed(0)
    dev = torch.device(args.device)
    if dev.type == 'cpu': torch.set_num_threads(args.threads)
    model, mm_flops, n_nonemb = build(args.model, args)
    model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # fused: 8x faster on the 32k position table on CPU
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
               us_per_token=1e6 * dt / tok, non_embedding=n_nonemb, loss=float(loss.detach()), matmul_flops_per_token=mm_flops)
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


def run_one(model: str, L: int, args, extra: list[str]) -> dict:
    "Run one measurement in a fresh subprocess and return its JSON line."
    cmd = [sys.executable, __file__, '--worker', '--model', model, '--seq-len', str(L), '--device', args.device,
           '--threads', str(args.threads)] + extra
    if args.device == 'cpu' and L >= 32768:  # one GPT step there takes 1-2 minutes: no warm-up step for it (its
        # first-step overhead, about a second, is ~1% of that step); ResonanceNet's ~10 s step gets its warm-up
        cmd += ['--reps', '1', '--warmup', '1' if model == 'resonance' else '0']
    else: cmd += ['--reps', str(args.reps), '--warmup', str(args.warmup)]
    env = dict(os.environ)
    if args.device == 'cpu' and not args.default_malloc: env.update(CPU_MALLOC_ENV)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0: return dict(model=model, seq_len=L, error=(r.stderr.strip().splitlines() or ['failed'])[-1][:120])
    return json.loads(r.stdout.strip().splitlines()[-1])


def fmt_table(rows: list[dict], peak: float | None) -> str:
    "The comparison table: one line per length, ResonanceNet vs GPT, ratio of tokens/s."
    by = {(r['model'], r['seq_len']): r for r in rows}
    lengths = sorted({r['seq_len'] for r in rows})
    head = f"| L | Resonance tok/s | GPT tok/s | ratio R/GPT | Resonance peak MiB | GPT peak MiB |"
    if peak: head += ' Resonance MFU | GPT MFU |'
    lines = [head, '|' + '---|' * (head.count('|') - 1)]
    for L in lengths:
        r, g = by.get(('resonance', L), {}), by.get(('gpt', L), {})
        def tps(x): return f"{x['tokens_per_s']:,.0f}" if 'tokens_per_s' in x else x.get('error', '-')
        def mem(x): return f"{x['peak_mib']:,.0f}" + (f" (+{x['step_mib']:,.0f})" if 'step_mib' in x else '') if 'peak_mib' in x else '-'
        ratio = f"{r['tokens_per_s'] / g['tokens_per_s']:.2f}" if 'tokens_per_s' in r and 'tokens_per_s' in g else '-'
        line = f"| {L:,} | {tps(r)} | {tps(g)} | {ratio} | {mem(r)} | {mem(g)} |"
        if peak:
            mfu = lambda x: f"{100 * x['tokens_per_s'] * x['matmul_flops_per_token'] / peak:.1f}%" if 'tokens_per_s' in x else '-'
            line += f" {mfu(r)} | {mfu(g)} |"
        lines.append(line)
    return '\n'.join(lines)


def growth(rows: list[dict], model: str, a: int = 2048, b: int = 32768) -> str:
    "Time-per-token growth from length a to length b."
    by = {(r['model'], r['seq_len']): r for r in rows}
    ra, rb = by.get((model, a), {}), by.get((model, b), {})
    if 'us_per_token' not in ra or 'us_per_token' not in rb: return 'n/a'
    return f"{rb['us_per_token'] / ra['us_per_token']:.2f}x ({ra['us_per_token']:.1f} -> {rb['us_per_token']:.1f} us/token)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog='bench/model.py', description=__doc__.split('\n')[0])
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--lengths', type=int, nargs='+', default=[512, 2048, 8192, 32768])
    p.add_argument('--sizes', nargs='+', default=['small', 'medium'], help='GPU: model sizes to measure')
    p.add_argument('--dim', type=int, default=128, help='CPU: model width')
    p.add_argument('--layers', type=int, default=2, help='CPU: blocks')
    p.add_argument('--frequencies', type=int, default=16, help='CPU: resonances per channel')
    p.add_argument('--vocab', type=int, default=None, help='vocabulary (default: 256 bytes on the CPU, 32768 on a GPU)')
    p.add_argument('--max-seq-len', type=int, default=32768)
    p.add_argument('--batch', type=int, default=1)
    p.add_argument('--reps', type=int, default=3, help='timed steps per measurement (CPU at 32k: 1, no warm-up)')
    p.add_argument('--threads', type=int, default=1, help='CPU threads (1: steadier timings on a shared machine)')
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--max-time', type=float, default=60.0, help='stop timing a measurement after this many seconds')
    p.add_argument('--compile', action='store_true', help='torch.compile the model (GPU)')
    p.add_argument('--checkpointing', action='store_true')
    p.add_argument('--default-malloc', action='store_true',
                   help="CPU: glibc malloc's default settings (fresh mmap per block over 32 MiB; see CPU_MALLOC_ENV)")
    p.add_argument('--models', nargs='+', default=['resonance', 'gpt'])
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--model', help=argparse.SUPPRESS)
    p.add_argument('--seq-len', type=int, help=argparse.SUPPRESS)
    p.add_argument('--size', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.vocab is None: args.vocab = 256 if args.device == 'cpu' else 32768
    if args.worker: print(json.dumps(worker(args))); return 0

    common = ['--vocab', str(args.vocab), '--max-seq-len', str(args.max_seq_len), '--batch', str(args.batch),
              '--max-time', str(args.max_time)]
    common += ['--compile'] * args.compile + ['--checkpointing'] * args.checkpointing
    if args.device == 'cpu':
        cpu = platform.processor() or platform.machine()
        print(f'# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, CPU: {cpu}, {os.cpu_count()} cores, '
              f'torch {torch.__version__}, {args.threads} thread(s); fp32, batch {args.batch}, fused AdamW; '
              f'load average {os.getloadavg()[0]:.1f} at start (a shared machine: timings vary); malloc: '
              + ('glibc defaults' if args.default_malloc else ' '.join(f'{k}={v}' for k, v in CPU_MALLOC_ENV.items())))
        print('GPU: not measured (no GPU available)' if not torch.cuda.is_available() else 'GPU: run with --device cuda')
        setups = [('dim %d, %d layers, K %d' % (args.dim, args.layers, args.frequencies),
                   ['--dim', str(args.dim), '--layers', str(args.layers), '--frequencies', str(args.frequencies)])]
        peak = None
    else:
        print(f'# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, GPU: {torch.cuda.get_device_name()}, '
              f'torch {torch.__version__}; bf16 autocast (FFT island fp32), batch {args.batch}, compile={args.compile}')
        setups = [(s, ['--size', s]) for s in args.sizes]
        peak = gpu_peak_flops()
        print(f'dense bf16 peak: {peak / 1e12:.0f} TFLOP/s' if peak else 'dense bf16 peak: unknown GPU, no MFU')
    for name, extra in setups:
        rows = []
        for L in args.lengths:
            for m in args.models:
                rows.append(run_one(m, L, args, common + extra))
                r = rows[-1]
                print(f"  {m:>9} L={L:>6}: " + (f"{r['tokens_per_s']:,.0f} tok/s, peak {r['peak_mib']:,.0f} MiB, {r['reps']} reps"
                                                if 'tokens_per_s' in r else r['error']), file=sys.stderr, flush=True)
        nonemb = {r['model']: r['non_embedding'] for r in rows if 'non_embedding' in r}
        print(f"\n## {name}: non-embedding parameters " + ', '.join(f'{k} {v:,}' for k, v in nonemb.items()))
        print(fmt_table(rows, peak))
        print(f"time per token 2k -> 32k: ResonanceNet {growth(rows, 'resonance')}, GPT {growth(rows, 'gpt')}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
