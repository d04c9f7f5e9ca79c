"""Calibration: how well a few timed steps predict the rest of a run, against predicting from the first step alone.

A tiny ResonanceNet trains on random tokens on one CPU thread. `calibrate` times `--timed` steps after `--warmup`
untimed ones; the run then goes on for `--steps` more steps, and the table compares each prediction with the
measured time (CPU seconds of this process, so that neighbours on the machine do not count). The baseline is the
naive estimate: the first step's time (warm-up included) times the steps. Each of `--repeats` rounds is one row.

    python bench/calibration.py              # 5 rounds of 60 timed + 120 predicted steps, ~1 minute
    python bench/calibration.py --repeats 10
"""
from __future__ import annotations
import statistics, sys, time

import torch

from common import header, markdown_table, run
from legalnb.calculator import calibrate, compare
from legalnb.resonance import ResonanceConfig, ResonanceLanguageModel


def main(repeats: int = 5,   # rounds (one table row each)
         timed: int = 60,    # steps `calibrate` times
         warmup: int = 5,    # untimed steps before them
         steps: int = 120    # steps predicted, then run and measured
         ):
    "Print one row per round and the median error of each prediction."
    torch.set_num_threads(1); torch.manual_seed(0)
    model = ResonanceLanguageModel(ResonanceConfig(vocab_size=256, dim=48, num_layers=2, num_frequencies=8,
                                                   max_seq_len=64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (8, 65))
    def step():
        _, loss = model(ids[:, :-1], ids[:, 1:]); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    header(__file__)
    rows, cal_err, naive_err = [], [], []
    for r in range(repeats):
        t = time.process_time(); step(); first = time.process_time() - t
        cal = calibrate(step, n_steps=timed, warmup=warmup, clock=time.process_time)
        t = time.process_time()
        for _ in range(steps): step()
        measured = time.process_time() - t
        c, n = compare(cal.predict(steps), measured), compare(first * steps, measured)
        cal_err.append(abs(c.error)); naive_err.append(abs(n.error))
        rows.append([r + 1, f'{measured:.2f}', f'{cal.predict(steps):.2f}', f'{c.error:+.1%}', f'{first * steps:.2f}',
                     f'{n.error:+.1%}', f'{cal.spread:.1%}'])
    print(markdown_table(['round', 'measured s', 'calibrated s', 'error', 'first-step s', 'error', 'step spread'],
                         rows))
    mc, mn = statistics.median(cal_err), statistics.median(naive_err)
    print(f'\nmedian |error|: calibrated {mc:.1%}, first step {mn:.1%}; '
          f'ratio first-step / calibrated = {mn / max(mc, 1e-9):.1f}x')


if __name__ == '__main__': sys.exit(run(main))
