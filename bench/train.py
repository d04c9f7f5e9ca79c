"""Benchmark of the native trainer (legalnb.train).

1. Trainer step time against a bare hand-written loop (forward, backward, clip, AdamW step) on the same model and
   the same batch shape: the trainer's own cost (data loader, schedule, accumulation bookkeeping, logging) as a
   ratio. Target: <= 3% overhead.
2. Checkpoint save time against step time: what one save costs, and its share of a run that saves every 2000 steps.
3. On a GPU: tokens/s and MFU of the 'small' model at 3072 and 32768 tokens per sequence.

Each timing is the median of per-step times after warm-up; the two loops alternate over several rounds and the
best round of each is kept, so a noisy shared machine biases neither side.

    python bench/train.py [--steps 30] [--rounds 3] [--dim 128] [--seq-len 256] [--batch-size 8]
"""
import sys
from pathlib import Path
# python puts this script's folder first on sys.path, where bench/select.py would shadow the standard library's select
sys.path = [p for p in sys.path if Path(p or '.').resolve() != Path(__file__).resolve().parent]
import argparse, json, math, os, platform, statistics, tempfile, time

import numpy as np
import torch

from legalnb.resonance import ResonanceLanguageModel
from legalnb.train import (TrainConfig, train, model_config, make_optimizer, save_checkpoint, rng_state, read_metrics,
                           device_precision, autocast_for, peak_flops)

def random_split(folder: Path, rows: int, seq_len: int, vocab: int, seed: int = 0) -> Path:
    "A corpus of random token rows (speed does not depend on the ids), split by the data stage."
    from legalnb.data import split
    rng = np.random.default_rng(seed)
    corpus = folder.parent/f'{folder.name}-corpus'; corpus.mkdir(parents=True)
    np.save(corpus/'shard_00000.npy', rng.integers(0, vocab, (rows, seq_len + 1), dtype=np.uint16))
    (corpus/'manifest.json').write_text(json.dumps({'vocab_size': vocab}))
    split(corpus, folder, val_ratio=1/16, seed=0, by='rows')
    return folder

def bare_loop(cfg: TrainConfig, vocab: int, seq_len: int, steps: int, device: torch.device) -> list[float]:
    "Seconds per step of a hand-written loop: the same model, optimizer, precision and batch, nothing else."
    torch.manual_seed(cfg.seed)
    model = ResonanceLanguageModel(model_config(cfg, vocab, seq_len)).to(device)
    opt, prec = make_optimizer(model, cfg, device), device_precision(cfg.precision, device)
    x = torch.randint(0, vocab, (cfg.batch_size, seq_len), device=device); y = torch.roll(x, -1, 1)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        with autocast_for(prec, device): _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step(); opt.zero_grad(set_to_none=True)
        if device.type == 'cuda': torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return times

def trainer_loop(cfg: TrainConfig) -> tuple[list[float], dict]:
    "Seconds per step of `train(cfg)` logged every step (each log is a host sync, as the bare loop's step end)."
    summary = train(cfg)
    return [r['step_ms'] / 1000 for r in read_metrics(Path(cfg.out)/'metrics.jsonl')], summary

def save_seconds(cfg: TrainConfig, vocab: int, seq_len: int, out: Path, repeats: int = 3) -> float:
    "Median seconds of one full checkpoint save (model, AdamW state, RNG) of this model."
    model = ResonanceLanguageModel(model_config(cfg, vocab, seq_len))
    opt = make_optimizer(model, cfg, torch.device('cpu'))
    model(torch.zeros(1, seq_len, dtype=torch.long), torch.zeros(1, seq_len, dtype=torch.long))[1].backward(); opt.step()
    times = []
    for i in range(repeats):
        state = dict(model=model.state_dict(), optimizer=opt.state_dict(), scaler={}, scheduler={}, rng=rng_state(),
                     data={'step': i}, step=i + 1, elapsed=0.0, config={}, model_config=model.config.to_dict())
        t = time.perf_counter(); save_checkpoint(out, state, keep=1); times.append(time.perf_counter() - t)
    return statistics.median(times)

def hardware() -> str:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'
    return f'{platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), {gpu}'

def gpu_rows(tmp: Path, steps: int) -> list[str]:
    "tokens/s and MFU of the 'small' model at 3072 and 32768 tokens per sequence, on this GPU."
    rows = []
    for seq_len, batch in ((3072, 8), (32768, 1)):
        split = random_split(tmp/f'gpu{seq_len}', rows=batch * (steps + 2) * 16 // 15 + 16, seq_len=seq_len, vocab=32768)
        cfg = TrainConfig(data=str(split), out=str(tmp/f'gpu-run{seq_len}'), size='small', batch_size=batch, max_steps=steps,
                          warmup_steps=1, eval_every=0, eval_batches=1, save_every=10**6, log_every=5, num_workers=4,
                          progress=False, activation_checkpointing=seq_len > 8192)
        _, s = trainer_loop(cfg)
        recs = read_metrics(Path(cfg.out)/'metrics.jsonl')[1:]  # the first interval pays for warm-up
        tps = statistics.median(r['tokens_per_sec'] for r in recs)
        mfu = statistics.median(r['mfu'] for r in recs) if recs[0]['mfu'] is not None else float('nan')
        rows.append(f'| small, {seq_len:,} tokens x {batch} ({s["precision"]}) | {tps:,.0f} tok/s | MFU {mfu:.1%} |')
    return rows

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--steps', type=int, default=30); ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--dim', type=int, default=128); ap.add_argument('--num-layers', type=int, default=2)
    ap.add_argument('--seq-len', type=int, default=256); ap.add_argument('--batch-size', type=int, default=8)
    ap.add_argument('--vocab', type=int, default=4096); ap.add_argument('--gpu-steps', type=int, default=30)
    a = ap.parse_args()
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    warm = max(3, a.steps // 5)
    print(f'# legalnb trainer benchmark, {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}\n# {hardware()}')
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        split = random_split(tmp/'split', rows=a.batch_size * (a.steps + 4) * 16 // 15 + 16, seq_len=a.seq_len, vocab=a.vocab)
        base = dict(data=str(split), dim=a.dim, num_layers=a.num_layers, num_frequencies=16, batch_size=a.batch_size,
                    max_steps=a.steps, warmup_steps=2, eval_every=0, eval_batches=1, save_every=10**6, log_every=1,
                    num_workers=0 if device.type == 'cpu' else 4, progress=False, seed=0)
        bare, trainer = [], []
        for r in range(a.rounds):  # alternate, keep each side's best round
            bare.append(statistics.median(bare_loop(TrainConfig(**base), a.vocab, a.seq_len, a.steps, device)[warm:]))
            times, summary = trainer_loop(TrainConfig(**base, out=str(tmp/f'run{r}')))
            trainer.append(statistics.median(times[warm:]))
        b, t = min(bare), min(trainer)
        save = save_seconds(TrainConfig(**base), a.vocab, a.seq_len, tmp/'ckpt')
    params = summary['params']
    print(f'\nmodel: dim {a.dim}, {a.num_layers} layers, {params:,} parameters; batch {a.batch_size} x {a.seq_len} tokens; '
          f'{a.steps} steps, median after {warm} warm-up steps, best of {a.rounds} rounds, on {device}\n')
    print('| measure | time | ratio |\n|---|---|---|')
    print(f'| bare loop step | {1000 * b:.1f} ms | 1.000 |')
    print(f'| trainer step | {1000 * t:.1f} ms | {t / b:.3f} ({100 * (t / b - 1):+.1f}% overhead; target <= 3%) |')
    print(f'| checkpoint save (model + AdamW + RNG) | {1000 * save:.1f} ms | {save / t:.2f} steps |')
    print(f'| save every 2000 steps | {1000 * save / 2000:.3f} ms per step | {100 * save / (2000 * t):.3f}% of step time |')
    if device.type == 'cuda':
        with tempfile.TemporaryDirectory() as tmp:
            print('\n| GPU run | throughput | MFU |\n|---|---|---|'); print('\n'.join(gpu_rows(Path(tmp), a.gpu_steps)))
    else: print('\nGPU rows (tokens/s and MFU of the small model at 3072 and 32768 tokens): not measured, no CUDA device here.')

if __name__ == '__main__': main()
