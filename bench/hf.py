"""Useful (non-padding) tokens/s of SFT with packing against the default padded collator at max_length 2048, and
the share of weight entries a few AdamW steps change from a bf16 checkpoint, with and without fp32 master weights.

A generated long-tailed set (most examples short, a few near 1500 tokens) trains a tiny Llama-style model for a few
optimizer steps with each layout; the table shows the tokens that carry a label per second and the ratio.
GPU rows (a small Llama-shaped model in bf16) when CUDA is present, else "not measured".
The second table trains a Llama-shaped model (width 256, 4 layers) stored in bf16 for a few AdamW steps at lr 3e-5
on random ids, once with its bf16 weights as they are and once from an fp32 copy (what `finetune` does for full
fine-tuning), and counts the weight-matrix entries that did not change.
Run: python bench/hf.py [--steps N]"""
import sys, time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DataCollatorForSeq2Seq

from common import header, markdown_table, run
from legalnb.hf import pack_examples, PackedCollator, tiny_config, train_tiny_tokenizer


def long_tailed_examples(n: int, vocab: int, seed: int = 0) -> list[dict]:
    "n examples of random ids: lengths log-normal around 150 tokens, every 16th near 1500; prompt half masked."
    rng = np.random.default_rng(seed)
    lens = np.clip(rng.lognormal(np.log(150), 0.6, n), 16, 1200).astype(int)
    lens[::16] = rng.integers(1400, 1500, len(lens[::16]))
    out = []
    for L in lens:
        ids = rng.integers(3, vocab, L).tolist()
        out.append({'input_ids': ids, 'labels': [-100] * (L // 2) + ids[L // 2:]})
    return out


def train_steps(model, batches, device, dtype) -> tuple[float, int]:
    "Seconds and useful (non-padding) tokens of training on `batches` (the first batch is warm-up)."
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    useful, t0 = 0, None
    for i, b in enumerate(batches):
        if i == 1:
            if device == 'cuda': torch.cuda.synchronize()
            t0 = time.perf_counter()
        b = {k: v.to(device) for k, v in b.items()}
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(**b, use_cache=False).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        if i >= 1: useful += int((b['input_ids'] != 0).sum())   # real tokens (ids start at 3; 0 is padding)
    if device == 'cuda': torch.cuda.synchronize()
    return time.perf_counter() - t0, useful


def measure(device: str, hidden: int, layers: int, steps: int, micro: int, dtype) -> dict:
    "Useful tokens/s of the padded collator (max_length 2048) and of packed rows, on the same examples."
    cfg = tiny_config('llama', 512, hidden=hidden, layers=layers)
    if device == 'cuda': cfg.num_attention_heads, cfg.num_key_value_heads = hidden // 64, hidden // 64
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(device)
    examples = long_tailed_examples(micro * (steps + 1) * 12, 512)
    tok = train_tiny_tokenizer(['a b c'] * 10)   # only its pad id (0) is used
    padded = DataCollatorForSeq2Seq(tok, padding='max_length', max_length=2048, label_pad_token_id=-100)
    pad_batches = [padded([{**e} for e in examples[i * micro:(i + 1) * micro]]) for i in range(steps + 1)]
    rows = pack_examples(examples, 2048)
    packer = PackedCollator(0, flatten=False)
    pack_batches = [packer(rows[i * micro:(i + 1) * micro]) for i in range(min(steps + 1, len(rows) // micro))]
    res = {}
    for name, batches in (('padded to 2048', pad_batches), ('packed (padding-free)', pack_batches)):
        secs, useful = train_steps(model, batches, device, dtype)
        computed = sum(b['input_ids'].numel() for b in batches[1:])
        res[name] = (useful / secs, useful / computed, len(batches) - 1)
    return res


def unchanged_share(master: torch.dtype, steps: int = 5, lr: float = 3e-5) -> float:
    "Share of weight-matrix entries unchanged after `steps` AdamW steps from a bf16 checkpoint trained in `master`."
    cfg = tiny_config('llama', 512, hidden=256, layers=4)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).to(master)   # a bf16 checkpoint, loaded as `master`
    before = {n: p.detach().to(torch.bfloat16).clone() for n, p in model.named_parameters() if p.ndim == 2}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(3, 512, (4, 128), generator=g)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    same = sum((p.detach().float() != before[n].float()).logical_not().sum().item()
               for n, p in model.named_parameters() if n in before)
    return same / sum(v.numel() for v in before.values())


def main(steps: int = 4):  # timed optimizer steps per layout (after one warm-up); 4x as many on a GPU
    "Useful (non-padding) tokens/s of SFT with packing against the padded collator at max_length 2048."
    header(__file__, 'transformers')
    setups = [('cpu', 64, 2, 2, torch.float32, 'tiny llama 64x2, fp32')]
    if torch.cuda.is_available(): setups.append(('cuda', 1024, 8, 8, torch.bfloat16, 'llama 1024x8 (~0.1B), bf16'))
    rows = []
    for device, hidden, layers, micro, dtype, label in setups:
        res = measure(device, hidden, layers, steps if device == 'cpu' else 4 * steps, micro, dtype)
        base = res['padded to 2048'][0]
        for name, (tps, share, n) in res.items():
            rows.append([device, label, name, f'{tps:,.0f}', f'{share:.0%}', n, f'{tps / base:.1f}x'])
    if not torch.cuda.is_available():
        rows.append(['cuda', 'llama 1024x8, bf16', '-', 'not measured (no GPU here)', None, None, None])
    columns = ['device', 'model', 'layout', 'useful tokens/s', 'useful share of computed tokens', 'steps', 'ratio']
    print(markdown_table(columns, rows, 'lllrrrr'))
    print()
    rows = [[name, f'{unchanged_share(dtype):.1%}'] for name, dtype in
            (('bf16 weights trained in bf16', torch.bfloat16), ('fp32 master weights, bf16 autocast', torch.float32))]
    print(markdown_table(['5 AdamW steps at lr 3e-5 from a bf16 checkpoint', 'weight entries unchanged'], rows))


if __name__ == '__main__': sys.exit(run(main))
