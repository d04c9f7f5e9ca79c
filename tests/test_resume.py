"""Crash safety of the trainer: a training process killed with SIGKILL at a random step and resumed ends with
exactly the weights of a run that never stopped (CPU, every architecture), and a crash in the middle of writing a checkpoint leaves
the previous checkpoint loadable."""
import json, os, random, signal, subprocess, sys, time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ARCHITECTURES, ENV, make_split, shape, tree
from legalnb.metrics import read_metrics
from legalnb.checkpoint import find_checkpoint, list_checkpoints, load_checkpoint, checkpoint_step

STEPS = 12

def train_cmd(split_dir: Path, out: Path, *extra: str, model: str = 'resonance') -> list[str]:
    return [sys.executable, '-m', 'legalnb.cli', 'train', '--data', str(split_dir), '--out', str(out),
            *shape(model), '--batch-size', '4', '--grad-accum', '2',
            '--max-steps', str(STEPS), '--warmup-steps', '2', '--lr', '3e-3', '--save-every', '3', '--keep', '2',
            '--eval-every', '6', '--eval-batches', '2', '--log-every', '1', '--num-workers', '0', '--seed', '7', *extra]

def final_weights(out: Path) -> dict:
    return torch.load(out/'checkpoints'/f'step-{STEPS:08d}'/'model.pt')

@pytest.fixture(scope='module')
def references(tmp_path_factory):
    "`get(model)`: a split and the final weights and metrics of an uninterrupted run of `model` on it (made once)."
    root, made = tmp_path_factory.mktemp('resume'), {}
    split_dir = make_split(root)
    def get(model: str):
        if model not in made:
            out = root/model/'straight'
            subprocess.run(train_cmd(split_dir, out, model=model), check=True, env=ENV, capture_output=True)
            made[model] = split_dir, final_weights(out), read_metrics(out/'metrics.jsonl')
        return made[model]
    return get

@pytest.fixture(scope='module')
def reference(references): return references('resonance')

def wait_for_step(metrics: Path, step: int, proc: subprocess.Popen, timeout=900):
    "Block until the metrics file records `step` (or the process ends); the bound only stops a hung run (a loaded "
    "machine may take minutes to start one: a shorter bound killed it before `step`, at a moment the test did not mean)."
    t0 = time.time()
    while time.time() - t0 < timeout and proc.poll() is None:
        if metrics.exists() and any(r['step'] >= step for r in read_metrics(metrics)): return
        time.sleep(0.02)

@pytest.mark.parametrize('model', ARCHITECTURES)
def test_kill_9_at_a_random_step_then_resume_is_bit_exact(model, references, tmp_path):
    split_dir, want, want_metrics = references(model)
    kill_at = random.Random().randint(4, STEPS - 2)
    out = tmp_path/'killed'
    proc = subprocess.Popen(train_cmd(split_dir, out, model=model), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_step(out/'metrics.jsonl', kill_at, proc)
    proc.send_signal(signal.SIGKILL); proc.wait()
    assert proc.returncode == -signal.SIGKILL, f'the run ended before the kill at step {kill_at}'
    resumed_from = checkpoint_step(find_checkpoint(out))
    assert 3 <= resumed_from < STEPS, f'killed at step {kill_at}: expected a checkpoint before the end'
    subprocess.run(train_cmd(split_dir, out, '--resume', model=model), check=True, env=ENV, capture_output=True)
    got = final_weights(out)
    assert got.keys() == want.keys()
    for k in want: assert torch.equal(got[k], want[k]), f'{k} differs after kill at step {kill_at}, resume from {resumed_from}'
    # the metrics file reads like one run: every step once, the same losses
    steps = read_metrics(out/'metrics.jsonl')
    assert [r['step'] for r in steps] == list(range(1, STEPS + 1))
    assert [r['loss'] for r in steps] == [r['loss'] for r in want_metrics]
    summary = json.loads((out/'summary.json').read_text())
    assert summary['resumed_from'] == resumed_from and summary['steps'] == STEPS - resumed_from

CRASH_IN_SAVE = '''
import os, signal, sys
import legalnb.checkpoint as T
real = T._save_file
def dying(obj, path):
    if path.name == 'trainer.pt' and '-00000006-' in path.parent.name:
        path.write_bytes(b'half a checkpoint'); os.kill(os.getpid(), signal.SIGKILL)
    real(obj, path)
T._save_file = dying
from legalnb.cli import main
sys.exit(main(sys.argv[1:]))
'''

def test_crash_while_writing_a_checkpoint_leaves_the_previous_one(reference, tmp_path):
    split_dir, want, _ = reference
    out = tmp_path/'crash'
    cmd = train_cmd(split_dir, out)
    proc = subprocess.run([sys.executable, '-c', CRASH_IN_SAVE, *cmd[3:]], env=ENV, capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    leftovers = [p.name for p in (out/'checkpoints').iterdir() if p.name.startswith('.tmp-step-00000006')]
    assert leftovers, 'the crash happened inside the save of step 6'
    assert [checkpoint_step(p) for p in list_checkpoints(out)] == [3]
    ck = load_checkpoint(find_checkpoint(out))
    assert ck['step'] == 3 and set(ck) >= {'model', 'optimizer', 'scheduler', 'scaler', 'rng', 'data', 'elapsed', 'config', 'model_config'}
    # resuming from it cleans the leftover and still ends where the uninterrupted run ended
    subprocess.run(train_cmd(split_dir, out, '--resume'), check=True, env=ENV, capture_output=True)
    assert not [p for p in (out/'checkpoints').iterdir() if p.name.startswith('.tmp')]
    assert [checkpoint_step(p) for p in list_checkpoints(out)] == [9, 12], 'keep 2'
    got = final_weights(out)
    assert all(torch.equal(got[k], want[k]) for k in want)

DISK_FULL = '''
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (16_000, 16_000))  # metrics and config.json fit; model.pt (24 kB) does not
from legalnb.cli import main
sys.exit(main(sys.argv[1:]))
'''

def test_a_full_disk_during_a_save_loses_no_checkpoint(reference, tmp_path):
    split_dir, want, _ = reference
    out = tmp_path/'full'
    subprocess.run(train_cmd(split_dir, out, '--max-steps', '6'), check=True, env=ENV, capture_output=True)
    before = tree(out/'checkpoints')
    proc = subprocess.run([sys.executable, '-c', DISK_FULL, *train_cmd(split_dir, out, '--resume')[3:]], env=ENV,
                          capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and 'Traceback' not in proc.stderr, proc.stderr
    assert 'step-00000009: could not be written' in lines[0] and 'the previous checkpoint' in lines[0], lines[0]
    assert 'step-00000006 is kept' in lines[0]
    assert tree(out/'checkpoints') == before, 'the checkpoints before the failed save are all there, unchanged'
    # with room again, the run continues from step 6 (a 6-step run resumed to 12: another schedule than `reference`)
    subprocess.run(train_cmd(split_dir, out, '--resume'), check=True, env=ENV, capture_output=True)
    summary = json.loads((out/'summary.json').read_text())
    assert summary['resumed_from'] == 6 and [checkpoint_step(p) for p in list_checkpoints(out)] == [9, 12]

def test_kill_9_after_a_batch_change_then_resume_is_bit_exact(references, tmp_path):
    "A progressive batch (accumulation 3, 2 from step 4, 1 from step 8): killed after step 7, resumed from step 6."
    split_dir = references('gpt')[0]
    sched = ('--batch-schedule', '0:3,4:2,8:1')
    straight, killed = tmp_path/'straight', tmp_path/'killed'
    subprocess.run(train_cmd(split_dir, straight, *sched, model='gpt'), check=True, env=ENV, capture_output=True)
    proc = subprocess.Popen(train_cmd(split_dir, killed, *sched, model='gpt'), env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_for_step(killed/'metrics.jsonl', 7, proc)
    proc.send_signal(signal.SIGKILL); proc.wait()
    assert proc.returncode == -signal.SIGKILL, 'the run ended before the kill'
    resumed_from = checkpoint_step(find_checkpoint(killed))
    assert resumed_from >= 6, 'the checkpoint lies after the first change of the batch'
    subprocess.run(train_cmd(split_dir, killed, *sched, '--resume', model='gpt'), check=True, env=ENV, capture_output=True)
    want, got = final_weights(straight), final_weights(killed)
    assert all(torch.equal(got[k], want[k]) for k in want), f'resumed from step {resumed_from}: other weights'
    recs = read_metrics(killed/'metrics.jsonl')
    assert [r['loss'] for r in recs] == [r['loss'] for r in read_metrics(straight/'metrics.jsonl')]
    assert [r['step_tokens'] for r in recs] == [3 * 4 * 16] * 4 + [2 * 4 * 16] * 4 + [4 * 16] * 4
    summary = json.loads((killed/'summary.json').read_text())
    assert summary['tokens'] == (3 + 2 + 1) * 4 * 4 * 16 and summary['resumed_from'] == resumed_from

def test_a_checkpoint_from_before_the_recall_branch_resumes_as_it_was_trained(tmp_path):
    "A run started before `recall_layers` existed (its checkpoints name no such field: the plain resonance mixer) "
    "resumes under today's default, which has the branch, as the model it was: bit-exact against a straight run."
    split_dir = make_split(tmp_path)
    plain = ('--model-overrides', 'recall_layers=[]')
    subprocess.run(train_cmd(split_dir, tmp_path/'straight', *plain), check=True, env=ENV, capture_output=True)
    out = tmp_path/'old'
    subprocess.run(train_cmd(split_dir, out, *plain), check=True, env=ENV, capture_output=True)
    for f in out.rglob('config.json'):   # as the version before the branch wrote them
        d = json.loads(f.read_text())
        assert 'recall_layers' not in d.get('model_config', {}), 'an empty recall_layers is not written'
        if 'config' in d: d['config']['model_overrides'].pop('recall_layers', None)
        f.write_text(json.dumps(d))
    r = subprocess.run(train_cmd(split_dir, out, '--resume', str(out/'checkpoints'/'step-00000009')),
                       env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    want, got = final_weights(tmp_path/'straight'), final_weights(out)
    assert not any(k.endswith('recall_gate') for k in got) and want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
