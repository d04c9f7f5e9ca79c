"""Benchmark `legalnb evaluate`'s scoring: evaluation tokens/s against the model's own forward pass on the same
batches. One run prints one table. Target: evaluation at >= 0.8 of the forward pass (the bookkeeping under 25%).
Usage: python bench/evaluate.py [--docs 16] [--dim 256] [--context 512] [--device auto]

- forward: `model(x)` alone over the padded batches that `score_documents` builds, already on the device (the ceiling).
- forward + mean loss: `model(x, y)`, the forward pass with the training loss (one mean cross-entropy).
- evaluate: `score_documents` on the same documents, everything included: tokenizing each document, the rolling
  windows, the batches, the per-token cross-entropy and the sums per document and per position bucket.
Each is timed `--repeats` times, interleaved in a turning order, and the fastest run counts (the CPU is shared).
"""
import json, sys, tempfile, time
from pathlib import Path

import torch

from common import header, markdown_table, run
from legalnb.core import LegalnbError
from legalnb.corpus import train_tokenizer
from legalnb.evaluate import EvalModel, document_batches, score_documents
from legalnb.resonance import ResonanceLanguageModel
from legalnb.sources import parse_documents
from legalnb.sample import write_sample


def sample_documents(n: int) -> list[dict]:
    "`n` synthetic Formex publications, parsed into documents (the held-out file's records)."
    with tempfile.TemporaryDirectory() as tmp:
        write_sample(Path(tmp)/'sample', docs=n, seed=0)
        parse_documents([Path(tmp)/'sample'], Path(tmp)/'parsed.jsonl', progress=False)
        return [json.loads(l) for l in (Path(tmp)/'parsed.jsonl').read_text(encoding='utf-8').splitlines()]


def sync(device: torch.device):
    if device.type == 'cuda': torch.cuda.synchronize()


def measure(docs: int, vocab: int, dim: int, layers: int, context: int, batch_tokens: int, repeats: int,
            dev: torch.device, precision: str = 'fp32') -> dict:
    "Fastest seconds of the forward pass, the forward pass with the mean loss, and `score_documents`, on the same "
    "documents and batches; `precision` 'bf16' autocasts all three on a GPU (as `legalnb evaluate` does)."
    from legalnb.train import autocast_for
    records = sample_documents(docs)
    tok = train_tokenizer([r['text'] for r in records], vocab)
    torch.manual_seed(0)
    model = ResonanceLanguageModel.from_kwargs(vocab_size=vocab, dim=dim, num_layers=layers, num_frequencies=16,
                                               max_seq_len=context).to(dev).eval()
    lm = EvalModel(model, tok, context=context, eos_id=0, name='bench', precision=precision)
    tokens, batches = document_batches(lm, records, batch_tokens)
    batches = [(x.to(dev), y.to(dev)) for x, y, _ in batches]
    n = sum(tokens)

    def forward():
        with torch.no_grad(), autocast_for(precision, dev):
            for x, _ in batches: model(x)
    def forward_loss():
        with torch.no_grad(), autocast_for(precision, dev):
            for x, y in batches: model(x, y)
    def evaluate(): score_documents(lm, records, batch_tokens)

    best = {name: float('inf') for name in ('forward', 'forward + mean loss', 'evaluate')}
    forward(); evaluate()   # warm-up: allocator, kernels
    measures = list(zip(best, (forward, forward_loss, evaluate)))
    for r in range(repeats):   # the order turns each round, so that no measure always runs after the same one
        for name, fn in measures[r % 3:] + measures[:r % 3]:
            sync(dev); t0 = time.perf_counter(); fn(); sync(dev)
            best[name] = min(best[name], time.perf_counter() - t0)
    return dict(seconds=best, tokens=n, documents=len(records), batches=len(batches))


def main(docs: int = 16,              # sample publications to score
         vocab: int = 2048,           # BPE vocabulary (trained on the documents)
         dim: int = 256,              # model width
         layers: int = 2,             # ResonanceNet blocks
         context: int = 512,          # window length in tokens
         batch_tokens: int = 8192,    # tokens per forward pass
         repeats: int = 5,            # timed runs of each measure (the fastest counts)
         device: str = 'auto'):       # 'auto', 'cuda' or 'cpu'
    "Evaluation tokens/s against the model's own forward pass on the same batches."
    if min(docs, vocab, dim, layers, context, batch_tokens, repeats) < 1: raise LegalnbError('every size must be >= 1')
    dev = torch.device(('cuda' if torch.cuda.is_available() else 'cpu') if device == 'auto' else device)
    m = measure(docs, vocab, dim, layers, context, batch_tokens, repeats, dev)
    best, n = m['seconds'], m['tokens']
    header(__file__)
    print(f"# {m['documents']} documents, {n:,} tokens scored in {m['batches']} batches of <= {batch_tokens:,} tokens; "
          f'ResonanceLanguageModel dim {dim}, {layers} layers, vocab {vocab:,}, context {context}; device {dev}\n')
    rows = [[name, f'{secs * 1000:,.0f} ms', f'{n / secs:,.0f}', f'{best["forward"] / secs:.2f}']
            for name, secs in best.items()]
    print(markdown_table(['measure', 'time', 'tokens/s', 'vs forward'], rows))
    ratio = best['forward'] / best['evaluate']
    print(f'\nevaluation runs at {ratio:.2f} of the forward pass (target >= 0.80): '
          + ('met' if ratio >= 0.8 else 'missed'))
    return 0


if __name__ == '__main__':
    sys.exit(run(main))
