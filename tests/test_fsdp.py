"""FSDP (FSDP2's `fully_shard`) under torchrun on the CPU (gloo), for every architecture: two sharded ranks give the
losses and weights of two DDP ranks within float tolerance, write sharded checkpoints (every rank its part) that
resume bit for bit, and leave one consolidated model folder that `load_model` reads."""
import json, shutil

import numpy as np
import pytest
import torch

from conftest import ARCHITECTURES, DIST_STEPS as STEPS, dist_args, legalnb_train
from legalnb.cli import main
from legalnb.models import load_model
from legalnb.metrics import read_metrics
from legalnb.checkpoint import list_checkpoints, checkpoint_step, load_checkpoint

@pytest.fixture(scope='module', params=ARCHITECTURES)
def runs(request, dist_runs):
    "The DDP run of test_ddp (2 ranks x 2 micro-batches of 2) and the same run sharded with --strategy fsdp."
    model = request.param
    (ddp, _), (fsdp, proc) = dist_runs('two', model, 2, 2), dist_runs('fsdp', model, 2, 2, '--strategy', 'fsdp')
    return model, ddp, fsdp, proc

def weights(folder) -> dict:
    return {k: v.detach() for k, v in load_model(folder).state_dict().items()}

def test_fsdp_matches_ddp(runs):
    model, ddp, fsdp, proc = runs
    a, b = read_metrics(ddp/'metrics.jsonl'), read_metrics(fsdp/'metrics.jsonl')
    assert [r['step'] for r in b] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([r['loss'] for r in b], [r['loss'] for r in a], rtol=1e-5)
    np.testing.assert_allclose([r['grad_norm'] for r in b], [r['grad_norm'] for r in a], rtol=1e-4)
    np.testing.assert_allclose([r['val_loss'] for r in read_metrics(fsdp/'metrics.jsonl', 'eval')],
                               [r['val_loss'] for r in read_metrics(ddp/'metrics.jsonl', 'eval')], rtol=1e-5)
    wa, wb = weights(ddp/'model'), weights(fsdp/'model')
    assert wa.keys() == wb.keys()
    for k in wa: torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-5)
    assert 'FSDP over the ranks' in proc.stdout and proc.stdout.count('done: 6 steps') == 1

def test_checkpoints_are_sharded_and_the_model_is_one_folder(runs):
    model, _, fsdp, _ = runs
    assert [checkpoint_step(p) for p in list_checkpoints(fsdp)] == [3, 6]
    ck = fsdp/'checkpoints'/f'step-{STEPS:08d}'
    assert sorted(p.name for p in ck.iterdir()) == ['config.json', 'sharded', 'trainer.pt'], 'no full model.pt'
    assert sorted(p.name for p in (ck/'sharded').iterdir()) == ['.metadata', '__0_0.distcp', '__1_0.distcp']
    state = load_checkpoint(ck)  # trainer.pt through weights_only, the shards named
    assert state['step'] == STEPS and state['sharded'] == ck/'sharded' and state['config']['strategy'] == 'fsdp'
    assert json.loads((fsdp/'model'/'config.json').read_text())['architecture'] == model
    summary = json.loads((fsdp/'summary.json').read_text())
    assert load_model(fsdp/'model').num_params() == summary['params'] and summary['world_size'] == 2

def test_resume_from_a_sharded_checkpoint_is_bit_exact(runs, dist_runs, tmp_path):
    model, _, fsdp, _ = runs
    out = tmp_path/'resumed'
    shutil.copytree(fsdp, out)  # the finished run, set back to its step-3 checkpoint: as if killed at step 4 or 5
    for p in (out/'checkpoints'/f'step-{STEPS:08d}', out/'model'): shutil.rmtree(p)
    (out/'summary.json').unlink()
    p = legalnb_train(dist_args(dist_runs.split_dir, out, model, 2, '--strategy', 'fsdp', '--resume'), nproc=2)
    assert p.returncode == 0, p.stderr[-3000:]
    want, got = weights(fsdp/'model'), weights(out/'model')
    for k in want: assert torch.equal(got[k], want[k]), f'{k} differs after resuming from step 3'
    a, b = read_metrics(fsdp/'metrics.jsonl'), read_metrics(out/'metrics.jsonl')
    assert [r['step'] for r in b] == list(range(1, STEPS + 1)) and [r['loss'] for r in b] == [r['loss'] for r in a]
    assert json.loads((out/'summary.json').read_text())['resumed_from'] == 3

def test_a_ddp_checkpoint_is_not_resumed_sharded(runs, dist_runs, tmp_path, capsys):
    model, ddp, _, _ = runs
    shutil.copytree(ddp, tmp_path/'run')
    argv = dist_args(dist_runs.split_dir, tmp_path/'run', model, 4, '--strategy', 'fsdp', '--max-steps', '9', '--resume')
    assert main(['train', *map(str, argv)]) == 2
    assert "strategy 'ddp' != 'fsdp'" in capsys.readouterr().err
