"""Data-parallel training under torchrun on the CPU (gloo): two processes give the same losses and weights as one
process with the same global batch, only rank 0 writes, and each rank reads its own rows."""
import json, os, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch

from legalnb.data import StepSampler
from conftest import ENV, make_split
from legalnb.train import read_metrics, list_checkpoints, checkpoint_step

STEPS = 6

def args(split_dir: Path, out: Path, grad_accum: int) -> list[str]:
    return ['train', '--data', str(split_dir), '--out', str(out), '--dim', '16', '--num-layers', '1',
            '--num-frequencies', '4', '--batch-size', '2', '--grad-accum', str(grad_accum), '--max-steps', str(STEPS),
            '--warmup-steps', '2', '--lr', '3e-3', '--save-every', '3', '--eval-every', '3', '--eval-batches', '2',
            '--log-every', '1', '--num-workers', '0', '--seed', '11', '--device', 'cpu']

@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    "One process with 4 micro-batches per step, and two processes with 2 each: 8 sequences per step both."
    root = tmp_path_factory.mktemp('ddp')
    split_dir = make_split(root)
    one = subprocess.run([sys.executable, '-m', 'legalnb.cli', *args(split_dir, root/'one', 4)],
                         env=ENV, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                          '-m', 'legalnb.cli', *args(split_dir, root/'two', 2)], env=ENV, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    return root, one, two

def test_two_ranks_match_one_process_with_the_same_global_batch(runs):
    root, _, _ = runs
    one, two = read_metrics(root/'one'/'metrics.jsonl'), read_metrics(root/'two'/'metrics.jsonl')
    assert [r['step'] for r in one] == [r['step'] for r in two] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([r['loss'] for r in two], [r['loss'] for r in one], rtol=1e-5)
    np.testing.assert_allclose([r['grad_norm'] for r in two], [r['grad_norm'] for r in one], rtol=1e-4)
    v1, v2 = (read_metrics(root/n/'metrics.jsonl', 'eval') for n in ('one', 'two'))
    assert [r['step'] for r in v1] == [r['step'] for r in v2] == [3, 6]
    a = torch.load(root/'one'/'checkpoints'/f'step-{STEPS:08d}'/'model.pt')
    b = torch.load(root/'two'/'checkpoints'/f'step-{STEPS:08d}'/'model.pt')
    for k in a: torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
    assert one[-1]['loss'] < one[0]['loss'], 'it learns'

def test_rank_zero_alone_logs_and_writes(runs):
    root, _, two = runs
    assert two.stdout.count('done: 6 steps') == 1 and two.stdout.count("train a 'small'") == 1
    assert '2 rank(s)' in two.stdout and 'on 2 x cpu' in two.stdout
    assert [checkpoint_step(p) for p in list_checkpoints(root/'two')] == [3, 6]
    lines = (root/'two'/'metrics.jsonl').read_text().splitlines()
    assert len(lines) == len(set(lines)) == STEPS + 2 + 1, 'one line per step, per eval and the end: nothing twice'
    summary = json.loads((root/'two'/'summary.json').read_text())
    assert summary['world_size'] == 2 and summary['tokens'] == STEPS * 8 * 16

def test_ranks_read_disjoint_rows():
    # the trainer maps optimizer step s, micro-batch m to sampler step s * grad_accum + m (see train_loader)
    ranks = [StepSampler(72, 2, seed=11, rank=r, world_size=2) for r in range(2)]
    for s in range(STEPS):
        for m in range(2):
            rows = [set(r.batch(s * 2 + m)) for r in ranks]
            assert not rows[0] & rows[1]
