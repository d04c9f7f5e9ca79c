"""Training schedules at equal tokens: constant batch, progressive batch (`--batch-schedule`) and two-stage training
(`--init-from`, the second stage on the best-scored documents only), on the generated sample corpus.

The time-reduction guide legalnb replaces says progressive batch scaling gives "the best of both worlds" and that
two-stage training is "often better than single-stage". This measures both against a constant batch, every run
feeding the same number of training tokens (the same micro-batches, grouped into steps differently):

- constant: accumulation `accum` for the whole run, learning rate `lr`; and a constant accum/2 (twice the steps,
  the learning rate by the square-root rule), to tell a schedule's gain from that of small batches alone;
- progressive: accumulation 2·accum, then accum, then accum/2, a third of the micro-batches each; the learning rate
  follows the square-root rule (`--batch-lr-rule sqrt`, the default), so it is `lr` at the constant run's batch;
- two-stage: stage 1 at accumulation 2·accum on all the data for two thirds of the micro-batches, then stage 2 from
  its final weights (a fresh AdamW) at accumulation accum/2 on the best documents (`legalnb select` with a token
  target a third of the corpus, held-out acts excluded, the stage-1 tokenizer), for the last third.

Every run is scored on the same held-out acts (the corpus's val split, whole acts): the mean loss over all of its
rows. Wall-clock is the time of `train()` (setup, steps, evaluations, checkpoints), on a CPU shared with other work:
read it as a rough figure.

    python bench/schedules.py [--docs 200] [--seq-len 64] [--micro 1200] [--accum 4] [--model gpt] [--seeds 0 1]
"""
import json, math, shutil, statistics, sys, tempfile, time
from pathlib import Path

import torch

from common import header, markdown_table, run
from legalnb.corpus import CorpusConfig, build_corpus
from legalnb.data import split
from legalnb.models import load_model
from legalnb.scoring import SelectConfig, select_documents
from legalnb.sources import parse_documents
from legalnb.sample import write_sample
from legalnb.train import TrainConfig, evaluate_loss, open_split, setup_distributed, train, val_loader


def corpora(root: Path, docs: int, seq_len: int, vocab: int) -> tuple[Path, Path, dict]:
    "The full split (val: whole held-out acts) and the stage-2 split of the best third, with their manifests."
    write_sample(root/'sample', docs=docs, seed=0)
    parse_documents([root/'sample'], root/'parsed.jsonl', progress=False)
    select_documents(SelectConfig(root/'parsed.jsonl', root/'all.jsonl', 10**12, num_proc=1))
    full = build_corpus(CorpusConfig(root/'all.jsonl', root/'corpus', seq_len=seq_len, shards=2, train_tokenizer=vocab, val_docs=0.1,
                        progress=False))
    split(root/'corpus', root/'split', seed=0, by='documents')
    held = set(full['heldout_celex'])
    lines = [l for l in (root/'parsed.jsonl').read_text().splitlines() if json.loads(l)['celex'] not in held]
    (root/'parsed-train.jsonl').write_text('\n'.join(lines) + '\n')
    chars = sum(len(json.loads(l)['text']) for l in lines)
    report = select_documents(SelectConfig(root/'parsed-train.jsonl', root/'best.jsonl', chars // 4 // 3, num_proc=1))  # a third, by score
    best = build_corpus(CorpusConfig(root/'best.jsonl', root/'best', seq_len=seq_len, shards=1,
                        tokenizer=root/'corpus'/'tokenizer.json', progress=False))
    split(root/'best', root/'best-split', val_ratio=0.02, seed=0, by='rows')
    return root/'split', root/'best-split', dict(full=full, best=best, selection=report)


def heldout_loss(model_dir: Path, data: Path, cfg: TrainConfig) -> float:
    "Mean loss of the saved model over every row of the held-out split."
    model = load_model(model_dir).eval()
    val = open_split(data)[1]
    n = math.ceil(len(val) / cfg.batch_size)
    every = TrainConfig(**{**cfg.__dict__, 'eval_batches': n})
    return evaluate_loss(model, val_loader(val, every, setup_distributed('cpu')), setup_distributed('cpu'), 'fp32', n)


def timed(cfg: TrainConfig) -> tuple[dict, float]:
    "train(cfg) and its wall-clock seconds."
    t = time.perf_counter(); s = train(cfg); return s, time.perf_counter() - t


def main(docs: int = 200,           # sample publications (legalnb sample)
         seq_len: int = 64,         # tokens per row
         vocab: int = 512,          # the BPE trained on the sample
         micro: int = 1200,         # micro-batches per run (equal tokens: micro x batch_size x seq_len)
         batch_size: int = 8,       # rows per micro-batch
         accum: int = 4,            # the constant run's accumulation (progressive: 2x, 1x, 1/2x of it)
         lr: float = 1e-3,          # the constant run's learning rate (the others: by the square-root rule)
         model: str = 'gpt',        # a registered model: gpt or resonance
         dim: int = 64,             # model width
         layers: int = 2,           # model depth
         seeds: list[int] = [0],    # one row per schedule and seed
         keep: str = None):         # keep the work folder here (default: a temporary folder, deleted)
    "Constant vs progressive batch vs two-stage training at equal tokens: held-out loss and wall-clock."
    torch.set_num_threads(1)
    header(__file__)
    root = Path(keep) if keep else Path(tempfile.mkdtemp())
    data, best, info = corpora(root, docs, seq_len, vocab)
    third, big, small = micro // 3, 2 * accum, max(1, accum // 2)
    print(f'# corpus: {info["full"]["rows"]:,} rows of {seq_len} tokens, {info["full"]["heldout"]["acts"]} acts held '
          f'out ({info["full"]["heldout"]["rows"]:,} rows); stage 2: {info["best"]["rows"]:,} rows of the best-scored '
          f'documents; every run {micro:,} micro-batches = {micro * batch_size * seq_len:,} tokens, '
          f'{model} dim {dim} x {layers} layers')
    base = dict(data=str(data), model=model, dim=dim, num_layers=layers, batch_size=batch_size, warmup_steps=10,
                eval_every=0, eval_batches=4, save_every=10**6, log_every=10, num_workers=0, device='cpu',
                cpu_threads=1, progress=False, precision='fp32')
    if model == 'gpt': base['model_overrides'] = {'num_heads': 4}
    rows = []
    for seed in seeds:
        out = lambda name: str(root/f'{name}-{seed}')
        runs = {}
        cfg = TrainConfig(**base, seed=seed, out=out('constant'), lr=lr, grad_accum=accum, max_steps=micro // accum)
        s, t = timed(cfg); runs[f'constant batch, accumulation {accum}'] = (cfg, s['tokens'], t, Path(cfg.out)/'model')
        cfg = TrainConfig(**base, seed=seed, out=out('constant-small'), lr=lr / math.sqrt(accum / small),
                          grad_accum=small, max_steps=micro // small)
        s, t = timed(cfg); runs[f'constant batch, accumulation {small}'] = (cfg, s['tokens'], t, Path(cfg.out)/'model')
        a, b = third // big, third // accum
        sched = f'0:{big},{a}:{accum},{a + b}:{small}'
        cfg = TrainConfig(**base, seed=seed, out=out('progressive'), lr=lr * math.sqrt(2), batch_schedule=sched,
                          max_steps=a + b + (micro - a * big - b * accum) // small)
        s, t = timed(cfg); runs[f'progressive {sched}'] = (cfg, s['tokens'], t, Path(cfg.out)/'model')
        c1 = TrainConfig(**base, seed=seed, out=out('stage1'), lr=lr * math.sqrt(2), grad_accum=big,
                         max_steps=2 * third // big)
        s1, t1 = timed(c1)
        c2 = TrainConfig(**{**base, 'data': str(best)}, seed=seed, out=out('stage2'), lr=lr / math.sqrt(2),
                         grad_accum=small, max_steps=(micro - c1.max_steps * big) // small,
                         init_from=str(Path(c1.out)/'model'))
        s2, t2 = timed(c2)
        runs[f'two-stage {big} then {small} on the best third'] = (c2, s1['tokens'] + s2['tokens'], t1 + t2,
                                                                     Path(c2.out)/'model')
        stage1 = heldout_loss(Path(c1.out)/'model', data, c1)
        for name, (cfg, tokens, secs, model_dir) in runs.items():
            rows.append([name, seed, f'{tokens:,}', f'{heldout_loss(model_dir, data, cfg):.4f}', f'{secs:.1f}'])
        rows.append([f'(two-stage: after stage 1 only)', seed, f'{s1["tokens"]:,}', f'{stage1:.4f}', f'{t1:.1f}'])
    print(markdown_table(['schedule', 'seed', 'tokens', 'held-out loss', 'wall-clock s'], rows, 'lrrrr'))
    if len(seeds) > 1:
        by = {}
        for r in rows: by.setdefault(r[0], []).append(float(r[3]))
        print('\nmean held-out loss over seeds: ' + '; '.join(f'{k}: {statistics.mean(v):.4f}' for k, v in by.items()))
    if not keep: shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__': sys.exit(run(main))
