"""Quality at equal tokens and at equal time: every model against the GPT baseline on legal text, in bits per byte
on held-out acts, with bootstrap intervals over those acts.

The text: `--data sample` (the generated sample, `legalnb.sample.write_sample`), or any real legal text the user
has: a folder of Formex publications, a parsed JSONL (`legalnb parse` output) or a folder of them
(`legalnb.sources.read_documents` reads them all). Acts are held out whole: every language and consolidated version
of one act (its base CELEX) falls on the same side, chosen by a hash of the CELEX (`--held-out` of the acts, at least
one). Models read bytes (vocabulary 256, an EOS byte 0 after each document, `doc_starts` after every EOS: each model
resets or masks at them), so bits per byte are nats per byte / ln 2 and need no tokenizer.

For each length (`--lengths`, default 512, 2,048 and 8,192):
1. **Throughput**, measured for all models in this process, interleaved step by step (a shared CPU's load moves
   every model's time alike), the median of `--speed-steps` training steps each.
2. **Equal tokens**: each model trains on `--tokens` tokens (per length), AdamW, warm-up then cosine decay; a
   learning-rate sweep (`--lrs`) that grows by x2 past whichever end holds the best rate until the best is inside
   it; then the best rate again with each further seed (`--seeds`).
3. **Equal time**: each model trains for `--seconds` (per length; default: the time the first model, the baseline,
   needs for the token budget at its measured speed), i.e. seconds / its measured seconds per step; at the best rate
   of step 2, with every seed. The baseline's equal-time runs are its equal-token runs.
4. **Scores**: per held-out act the bits per byte of the model (averaged over seeds), windows of L bytes laid end to
   end over the act (at most `--eval-bytes` per act, evenly spread); the overall figure weights acts by their bytes.
   Intervals: 95% percentile bootstrap over acts (`--boot` resamples); the difference to the baseline is paired by
   act. With a single held-out act the interval is over blocks of `--block-bytes` of it instead (said in the table).

Every finished run is kept in `--out`/runs.json (atomic writes), so an interrupted table continues where it stopped;
the table is printed and written to `--out`/quality.md.

    python bench/quality.py --data ../shared/fixtures/formex   # the CPU table of the notebook: dim 64, 4 blocks, 300k
                                                               # tokens per run (~1-1.5 h for two models, 2 free cores)
    python bench/quality.py --data sample --lengths 512 --tokens 100k --seeds 1   # a quick look
    python bench/quality.py --data parsed.jsonl --device cuda --dim 768 --layers 12 \\
        --tokens 300M,300M,300M --lengths 512,2048,8192             # GPU budgets: tokens (and --seconds) per length
"""
from __future__ import annotations
import hashlib, json, math, tempfile, time
from pathlib import Path

import torch

from common import header, markdown_table, run
from recall import build, byte_rows, packed_bytes
from legalnb.core import LegalnbError, atomic_write, parse_number


# ---- data: acts held out whole ---------------------------------------------------------------------------------

def act_of(doc) -> str:
    "The act a document belongs to: its base CELEX (a consolidated version's is its act's), else the CELEX itself."
    from legalnb.sources import base_celex
    try: return base_celex(doc.celex) or doc.celex
    except LegalnbError: return doc.celex


def read_text(data: str, sample_docs: int = 120) -> list:
    "The documents of `data`: 'sample' (generated, `sample_docs` acts) or a folder / JSONL that read_documents reads."
    from legalnb.sources import read_documents
    from legalnb.sample import write_sample
    if data == 'sample':
        with tempfile.TemporaryDirectory() as d:
            write_sample(Path(d)/'sample', docs=sample_docs, seed=0)
            return list(read_documents(Path(d)/'sample'))
    if not Path(data).exists(): raise LegalnbError(f'--data {data}: no such file or folder; give a folder of Formex '
                                                   'publications, a parsed JSONL, or "sample"')
    return list(read_documents(Path(data)))


def split_acts(docs: list, held_out: float) -> tuple[list, dict]:
    "Training documents, and the held-out documents per act: a share `held_out` of the acts (at least one, and at "
    "least one left to train on), chosen by a hash of the act's CELEX, so that a split does not depend on the order."
    acts = sorted({act_of(d) for d in docs}, key=lambda a: hashlib.sha256(a.encode()).hexdigest())
    if len(acts) < 2: raise LegalnbError(f'--data: {len(acts)} act(s) found; need two, one to hold out whole')
    n = min(len(acts) - 1, max(1, round(held_out * len(acts))))
    out = set(acts[:n])
    train = sorted((d for d in docs if act_of(d) not in out), key=lambda d: (d.celex, d.lang))
    val = {a: sorted((d for d in docs if act_of(d) == a), key=lambda d: (d.celex, d.lang)) for a in sorted(out)}
    return train, val


def eval_windows(stream: torch.Tensor, L: int, max_bytes: int) -> list[int]:
    "Starts of windows of L bytes laid end to end over `stream`, evenly thinned to about `max_bytes` bytes."
    starts = list(range(0, max(1, len(stream) - 1 - L + 1), L)) or [0]
    keep = max(1, min(len(starts), max_bytes // L))
    if keep >= len(starts): return starts
    return [starts[round(i * (len(starts) - 1) / max(1, keep - 1))] for i in range(keep)]


# ---- training and scoring --------------------------------------------------------------------------------------

def lr_at(step: int, steps: int, lr: float) -> float:
    "Linear warm-up over the first 10% of the steps, then cosine decay to 10% of `lr` (as bench/recall.py)."
    warm = max(1, steps // 10)
    return lr * min(1, (step + 1) / warm) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(step, steps) / steps)))


def make_model(name: str, L: int, shape: dict, device: str):
    "A registered model (`name` or `name:field=value,...`) at the bench's width and depth, on `device`."
    return build(name, 256, L, shape['dim'], shape['layers'], shape['frequencies']).to(device)


def optimizer(model, name: str, lr: float):
    "AdamW with the registry's no-decay groups (norms, biases, filters), betas (0.9, 0.95), weight decay 0.1."
    from legalnb.models import get_model
    from recall import parse_model
    groups = get_model(parse_model(name)[0]).param_groups(model, 0.1)
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def train_step(model, opt, x, y, ds, device: str) -> torch.Tensor:
    "Forward (bf16 autocast on a GPU), backward, clip at 1, AdamW step."
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == 'cuda'):
        loss = model(x.to(device), y.to(device), doc_starts=ds.to(device))[1]
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    return loss


@torch.no_grad()
def act_nats(model, val: dict, L: int, max_bytes: int, device: str) -> dict:
    "Per held-out act: [nats, bytes] of the model's predictions over its evaluation windows."
    model.eval()
    out = {}
    for act, docs in val.items():
        stream = packed_bytes(docs)
        L_act = min(L, len(stream) - 1)
        for i, j in enumerate(eval_windows(stream, L_act, max_bytes)):
            x, y, ds = byte_rows(stream, [j], L_act)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == 'cuda'):
                logits = model(x.to(device), doc_starts=ds.to(device)).float()
            nats = torch.nn.functional.cross_entropy(logits[0], y[0].to(device), reduction='sum').item()
            # one held-out act: each window is its own unit, so that the bootstrap has something to resample
            key = act if len(val) > 1 else f'{act}#{i}'
            out[key] = [out.get(key, [0.0, 0])[0] + nats, out.get(key, [0.0, 0])[1] + y.numel()]
    model.train()
    return out


def train_run(name: str, L: int, lr: float, steps: int, batch: int, seed: int, train: torch.Tensor, val: dict,
              shape: dict, eval_bytes: int, device: str) -> dict:
    "Train one model for `steps` steps of `batch` random windows of the training bytes; score it on every act."
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)     # the same windows in the same order for every model
    model = make_model(name, L, shape, device).train()
    opt = optimizer(model, name, lr)
    t0, diverged = time.perf_counter(), False
    for s in range(steps):
        for group in opt.param_groups: group['lr'] = lr_at(s, steps, lr)
        x, y, ds = byte_rows(train, torch.randint(0, len(train) - L - 1, (batch,), generator=g).tolist(), L)
        loss = train_step(model, opt, x, y, ds, device)
        if (s + 1) % 25 == 0 and not math.isfinite(loss.item()): diverged = True; break
    seconds = time.perf_counter() - t0
    acts = {} if diverged else act_nats(model, val, L, eval_bytes, device)
    if any(not math.isfinite(v[0]) for v in acts.values()): diverged, acts = True, {}
    return dict(model=name, L=L, lr=lr, steps=steps, batch=batch, seed=seed, seconds=seconds, acts=acts,
                diverged=diverged, non_embedding=model.num_params(non_embedding=True))


def bpb(acts: dict) -> float:
    "Bits per byte over acts: their nats summed over their bytes, / ln 2 (inf for a diverged run)."
    if not acts: return math.inf
    return sum(v[0] for v in acts.values()) / sum(v[1] for v in acts.values()) / math.log(2)


def seconds_per_step(models: list[str], L: int, batch: int, train: torch.Tensor, shape: dict, device: str,
                     steps: int = 5) -> dict:
    "Seconds per training step of each model, measured in this process with the models' steps interleaved (one "
    "step of each in turn, so that a shared machine's load falls on all alike): the median after one warm-up step."
    built = {m: make_model(m, L, shape, device).train() for m in models}
    opts = {m: optimizer(built[m], m, 1e-4) for m in models}
    g, times = torch.Generator().manual_seed(0), {m: [] for m in models}
    sync = torch.cuda.synchronize if device == 'cuda' else (lambda: None)
    for i in range(steps + 1):
        x, y, ds = byte_rows(train, torch.randint(0, len(train) - L - 1, (batch,), generator=g).tolist(), L)
        for m in models:
            sync(); t0 = time.perf_counter()
            train_step(built[m], opts[m], x, y, ds, device); sync()
            if i: times[m].append(time.perf_counter() - t0)
    return {m: sorted(t)[len(t) // 2] for m, t in times.items()}


# ---- intervals -------------------------------------------------------------------------------------------------

def bootstrap(acts: dict, base: dict | None = None, n: int = 1000, seed: int = 0) -> tuple[float, float]:
    "95% percentile interval of bits per byte over resampled acts (of the difference to `base`, paired by act)."
    keys = sorted(acts)
    if not keys or (base is not None and not base): return (math.nan, math.nan)
    a = torch.tensor([acts[k] for k in keys], dtype=torch.float64)                  # (acts, 2): nats, bytes
    b = torch.tensor([base[k] for k in keys], dtype=torch.float64) if base else None
    idx = torch.randint(0, len(keys), (n, len(keys)), generator=torch.Generator().manual_seed(seed))
    stat = lambda t: t[idx, 0].sum(1) / t[idx, 1].sum(1) / math.log(2)
    s = stat(a) - (stat(b) if b is not None else 0)
    return float(s.quantile(0.025)), float(s.quantile(0.975))


def mean_acts(runs: list[dict]) -> dict:
    "Per act, the seeds' mean nats over the same bytes (an empty dict if any seed diverged)."
    if not runs or any(r['diverged'] for r in runs): return {}
    return {a: [sum(r['acts'][a][0] for r in runs) / len(runs), runs[0]['acts'][a][1]] for a in runs[0]['acts']}


# ---- the table -------------------------------------------------------------------------------------------------

def parse_list(text, kind=float) -> list:
    "'512,2048' or [512, 2048] -> a list; numbers may be written 600k or 3e5."
    items = text if isinstance(text, (list, tuple)) else str(text).split(',')
    return [kind(parse_number(str(v).strip())) for v in items if str(v).strip()]


def per_length(values: list, lengths: list[int], flag: str) -> dict:
    "One value for every length, or one per length."
    if len(values) == 1: values = values * len(lengths)
    if len(values) != len(lengths):
        raise LegalnbError(f'--{flag}: expected one value or one per length ({len(lengths)}), got {len(values)}')
    return dict(zip(lengths, values))


class Runs:
    "The finished runs, kept in `out`/runs.json: an interrupted table continues where it stopped."
    def __init__(self, out: Path, settings: dict):
        self.path, self.settings = out/'runs.json', settings
        saved = json.loads(self.path.read_text()) if self.path.is_file() else None
        if saved and saved['settings'] != settings:
            diff = [k for k in settings if saved['settings'].get(k) != settings[k]]
            raise LegalnbError(f'--out {out}: holds runs made with other settings ({", ".join(diff)}); '
                               'choose a new --out or the same flags')
        self.runs = saved['runs'] if saved else {}

    def get(self, key: str, make) -> dict:
        if key not in self.runs:
            self.runs[key] = make()
            with atomic_write(self.path) as tmp:
                tmp.write_text(json.dumps(dict(settings=self.settings, runs=self.runs)))
        return self.runs[key]


def sweep(runs: Runs, name: str, L: int, lrs: list[float], steps: int, batch: int, args: dict, log,
          max_extend: int = 4) -> tuple[float, list[dict]]:
    "The learning-rate sweep at seed 0, extended by x2 past an end that holds the best rate: (best lr, its runs)."
    lrs, done = sorted(lrs), {}
    for _ in range(max_extend + 1):
        for lr in lrs:
            if lr not in done: done[lr] = one(runs, name, L, lr, steps, batch, 0, args, log)
        best = min(done, key=lambda lr: bpb(done[lr]['acts']))
        if len(lrs) < 2 or lrs[0] < best < lrs[-1] or not math.isfinite(bpb(done[best]['acts'])): break
        lrs = [lrs[0] / 2] + lrs if best == lrs[0] else lrs + [lrs[-1] * 2]
    return best, [done[lr] for lr in sorted(done)]


def one(runs: Runs, name: str, L: int, lr: float, steps: int, batch: int, seed: int, args: dict, log) -> dict:
    "One run (from runs.json when it is there)."
    key = f'{name}|L={L}|lr={lr:.4g}|steps={steps}|batch={batch}|seed={seed}'
    def make():
        r = train_run(name, L, lr, steps, batch, seed, *args['data'], args['shape'], args['eval_bytes'],
                      args['device'])
        log(f'#   {name} L={L} lr {lr:.3g} seed {seed}: {steps} steps, {r["seconds"]:.0f} s, '
            f'{bpb(r["acts"]):.3f} bits per byte')
        return r
    return runs.get(key, make)


def row_cells(name: str, base: str, kind: str, L: int, runs: list[dict], base_runs: list[dict], speed: dict,
              boot: int) -> list:
    "One table row: length, budget, model, lr, steps, tokens/s, bpb [95% CI], its difference to the baseline."
    acts, bacts = mean_acts(runs), mean_acts(base_runs)
    lo, hi = bootstrap(acts, n=boot)
    seeds = ' / '.join(f"{bpb(r['acts']):.3f}" for r in runs)
    if name == base or not acts: diff = '-'
    else:
        dlo, dhi = bootstrap(acts, bacts, n=boot)
        diff = f'{bpb(acts) - bpb(bacts):+.3f} [{dlo:+.3f}, {dhi:+.3f}]'
    tokens = runs[0]['steps'] * runs[0]['batch'] * L
    return [f'{L:,}', kind, name, f"{runs[0]['lr']:.3g}", f"{runs[0]['steps']:,}", f'{tokens / 1e3:,.0f}k',
            f'{speed[name]:,.0f}', f'{bpb(acts):.3f} [{lo:.3f}, {hi:.3f}]' if acts else 'diverged',
            seeds, diff]


def main(data: str = 'sample',                  # 'sample' (generated), or a Formex folder / parsed JSONL / folder
         models: list[str] = ['gpt', 'resonance'],  # the first is the baseline; `name` or `name:field=value,...`
         lengths: list[int] = [512, 2048, 8192],    # row lengths in bytes
         tokens: str = '300k',                  # equal-token budget per run: one value, or one per length (600k,...)
         seconds: str = '',                     # equal-time budget per run, per length ('' : the baseline's time for
                                                # --tokens at its measured speed)
         step_tokens: str = '1024,2048,8192',   # tokens per optimizer step, per length (rows = this / length)
         lrs: list[float] = [1e-3, 2e-3, 4e-3],  # the starting sweep; extended x2 past an end that holds the best
         seeds: int = 2,                        # seeds (model init and data order); the sweep runs on the first
         dim: int = 64,                         # width of every model
         layers: int = 4,                       # blocks of every model
         frequencies: int = 16,                 # ResonanceNet's K
         held_out: float = 0.2,                 # share of the acts held out whole (at least one)
         sample_docs: int = 120,                # --data sample: acts generated
         eval_bytes: int = 65536,               # held-out bytes scored per act at most (evenly spread windows)
         speed_steps: int = 5,                  # interleaved steps per model for the throughput
         boot: int = 2000,                      # bootstrap resamples
         device: str = 'cpu',                   # cpu or cuda (bf16 autocast)
         threads: int = 1,                      # torch CPU threads
         out: str = 'quality'):                 # folder: runs.json (finished runs, to continue) and quality.md
    "Bits per byte on held-out acts at equal tokens and at equal time for each model against the first one."
    torch.set_num_threads(threads)
    if len(models) < 2: raise LegalnbError('--models: give the baseline first and at least one model to compare')
    if device == 'cuda' and not torch.cuda.is_available(): raise LegalnbError('--device cuda: no CUDA GPU is visible')
    budget = per_length(parse_list(tokens), lengths, 'tokens')
    time_budget = per_length(parse_list(seconds), lengths, 'seconds') if seconds else {}
    per_step = per_length(parse_list(step_tokens, int), lengths, 'step-tokens')
    docs = read_text(data, sample_docs)
    train_docs, val = split_acts(docs, held_out)
    train = packed_bytes(train_docs)
    if len(train) <= max(lengths) + 1:
        raise LegalnbError(f'--data {data}: {len(train):,} training bytes, too few for rows of {max(lengths):,}')
    shape = dict(dim=dim, layers=layers, frequencies=frequencies)
    out = Path(out); out.mkdir(parents=True, exist_ok=True)
    settings = dict(data=str(data), shape=shape, held_out=held_out, sample_docs=sample_docs, eval_bytes=eval_bytes,
                    device=device)
    runs = Runs(out, settings)
    args = dict(data=(train, val), shape=shape, eval_bytes=eval_bytes, device=device)
    lines = []
    def log(s): print(s, flush=True); lines.append(s)
    header(__file__)
    vbytes = {a: len(packed_bytes(d)) for a, d in val.items()}
    log(f'# data {data}: {len(train_docs)} documents to train on ({len(train):,} bytes), {len(val)} act(s) held out '
        f'whole ({sum(vbytes.values()):,} bytes, at most {eval_bytes:,} scored per act): {", ".join(list(val)[:6])}'
        + (' ...' if len(val) > 6 else ''))
    log(f'# dim {dim}, {layers} blocks, K {frequencies}, bytes (vocabulary 256); AdamW (0.9, 0.95), weight decay 0.1, '
        f'warm-up 10% then cosine to 10%; {seeds} seed(s); starting sweep {lrs}; device {device}, {threads} thread(s)')
    rows, base = [], models[0]
    for L in lengths:
        batch = max(1, per_step[L] // L)
        steps = max(1, int(budget[L] // (batch * L)))
        speed = runs.get(f'speed|{",".join(models)}|L={L}|batch={batch}',   # kept too: the steps of equal time
                         lambda: seconds_per_step(models, L, batch, train, shape, device, speed_steps))
        log(f'# L={L:,}: {batch} row(s) per step; seconds per step, interleaved: '
            + ', '.join(f'{m} {s:.3f}' for m, s in speed.items()))
        T = time_budget.get(L) or steps * speed[base]
        best, tok_runs, time_runs = {}, {}, {}
        for m in models:
            best[m], swept = sweep(runs, m, L, lrs, steps, batch, args, log)
            tok_runs[m] = [next(r for r in swept if r['lr'] == best[m])] + [
                one(runs, m, L, best[m], steps, batch, s, args, log) for s in range(1, seeds)]
            n = max(1, round(T / speed[m]))
            time_runs[m] = tok_runs[m] if n == steps else [one(runs, m, L, best[m], n, batch, s, args, log)
                                                           for s in range(seeds)]
            log(f'#   {m} L={L}: sweep ' + ', '.join(f"{r['lr']:.3g}: {bpb(r['acts']):.3f}" for r in swept)
                + f'; best {best[m]:.3g}')
        tps = {m: batch * L / s for m, s in speed.items()}
        for m in models:
            rows.append(row_cells(m, base, 'equal tokens', L, tok_runs[m], tok_runs[base], tps, boot))
        for m in models:
            rows.append(row_cells(m, base, f'equal time ({T:,.1f} s)', L, time_runs[m], time_runs[base], tps, boot))
    units = max((len(r['acts']) for r in runs.runs.values() if isinstance(r, dict) and r.get('acts')), default=0)
    unit = f'{units} held-out acts' if len(val) > 1 else f'{units} windows of the one held-out act'
    table = markdown_table(['L', 'budget', 'model', 'lr', 'steps', 'tokens', 'tok/s', 'bits per byte [95%]',
                            'seeds', f'- {base} [95%]'], rows)
    log(f'\n# non-embedding parameters: ' + ', '.join(
        f"{m} {next(r for r in runs.runs.values() if r.get('model') == m)['non_embedding']:,}" for m in models))
    log(f'# intervals: bootstrap over {unit} ({boot} resamples; they leave out the spread between seeds, shown per '
        'seed); the difference to the baseline paired by act')
    print(table)
    with atomic_write(out/'quality.md') as tmp: tmp.write_text('\n'.join(lines) + '\n\n' + table + '\n')
    return 0


if __name__ == '__main__':
    import sys
    sys.exit(run(main))
