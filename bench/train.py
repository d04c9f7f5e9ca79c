"""Benchmark of the native trainer (legalnb.train), for every model it trains (ResonanceNet and the gpt baseline).

1. Trainer step time against a bare hand-written loop (forward, backward, clip, AdamW step) on the same model and
   the same batch shape, for each model of `--models` (built through the registry, legalnb.models): the trainer's
   own cost (data loader, schedule, accumulation bookkeeping, logging) as a ratio. Target: <= 1.03 for both.
   The rows are random ids without document boundaries, so the gpt baseline attends causally over the whole row
   in both loops (with doc_starts it would build its block-diagonal mask in both alike).
2. Checkpoint save time against step time: what one save costs, and its share of a run that saves every 2000 steps.
3. On a GPU: tokens/s and MFU of each model's 'small' size at 3072 and 32768 tokens per sequence.

How the step time is measured: on a CPU shared with other work, wall-clock time mostly measures the other work.
So on the CPU the benchmark runs torch on one thread and reads the process's CPU time (`time.process_time`), which
counts this process's work only; on a GPU it reads wall-clock time after a synchronize. Each side runs a short
and a long run from scratch, and the step time is the difference divided by the difference in steps, which
cancels every fixed cost (building the model, the final evaluation and checkpoint, start-up of the loader) and
leaves the steady-state step. The rounds alternate the two sides; the median round is reported.

    python bench/train.py [--steps 5 25] [--rounds 5] [--dim 128] [--seq-len 256] [--batch-size 8]
                          [--models resonance gpt]
"""
import json, statistics, sys, tempfile, time
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from common import header, markdown_table, run
from legalnb.core import LegalnbError
from legalnb.machine import cuda_capability, resolve_precision
from legalnb.models import get_model
from legalnb.metrics import read_metrics
from legalnb.train import TrainConfig, train, model_config, make_optimizer, autocast_for
from legalnb.checkpoint import save_checkpoint, rng_state

def random_split(folder: Path, rows: int, seq_len: int, vocab: int, seed: int = 0) -> Path:
    "A corpus of random token rows (speed does not depend on the ids), split by the data stage."
    from legalnb.data import split
    rng = np.random.default_rng(seed)
    corpus = folder.parent/f'{folder.name}-corpus'; corpus.mkdir(parents=True)
    np.save(corpus/'shard_00000.npy', rng.integers(0, vocab, (rows, seq_len + 1), dtype=np.uint16))
    (corpus/'manifest.json').write_text(json.dumps({'vocab_size': vocab}))
    split(corpus, folder, val_ratio=1/16, seed=0, by='rows')
    return folder

def clock(device: torch.device) -> float:
    "CPU time of this process on the CPU; wall-clock time after the queued GPU work on a GPU."
    if device.type == 'cuda': torch.cuda.synchronize(); return time.perf_counter()
    return time.process_time()

def bare_seconds(cfg: TrainConfig, vocab: int, seq_len: int, device: torch.device) -> float:
    "Seconds of `cfg.max_steps` steps of a hand-written loop: the same model, optimizer, precision and batch shape."
    torch.manual_seed(cfg.seed)
    model = get_model(cfg.model).build(model_config(cfg, vocab, seq_len)).to(device)
    opt = make_optimizer(model, cfg, device)
    prec = resolve_precision(cfg.precision, cuda_capability(device) if device.type == 'cuda' else None)
    x = torch.randint(0, vocab, (cfg.batch_size, seq_len), device=device); y = torch.roll(x, -1, 1)
    t = clock(device)
    for _ in range(cfg.max_steps):
        with autocast_for(prec, device): _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step(); opt.zero_grad(set_to_none=True)
    loss.item()
    return clock(device) - t

def trainer_seconds(cfg: TrainConfig, device: torch.device) -> tuple[float, dict]:
    "Seconds of `train(cfg)` from the call to the summary, and the summary."
    t = clock(device); summary = train(cfg)
    return clock(device) - t, summary

def per_step(run, short: int, long: int) -> float:
    "Steady-state seconds per step: (time of `long` steps - time of `short` steps) / (long - short)."
    return (run(long) - run(short)) / (long - short)

def save_seconds(cfg: TrainConfig, vocab: int, seq_len: int, out: Path, repeats: int = 3) -> float:
    "Median seconds of one full checkpoint save (model, AdamW state, RNG) of this model."
    model = get_model(cfg.model).build(model_config(cfg, vocab, seq_len))
    opt = make_optimizer(model, cfg, torch.device('cpu'))
    zeros = torch.zeros(1, seq_len, dtype=torch.long)
    model(zeros, zeros)[1].backward(); opt.step()
    times = []
    for i in range(repeats):
        state = dict(model=model.state_dict(), optimizer=opt.state_dict(), scaler={}, scheduler={}, rng=rng_state(),
                     data={'step': i}, step=i + 1, elapsed=0.0, config={}, model_config=model.config.to_dict())
        t = time.perf_counter(); save_checkpoint(out, state, keep=1); times.append(time.perf_counter() - t)
    return statistics.median(times)

def shape_for(model: str, dim: int, num_layers: int) -> dict:
    "The bench's tiny shape for `model`: width and depth, 16 resonances, heads of 64 channels (where it has those)."
    has = {f.name for f in fields(get_model(model).config_class)}
    shape = dict(dim=dim, num_layers=num_layers, num_frequencies=16, num_heads=max(1, dim // 64))
    return {k: v for k, v in shape.items() if k in has}

def gpu_rows(tmp: Path, steps: int, models: list[str]) -> list[list[str]]:
    "tokens/s and MFU of each model's 'small' size at 3072 and 32768 tokens per sequence, on this GPU."
    rows = []
    for (seq_len, batch), model in ((sb, m) for sb in ((3072, 8), (32768, 1)) for m in models):
        split = tmp/f'gpu{seq_len}'
        if not split.exists():
            random_split(split, rows=batch * (steps + 2) * 16 // 15 + 16, seq_len=seq_len, vocab=32768)
        cfg = TrainConfig(data=str(split), out=str(tmp/f'gpu-run{seq_len}-{model}'), model=model, size='small',
                          batch_size=batch, max_steps=steps,
                          warmup_steps=1, eval_every=0, eval_batches=1, save_every=10**6, log_every=5, num_workers=4,
                          progress=False, activation_checkpointing=seq_len > 8192)
        _, s = trainer_seconds(cfg, torch.device('cuda'))
        recs = read_metrics(Path(cfg.out)/'metrics.jsonl')[1:]  # the first interval pays for warm-up
        tps = statistics.median(r['tokens_per_sec'] for r in recs)
        mfu = statistics.median(r['mfu'] for r in recs) if recs[0]['mfu'] is not None else float('nan')
        rows.append([f'{model} small, {seq_len:,} tokens x {batch} ({s["precision"]})', f'{tps:,.0f} tok/s',
                     f'MFU {mfu:.1%}'])
    return rows

def measure(model: str, split: Path, tmp: Path, args: dict, device: torch.device) -> dict:
    "Median steady-state step of the bare loop and of the trainer for `model`, rounds alternating, and one save."
    short, long = args['steps']
    base = dict(data=str(split), model=model, model_overrides=shape_for(model, args['dim'], args['num_layers']),
                batch_size=args['batch_size'], warmup_steps=2, eval_every=0, eval_batches=1, save_every=10**6,
                num_workers=0 if device.type == 'cpu' else 4, progress=False, seed=0)
    bare, trainer, summary = [], [], {}
    for r in range(args['rounds']):  # alternate the two sides
        def bare_run(n): return bare_seconds(TrainConfig(**base, max_steps=n), args['vocab'], args['seq_len'], device)
        bare.append(per_step(bare_run, short, long))
        def trainer_run(n):
            cfg = TrainConfig(**base, max_steps=n, out=str(tmp/f'{model}-run{r}-{n}'))
            secs, summary['last'] = trainer_seconds(cfg, device)
            return secs
        trainer.append(per_step(trainer_run, short, long))
    save = save_seconds(TrainConfig(**base), args['vocab'], args['seq_len'], tmp/f'{model}-ckpt')
    return dict(model=model, bare=statistics.median(bare), trainer=statistics.median(trainer), save=save,
                rounds_bare=bare, rounds_trainer=trainer, params=summary['last']['params'],
                shape=base['model_overrides'])

def main(steps: list[int] = (5, 25),  # SHORT LONG: the two run lengths whose difference gives the step time
         rounds: int = 5,                # rounds of both sides (the median is reported)
         dim: int = 128,                 # model width
         num_layers: int = 2,            # blocks
         seq_len: int = 256,             # tokens per row
         batch_size: int = 8,            # rows per step
         vocab: int = 4096,              # vocabulary of the random token rows
         models: list[str] = ('resonance', 'gpt'),  # registered models to measure
         gpu_steps: int = 30):           # steps of each GPU throughput run
    "Trainer step time against a bare loop for each model, checkpoint cost, and on a GPU tokens/s and MFU."
    if len(steps) != 2 or not 0 < steps[0] < steps[1]:
        got = ' '.join(map(str, steps))
        raise LegalnbError(f'--steps takes two run lengths SHORT LONG with 0 < SHORT < LONG, got {got}')
    for m in models: get_model(m)   # an unknown name is refused before anything runs
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    if device.type == 'cpu': torch.set_num_threads(1)  # CPU time then counts work, not threads spinning for a core
    short, long = steps
    args = dict(steps=steps, rounds=rounds, dim=dim, num_layers=num_layers, seq_len=seq_len, batch_size=batch_size,
                vocab=vocab)
    header(__file__, 'numpy')
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        split = random_split(tmp/'split', rows=batch_size * (long + 4) * 16 // 15 + 16, seq_len=seq_len, vocab=vocab)
        found = [measure(m, split, tmp, args, device) for m in models]
    what = 'CPU time, 1 thread' if device.type == 'cpu' else 'wall-clock time'
    print(f'\nbatch {batch_size} x {seq_len} tokens; step = (time of {long} steps - time of {short}) / {long - short}, '
          f'{what}, median of {rounds} rounds on {device}\n')
    rows = []
    for f in found:
        shape = ', '.join(f'{k} {v}' for k, v in f['shape'].items())
        ratio = f['trainer'] / f['bare']
        rows.append([f"{f['model']} ({shape}; {f['params']:,} parameters)", f"{1000 * f['bare']:.1f} ms",
                     f"{1000 * f['trainer']:.1f} ms", f'{ratio:.3f} ({"within" if ratio <= 1.03 else "ABOVE"} 1.03)',
                     f"{1000 * f['save']:.1f} ms = {f['save'] / f['trainer']:.2f} steps",
                     f"{100 * f['save'] / (2000 * f['trainer']):.3f}%"])
    print(markdown_table(['model', 'bare loop step', 'trainer step', 'trainer / bare (target <= 1.03)',
                          'checkpoint save (wall clock)', 'saving every 2000 steps'], rows))
    def ms(xs): return ', '.join(f'{1000 * x:.1f}' for x in xs)
    for f in found:
        print(f"\nrounds (ms), {f['model']}: bare {ms(f['rounds_bare'])}; trainer {ms(f['rounds_trainer'])}")
    if device.type == 'cuda':
        with tempfile.TemporaryDirectory() as tmp:
            print('\n' + markdown_table(['GPU run', 'throughput', 'MFU'], gpu_rows(Path(tmp), gpu_steps, models)))
    else:
        print('\nGPU rows (tokens/s and MFU of the small size at 3072 and 32768 tokens): not measured, no CUDA device '
              'here.')

if __name__ == '__main__': sys.exit(run(main))
