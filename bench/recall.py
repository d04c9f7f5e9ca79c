"""Recall by content: multi-query associative recall (MQAR) and single-key recall, for any registered model.

MQAR (Arora et al. 2023, "Zoology"): a row starts with `pairs` key-value pairs `k1 v1 k2 v2 ...` (keys drawn
without replacement from `keys` ids, values from `values` other ids), then filler (id 0); each key is asked once
again at a random position in the second half of the row, and the target at that position is its value.
Accuracy is measured on those value tokens only (chance: 1 / values). A model that mixes tokens with fixed
filters (a linear time-invariant convolution) cannot do it: which earlier token matters depends on the content.

Single-key recall: `legalnb.resonance.recall_task(key_pos=None)`: one of 8 keys anywhere in the first quarter
of the row, asked at the last position (chance 12.5%).

Held-out loss: the same models trained as byte-level language models on the generated sample
(`legalnb.sample.write_sample`, 60 documents, the last 8 held out whole), packed with an EOS byte after each
document and `doc_starts` after every EOS (each model resets or masks at them), on random windows of `--loss-lengths`
bytes; the loss is the mean over fixed held-out windows. `--loss-data FOLDER` does the same on real EUR-Lex text:
the acts of the Formex publications in FOLDER, the newest held out whole (`../shared/fixtures/formex`: trained on
Regulation (EC) No 1137/2008, scored on Regulation (EU) 2024/903).

Every model is built through the registry (`legalnb.models.get_model`) at the same width and depth (dim, layers,
and for ResonanceNet K resonances; the GPT with dim/32 heads), trained with AdamW on fresh rows for the same
number of steps at each learning rate of a small sweep, and scored on a fixed held-out batch; the best
learning rate counts. A model is named `name` or `name:field=value,field=value` (config overrides), e.g.
`resonance:attention_layers=[1]` for the hybrid with an attention mixer in block 1. `resonance` is today's default
(the recall branch in block 0); `resonance:recall_layers=[]` is the plain resonance mixer of earlier checkpoints.

    python bench/recall.py --models gpt resonance 'resonance:recall_layers=[]' --lengths 256 --pairs 8 \
        --no-single --lrs 1e-3 --steps 1000 --loss-lengths 0    # the MQAR row of the notebook's table

    python bench/recall.py                      # the CPU table: tiny models, see --help for the scale
    python bench/recall.py --steps 200 --lengths 256 --pairs 8   # a quicker look
"""
from __future__ import annotations
import ast, math, sys, time
from dataclasses import fields

import torch

from common import header, markdown_table, run
from legalnb.core import LegalnbError
from legalnb.models import get_model
from legalnb.resonance import recall_task


def mqar_batch(batch: int, seq_len: int, pairs: int, keys: int = 64, values: int = 64,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    "MQAR rows: ids 1..keys are keys, keys+1..keys+values values, 0 filler; targets -100 except the queried values."
    if 4 * pairs > seq_len or pairs > keys:
        raise LegalnbError(f'mqar: {pairs} pairs need seq_len >= {4 * pairs} and keys >= {pairs}, '
                           f'got seq_len={seq_len}, keys={keys}')
    g, rows = generator, torch.arange(batch)[:, None]
    k = torch.rand(batch, keys, generator=g).argsort(1)[:, :pairs] + 1                # (B, P) distinct keys
    v = torch.randint(keys + 1, keys + values + 1, (batch, pairs), generator=g)       # (B, P) their values
    x = torch.zeros(batch, seq_len, dtype=torch.long)
    x[:, 0:2 * pairs:2], x[:, 1:2 * pairs:2] = k, v
    half = seq_len // 2                                 # queries in the second half, at distinct positions
    q = torch.rand(batch, seq_len - half - 1, generator=g).argsort(1)[:, :pairs] + half
    x[rows, q] = k
    y = torch.full_like(x, -100); y[rows, q] = v         # the target at a query is the next token: its value
    return x, y


def single_key_batch(batch: int, seq_len: int, generator: torch.Generator | None = None):
    "One of 8 keys anywhere in the first quarter, asked at the last position (recall_task)."
    return recall_task(batch, seq_len, key_pos=None, generator=generator)


def parse_model(name: str) -> tuple[str, dict]:
    "'resonance:attention_layers=[1],attention_window=64' -> ('resonance', {...})."
    arch, _, rest = name.partition(':')
    over = {}
    for item in filter(None, _split(rest)):
        key, eq, value = item.partition('=')
        if not eq: raise LegalnbError(f'--models {name!r}: expected field=value after the colon, got {item!r}')
        try: over[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError): over[key.strip()] = value.strip()
    return arch, over


def _split(s: str) -> list[str]:
    "Split on commas outside brackets."
    out, depth, cur = [], 0, ''
    for ch in s:
        depth += (ch in '[(') - (ch in '])')
        if ch == ',' and depth == 0: out.append(cur); cur = ''
        else: cur += ch
    return out + [cur]


def build(name: str, vocab: int, seq_len: int, dim: int, layers: int, frequencies: int):
    "A registered model at this width and depth, with the overrides its name carries."
    arch, over = parse_model(name)
    spec = get_model(arch)
    has = {f.name for f in fields(spec.config_class)}
    shape = dict(dim=dim, num_layers=layers, num_frequencies=frequencies, num_heads=max(1, dim // 32))
    cfg = spec.config('small', vocab, seq_len, **{k: v for k, v in shape.items() if k in has}, **over)
    return spec.build(cfg)


def train_and_score(name: str, task: str, seq_len: int, pairs: int, lr: float, steps: int, batch: int,
                    dim: int, layers: int, frequencies: int, eval_rows: int = 256, seed: int = 0,
                    device: str = 'cpu') -> dict:
    "Train one model on fresh rows of one task for `steps` steps; accuracy on the held-out rows' answer tokens."
    torch.manual_seed(seed)
    dev = torch.device(device)   # rows are drawn on the CPU (the same rows on every device), then moved
    g, gv = torch.Generator().manual_seed(seed + 1), torch.Generator().manual_seed(10_000 + seed)
    if task == 'mqar': rows, vocab = (lambda n, gen: mqar_batch(n, seq_len, pairs, generator=gen)), 129
    else: rows, vocab = (lambda n, gen: single_key_batch(n, seq_len, generator=gen)), 32
    model = build(name, vocab, seq_len, dim, layers, frequencies).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.98))
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(      # linear warm-up, cosine decay to 10%
        opt, lambda s: min(1, (s + 1) / warm) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    t0 = time.perf_counter()
    for _ in range(steps):
        x, y = (t.to(dev) for t in rows(batch, g))
        loss = model(x, y)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); opt.zero_grad(set_to_none=True); sched.step()
    model.eval()
    x, y = (t.to(dev) for t in rows(eval_rows, gv))
    with torch.no_grad(): pred = model(x).argmax(-1)
    asked = y != -100
    acc = (pred[asked] == y[asked]).float().mean().item()
    return dict(model=name, acc=acc, lr=lr, loss=float(loss.detach()), seconds=time.perf_counter() - t0,
                non_embedding=model.num_params(non_embedding=True))


def sample_bytes(docs: int = 60, held_out: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    "The generated sample as packed bytes (EOS = 0 after each document): training documents, held-out documents."
    import tempfile
    from pathlib import Path
    from legalnb.sources import read_documents
    from legalnb.sample import write_sample
    with tempfile.TemporaryDirectory() as d:
        write_sample(Path(d)/'sample', docs=docs, seed=0)
        ds = sorted(read_documents(Path(d)/'sample'), key=lambda doc: (doc.celex, doc.lang))
    return packed_bytes(ds[:-held_out]), packed_bytes(ds[-held_out:])


def packed_bytes(docs) -> torch.Tensor:
    "The documents' UTF-8 bytes, each followed by an EOS byte (0)."
    return torch.tensor([b for doc in docs for b in [*doc.text.encode('utf-8'), 0]])


def formex_bytes(folder: str) -> tuple[torch.Tensor, torch.Tensor]:
    "Real EUR-Lex text: the acts of the Formex publications under `folder` as packed bytes, the newest act held out "
    "whole, the others to train on."
    from pathlib import Path
    from legalnb.sources import read_documents
    ds = sorted(read_documents(Path(folder)), key=lambda doc: doc.celex)
    if len(ds) < 2: raise LegalnbError(f'--loss-data {folder}: {len(ds)} act(s) found; need two, one to hold out')
    print(f'# held-out loss on {folder}: trained on {", ".join(d.celex for d in ds[:-1])} '
          f'({sum(len(d.text.encode()) for d in ds[:-1]):,} bytes), held out {ds[-1].celex} '
          f'({len(ds[-1].text.encode()):,} bytes)')
    return packed_bytes(ds[:-1]), packed_bytes(ds[-1:])


def byte_rows(src: torch.Tensor, starts, L: int):
    "(input, target, doc_starts) windows of L bytes at `starts`; a document starts after every EOS."
    w = torch.stack([src[j:j + L + 1] for j in starts]); x, y = w[:, :-1], w[:, 1:]
    ds = torch.zeros_like(x, dtype=torch.bool); ds[:, 0] = True; ds[:, 1:] = x[:, :-1] == 0
    return x, y, ds


def sample_loss(name: str, seq_len: int, lr: float, steps: int, batch: int, dim: int, layers: int,
                frequencies: int, data: tuple, seed: int = 0) -> dict:
    "Train one model on the sample's packed bytes; its mean loss on 32 fixed held-out windows (nats per byte)."
    train, val = data
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    model = build(name, 256, seq_len, dim, layers, frequencies).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.98))
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1, (s + 1) / warm) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    t0 = time.perf_counter()
    for _ in range(steps):
        x, y, ds = byte_rows(train, torch.randint(0, len(train) - seq_len - 1, (batch,), generator=g).tolist(), seq_len)
        model(x, y, doc_starts=ds)[1].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); opt.zero_grad(set_to_none=True); sched.step()
    model.eval()
    starts = torch.linspace(0, len(val) - seq_len - 1, 32).long().tolist()
    x, y, ds = byte_rows(val, starts, seq_len)
    with torch.no_grad(): loss = sum(model(x[i:i + 8], y[i:i + 8], doc_starts=ds[i:i + 8])[1].item()
                                     for i in range(0, 32, 8)) / 4
    return dict(model=name, loss=loss, lr=lr, seconds=time.perf_counter() - t0)


def loss_table(results: dict, models: list[str]) -> str:
    "Held-out loss per model (best learning rate in brackets) and the difference to the gpt baseline."
    base = 'gpt' if 'gpt' in models else None
    cols = ['L'] + models + ([f'{m} - gpt' for m in models if m != base] if base else [])
    lines = []
    for L, per in results.items():
        row = [f'{L:,}'] + [f"{per[m]['loss']:.3f} ({per[m]['lr']:g})" for m in models]
        if base: row += [f"{per[m]['loss'] - per[base]['loss']:+.3f}" for m in models if m != base]
        lines.append(row)
    return markdown_table(cols, lines)


def tasks(lengths: list[int], pairs: list[int], single: bool) -> list[tuple[str, int, int]]:
    "(task, seq_len, pairs) for each row of the table."
    lengths = [L for L in lengths if L > 0]          # 0: no recall tasks (only the held-out loss)
    out = [('mqar', L, p) for L in lengths for p in pairs if 4 * p <= L]
    return out + ([('single', L, 1) for L in lengths[:1]] if single else [])


def table(results: dict, models: list[str]) -> str:
    "Accuracy per model (best learning rate in brackets) and the ratio to the gpt baseline, one row per task."
    base = next((m for m in models if m == 'gpt'), None)
    cols = ['task', 'L', 'pairs', 'chance'] + models + ([f'{m} / gpt' for m in models if m != base] if base else [])
    lines = []
    for (task, L, p), per in results.items():
        chance = 1 / 64 if task == 'mqar' else 1 / 8
        row = [task, f'{L:,}', p, f'{chance:.1%}'] + [f"{per[m]['acc']:.1%} ({per[m]['lr']:g})" for m in models]
        if base:
            b = per[base]['acc']
            row += [f"{per[m]['acc'] / b:.2f}" if b > 0 else '-' for m in models if m != base]
        lines.append(row)
    return markdown_table(cols, lines, 'lrrr' + 'r' * (len(cols) - 4))


def main(models: list[str] = ['gpt', 'resonance'],  # registered models, each `name` or `name:field=value,...`
         lengths: list[int] = [256, 1024],  # row lengths in tokens
         pairs: list[int] = [8, 16, 32],    # MQAR key-value pairs per row
         single: bool = True,               # also the single-key task (at the first length)
         lrs: list[float] = [1e-3, 3e-3],   # the learning-rate sweep; the best counts
         steps: int = 300,                  # optimizer steps per run
         batch: int = 16,                   # rows per step
         dim: int = 64,                     # width of every model
         layers: int = 2,                   # depth of every model
         frequencies: int = 16,             # ResonanceNet's K
         loss_lengths: list[int] = [512],   # held-out loss on the sample at these row lengths (0: skip)
         loss_steps: int = 300,             # optimizer steps per held-out-loss run
         loss_data: str = 'sample',         # 'sample' (generated) or a folder of Formex publications (real acts)
         threads: int = 1,                  # torch CPU threads
         device: str = 'cpu'):              # where the recall models train: cpu or cuda (the held-out loss: the CPU)
    "Train each model on each task at each learning rate; print the accuracy table."
    torch.set_num_threads(threads)
    header(__file__)
    print(f'# dim {dim}, {layers} layers, {steps} steps of {batch} rows, AdamW lr in {lrs} (best kept), '
          f'MQAR keys 64 / values 64')
    results = {}
    for task, L, p in tasks(lengths, pairs, single):
        per = {}
        for m in models:
            runs = [train_and_score(m, task, L, p, lr, steps, batch, dim, layers, frequencies, device=device)
                    for lr in lrs]
            per[m] = max(runs, key=lambda r: r['acc'])
            print(f"#   {task} L={L} pairs={p} {m}: {per[m]['acc']:.1%} at lr {per[m]['lr']:g} "
                  f"({per[m]['non_embedding']:,} non-embedding parameters, {sum(r['seconds'] for r in runs):.0f} s)",
                  flush=True)
        results[(task, L, p)] = per
    if results: print(table(results, models))
    losses, data = {}, None
    for L in [L for L in loss_lengths if L > 0]:
        data = data or (sample_bytes() if loss_data == 'sample' else formex_bytes(loss_data))
        per = {}
        for m in models:
            runs = [sample_loss(m, L, lr, loss_steps, batch, dim, layers, frequencies, data) for lr in lrs]
            per[m] = min(runs, key=lambda r: r['loss'])
            print(f"#   sample loss L={L} {m}: {per[m]['loss']:.3f} at lr {per[m]['lr']:g} "
                  f"({sum(r['seconds'] for r in runs):.0f} s)", flush=True)
        losses[L] = per
    if losses:
        print(f'# held-out loss on {"the generated sample" if loss_data == "sample" else loss_data} (nats per byte, '
              f'{loss_steps} steps of {batch} rows)')
        print(loss_table(losses, models))


if __name__ == '__main__': sys.exit(run(main))
