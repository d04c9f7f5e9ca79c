"""Data-parallel training under torchrun on the CPU (gloo), for every architecture: two processes give the same
losses and weights as one process with the same global batch, only rank 0 writes, and each rank reads its own rows."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from legalnb.data import StepSampler
from conftest import ARCHITECTURES, DIST_STEPS as STEPS
from legalnb.metrics import read_metrics
from legalnb.checkpoint import list_checkpoints, checkpoint_step

@pytest.fixture(scope='module', params=ARCHITECTURES)
def runs(request, dist_runs):
    "One process with 4 micro-batches per step, and two processes with 2 each: 8 sequences per step both."
    model = request.param
    (one, _), (two, proc) = dist_runs('one', model, 1, 4), dist_runs('two', model, 2, 2)
    return model, one, two, proc

def test_two_ranks_match_one_process_with_the_same_global_batch(runs):
    _, one_dir, two_dir, _ = runs
    one, two = read_metrics(one_dir/'metrics.jsonl'), read_metrics(two_dir/'metrics.jsonl')
    assert [r['step'] for r in one] == [r['step'] for r in two] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([r['loss'] for r in two], [r['loss'] for r in one], rtol=1e-5)
    np.testing.assert_allclose([r['grad_norm'] for r in two], [r['grad_norm'] for r in one], rtol=1e-4)
    v1, v2 = (read_metrics(d/'metrics.jsonl', 'eval') for d in (one_dir, two_dir))
    assert [r['step'] for r in v1] == [r['step'] for r in v2] == [3, 6]
    a = torch.load(one_dir/'checkpoints'/f'step-{STEPS:08d}'/'model.pt')
    b = torch.load(two_dir/'checkpoints'/f'step-{STEPS:08d}'/'model.pt')
    for k in a: torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
    assert one[-1]['loss'] < one[0]['loss'], 'it learns'

def test_rank_zero_alone_logs_and_writes(runs):
    model, _, two_dir, two = runs
    assert two.stdout.count('done: 6 steps') == 1 and two.stdout.count(f"train a 'small' {model} model") == 1
    assert '2 rank(s)' in two.stdout and 'on 2 x cpu' in two.stdout
    assert [checkpoint_step(p) for p in list_checkpoints(two_dir)] == [3, 6]
    lines = (two_dir/'metrics.jsonl').read_text().splitlines()
    assert len(lines) == len(set(lines)) == STEPS + 2 + 1, 'one line per step, per eval and the end: nothing twice'
    summary = json.loads((two_dir/'summary.json').read_text())
    assert summary['world_size'] == 2 and summary['tokens'] == STEPS * 8 * 16
    assert json.loads((two_dir/'model'/'config.json').read_text())['architecture'] == model

def test_ranks_read_disjoint_rows():
    # the trainer maps optimizer step s, micro-batch m to sampler step s * grad_accum + m (see train_loader)
    ranks = [StepSampler(72, 2, seed=11, rank=r, world_size=2) for r in range(2)]
    for s in range(STEPS):
        for m in range(2):
            rows = [set(r.batch(s * 2 + m)) for r in ranks]
            assert not rows[0] & rows[1]
