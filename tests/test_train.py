"""The `legalnb train` command: bad inputs end in one clear line, a non-finite loss stops the run without touching
the last good checkpoint, YAML and flags stack, and checkpoint rotation keeps the newest."""
import json, os, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ARCHITECTURES, ROOT, make_split, shape, tree
from legalnb.cli import main
from legalnb.core import LegalnbError
from legalnb.checkpoint import save_checkpoint, list_checkpoints, checkpoint_step, find_checkpoint
from legalnb.metrics import read_metrics
from legalnb.train import TrainConfig, lr_at, config_from_args, format_log_line, train_parser

@pytest.fixture(autouse=True)
def restore_threads():
    "train(cpu_threads=1) sets torch's threads for the process: give the next test file back what it had."
    n = torch.get_num_threads(); yield; torch.set_num_threads(n)

RUN = ['--batch-size', '4', '--warmup-steps', '1', '--eval-batches', '1', '--num-workers', '0', '--log-every', '1',
       '--lr', '3e-3', '--cpu-threads', '1']
TINY = ['--dim', '16', '--num-layers', '1', '--num-frequencies', '4', *RUN]

def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(['train', *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err

@pytest.fixture(scope='module')
def split_dir(tmp_path_factory): return make_split(tmp_path_factory.mktemp('train'))

def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('legalnb train: error: '), err
    return lines[0]

def test_data_folder_with_no_files(tmp_path, capsys):
    (tmp_path/'split'/'train').mkdir(parents=True); (tmp_path/'split'/'val').mkdir()
    rc, _, err = run(capsys, '--data', tmp_path/'split', '--out', tmp_path/'run', *TINY)
    assert rc == 2 and 'split/train: no .npy or .pt files' in one_line(err)

def test_val_split_missing(split_dir, tmp_path, capsys):
    (tmp_path/'noval').mkdir(); os.symlink(split_dir/'train', tmp_path/'noval'/'train')
    rc, _, err = run(capsys, '--data', tmp_path/'noval', '--out', tmp_path/'run', *TINY)
    assert rc == 2 and 'noval/val: missing' in one_line(err) and 'legalnb split' in err

def test_checkpoint_from_another_model_size(split_dir, tmp_path, capsys):
    assert run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--max-steps', 2, *TINY)[0] == 0
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--max-steps', 4, *TINY, '--dim', '32', '--resume')
    assert rc == 2 and 'checkpoint is from another model (dim 16 != 32)' in one_line(err)
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'run2', '--max-steps', 2, '--size', 'small',
                     '--num-workers', '0', '--resume', tmp_path/'run'/'checkpoints'/'step-00000002')
    assert rc == 2 and 'dim 16 != 768' in one_line(err) and 'num_layers 1 != 6' in err  # the 'small' size's own shape

def test_unknown_preset(split_dir, tmp_path, capsys):
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--preset', 'fastest')
    assert rc == 2 and 'unknown preset scratch/fastest' in one_line(err)

def test_resume_a_finished_run(split_dir, tmp_path, capsys):
    assert run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--max-steps', 2, *TINY)[0] == 0
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--max-steps', 2, *TINY, '--resume')
    assert rc == 2 and 'already at step 2 of 2; raise --max-steps' in one_line(err)
    rc, out, _ = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--max-steps', 3, *TINY, '--resume')
    assert rc == 0 and 'done: 1 steps' in out

def test_resume_without_a_checkpoint(split_dir, tmp_path, capsys):
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'fresh', *TINY, '--resume')
    assert rc == 2 and 'no checkpoint to resume from' in one_line(err)

def test_bad_input_from_a_real_process_has_no_traceback(tmp_path):
    p = subprocess.run([sys.executable, '-m', 'legalnb.cli', 'train', '--data', str(tmp_path/'nowhere'),
                        '--out', str(tmp_path/'r')],
                       capture_output=True, text=True, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert p.returncode == 2 and 'Traceback' not in p.stderr and 'nowhere: no such folder' in one_line(p.stderr)

@pytest.mark.parametrize('model', ARCHITECTURES)
def test_nan_loss_stops_and_leaves_the_last_good_checkpoint(model, split_dir, tmp_path, capsys):
    # a huge lr with a 50-step warm-up: steps 1 and 2 are finite, a later one is not (the same run, resumed, gets there)
    out, wild = tmp_path/'run', ('--lr', '1e3' if model == 'resonance' else '1e5', '--warmup-steps', '50',
                                 '--grad-clip', '0', '--save-every', '2')
    tiny = [*shape(model), *RUN]
    assert run(capsys, '--data', split_dir, '--out', out, '--max-steps', 2, *tiny, *wild)[0] == 0
    good = find_checkpoint(out); before = tree(good)
    # resumed without checkpoints on the way: whichever step first gives nan, step 2's checkpoint is the last good one
    rc, _, err = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 40, *tiny, *wild, '--resume',
                     '--save-every', 1000)
    msg = one_line(err)
    assert rc == 2 and 'training stopped' in msg and 'step-00000002 is untouched' in msg, msg
    assert find_checkpoint(out) == good and tree(good) == before
    assert all(np.isfinite(r['loss']) for r in read_metrics(out/'metrics.jsonl'))

def test_yaml_then_flags(tmp_path, split_dir, capsys):
    # resonance's fast preset is long-context (8k rows, warm-up from 1k): these 16-token rows train with it turned off
    (tmp_path/'run.yaml').write_text(f'data: {split_dir}\npreset: fast\nmax_steps: 3\nlr: 0.002\n'
                                     'batch_tokens: null\nseq_warmup_steps: 0\n')
    c = config_from_args(['--config', str(tmp_path/'run.yaml'), '--lr', '0.001', '--batch-size', '2'])
    from legalnb.presets import get_preset
    p = get_preset('scratch', 'fast', model='resonance')
    assert (c.preset, c.max_steps, c.lr, c.batch_size, c.grad_accum, c.warmup_steps) == ('fast', 3, 0.001, 2, 8,
                                                                                          p.warmup_for(p.steps))
    assert (c.batch_tokens, c.seq_warmup_steps, c.seq_warmup_start) == (None, 0, 1024)
    rc, out, _ = run(capsys, '--config', tmp_path/'run.yaml', '--out', tmp_path/'r', *TINY, '--grad-accum', '1', '--eval-every', '0')
    assert rc == 0 and "(preset 'fast')" in out and 'done: 3 steps' in out
    assert [r['step'] for r in read_metrics(tmp_path/'r'/'metrics.jsonl')] == [1, 2, 3]
    assert [r['step'] for r in read_metrics(tmp_path/'r'/'metrics.jsonl', 'eval')] == [3], 'eval at the end only'

def test_every_field_is_a_flag():
    from dataclasses import fields
    text = train_parser().format_help()
    for f in fields(TrainConfig): assert '--' + f.name.replace('_', '-') in text, f.name
    assert '--no-tf32' in text and 'peak learning rate' in text

def test_lr_schedule():
    c = TrainConfig(lr=1e-3, warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert [round(lr_at(s, c), 6) for s in (0, 9, 10, 60, 110)] == [1e-4, 1e-3, 1e-3, 5.5e-4, 1e-4]
    r = TrainConfig(lr=1e-3, warmup_steps=0, schedule='restarts', restart_steps=20)
    assert lr_at(0, r) == lr_at(20, r) == lr_at(40, r) == 1e-3 and lr_at(19, r) < lr_at(1, r)

def test_config_validation_names_the_field():
    for kw, msg in [(dict(grad_accum=0), 'grad_accum must be > 0'), (dict(beta2=1.0), 'beta2 must be in [0, 1)'),
                    (dict(schedule='linear'), 'schedule must be one of'), (dict(epochs=-1), 'epochs must be > 0')]:
        with pytest.raises(LegalnbError, match=msg.replace('[', r'\[').replace(')', r'\)')): TrainConfig(**kw)

def test_rotation_never_deletes_the_newest(tmp_path):
    lin = torch.nn.Linear(2, 2)
    for step in (5, 10, 15):
        save_checkpoint(tmp_path, dict(step=step, model=lin.state_dict(), config={}, model_config={}), keep=1)
        assert [checkpoint_step(p) for p in list_checkpoints(tmp_path)] == [step]
    save_checkpoint(tmp_path, dict(step=10, model=lin.state_dict(), config={}, model_config={}), keep=1)  # an older branch
    assert [checkpoint_step(p) for p in list_checkpoints(tmp_path)] == [10, 15]

def test_log_line_is_fixed_width():
    r = dict(step=1, loss=10.5, lr=1e-4, step_ms=5.0, tokens_per_sec=12.0, mfu=None, eta_s=1e5)
    a, b = format_log_line(r, 99999), format_log_line({**r, 'step': 99999, 'mfu': 0.5, 'tokens_per_sec': 1e6, 'eta_s': 3}, 99999)
    assert len(a) == len(b) and 'eta  27.8 h' in a and 'eta   3.0 s' in b and 'MFU  50%' in b

@pytest.mark.parametrize('flag,package', [('--tensorboard', 'tensorboard'), ('--wandb', 'wandb')])
def test_optional_loggers_say_what_to_install(flag, package, split_dir, tmp_path, capsys):
    pytest.importorskip('importlib').util.find_spec(package) is None or pytest.skip(f'{package} is installed')
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--max-steps', 1, *TINY, flag)
    assert rc == 2 and f'needs the {package} package: pip install {package}' in one_line(err)

def test_epochs_set_the_step_count(split_dir, tmp_path, capsys):
    from legalnb.data import PretokenizedDataset
    rows = len(PretokenizedDataset(split_dir/'train'))
    rc, out, _ = run(capsys, '--data', split_dir, '--out', tmp_path/'run', *TINY, '--epochs', '0.5', '--eval-every', '0')
    steps = -(-rows // 2 // 4)
    assert rc == 0 and f'done: {steps} steps' in out and (tmp_path/'run'/'checkpoints'/f'step-{steps:08d}').is_dir()

# ---------------------------------------------------------------- the run folder: nothing lost, nothing executed
def finished_run(capsys, split_dir, out, *extra):
    assert run(capsys, '--data', split_dir, '--out', out, '--max-steps', 2, '--save-every', 1, *TINY, *extra)[0] == 0
    return out

def test_a_new_run_into_a_finished_run_is_refused(split_dir, tmp_path, capsys):
    out = finished_run(capsys, split_dir, tmp_path/'run'); before = tree(out)
    rc, _, err = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 3, *TINY)
    assert rc == 2 and 'holds an earlier run (checkpoints/step-00000002)' in one_line(err) and '--overwrite' in err
    assert tree(out) == before, 'nothing deleted, nothing trimmed'
    rc, out_text, _ = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 3, *TINY, '--overwrite')
    assert rc == 0 and [checkpoint_step(p) for p in list_checkpoints(out)] == [3], 'the old checkpoints went, as asked'
    assert [r['step'] for r in read_metrics(out/'metrics.jsonl')] == [1, 2, 3]
    rc, _, err = run(capsys, '--data', split_dir, '--out', out, *TINY, '--overwrite', '--resume')
    assert rc == 2 and 'pass one of them' in one_line(err)

def test_resume_refuses_a_run_with_other_settings(split_dir, tmp_path, capsys):
    out = finished_run(capsys, split_dir, tmp_path/'run'); before = tree(out)
    rc, _, err = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 4, *TINY, '--lr', '1e-3', '--seed', '2', '--resume')
    msg = one_line(err)
    assert rc == 2 and 'step-00000002: checkpoint of a run with other settings (lr 0.003 != 0.001, seed 1337 != 2)' in msg
    assert tree(out) == before
    rc, out_text, _ = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 4, *TINY, '--save-every', '3',
                          '--log-every', '2', '--no-progress', '--resume')
    assert rc == 0 and 'done: 2 steps' in out_text, 'run length and cadence may change'
    other = make_split(tmp_path/'other', rows=64)  # the same shape of rows, fewer of them: other data
    rc, _, err = run(capsys, '--data', other, '--out', out, '--max-steps', 6, *TINY, '--resume')
    assert rc == 2 and 'step-00000004: checkpoint of a run on 72 training rows, --data' in one_line(err) and 'has 48' in err

class Payload:
    "Unpickling this creates a file: the code a hostile checkpoint would run."
    def __init__(self, path): self.path = str(path)
    def __reduce__(self): return (Path.touch, (Path(self.path),))

def test_a_pickled_payload_in_trainer_pt_never_runs(split_dir, tmp_path, capsys):
    out = finished_run(capsys, split_dir, tmp_path/'run')
    newest = out/'checkpoints'/'step-00000002'
    state = torch.load(newest/'trainer.pt', weights_only=True)
    torch.save({**state, 'rng': Payload(tmp_path/'pwned')}, newest/'trainer.pt')
    before = tree(out)
    rc, _, err = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 4, *TINY, '--resume')
    msg = one_line(err)
    assert rc == 2 and 'step-00000002/trainer.pt: holds Python objects besides tensors' in msg
    assert not (tmp_path/'pwned').exists(), 'the payload ran'
    assert '--resume ' + str(out/'checkpoints'/'step-00000001') in msg, 'the newest checkpoint that loads is offered'
    assert tree(out) == before
    rc, _, _ = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 4, *TINY, '--save-every', 1,
                   '--resume', out/'checkpoints'/'step-00000001')
    assert rc == 0 and not (tmp_path/'pwned').exists()
    assert torch.load(out/'checkpoints'/'step-00000002'/'trainer.pt', weights_only=True)['step'] == 2, 'rewritten by legalnb'

def test_a_corrupt_latest_checkpoint_offers_the_previous_one(split_dir, tmp_path, capsys):
    out = finished_run(capsys, split_dir, tmp_path/'run')
    (out/'checkpoints'/'step-00000002'/'model.pt').write_bytes(b'half a checkpoint')
    rc, _, err = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 4, *TINY, '--resume')
    msg = one_line(err)
    assert rc == 2 and 'step-00000002/model.pt: truncated or damaged' in msg
    assert f'the newest checkpoint that loads is {out/"checkpoints"/"step-00000001"}' in msg

def test_stray_checkpoint_folder_and_damaged_metrics(split_dir, tmp_path, capsys):
    out = finished_run(capsys, split_dir, tmp_path/'run')
    (out/'checkpoints'/'step-final').mkdir()
    rc, _, err = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 4, *TINY, '--resume')
    assert rc == 2 and 'checkpoints/step-final: not a checkpoint legalnb wrote' in one_line(err)
    (out/'checkpoints'/'step-final').rmdir()
    lines = (out/'metrics.jsonl').read_text().splitlines(keepends=True)
    (out/'metrics.jsonl').write_text(lines[0] + '{"event": "st\n' + ''.join(lines[1:]))
    rc, _, err = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 4, *TINY, '--resume')
    assert rc == 2 and "metrics.jsonl, line 2: not a JSON record; the run's metrics are damaged" in one_line(err)

def test_a_torn_last_metrics_line_is_tolerated(split_dir, tmp_path, capsys):
    out = finished_run(capsys, split_dir, tmp_path/'run')
    with open(out/'metrics.jsonl', 'a') as f: f.write('{"event": "step", "step": 3, "lo')  # killed in mid-write
    assert [r['step'] for r in read_metrics(out/'metrics.jsonl')] == [1, 2]
    rc, _, _ = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 3, *TINY, '--resume')
    assert rc == 0 and [r['step'] for r in read_metrics(out/'metrics.jsonl')] == [1, 2, 3]
    assert (out/'metrics.jsonl').read_text().endswith('\n')

def test_yaml_numbers_as_text_and_bad_values(tmp_path, split_dir):
    (tmp_path/'run.yaml').write_text(f'data: {split_dir}\nlr: 1e-3\nmax_steps: 2e3\n')
    c = config_from_args(['--config', tmp_path/'run.yaml'])
    assert (c.lr, c.max_steps) == (0.001, 2000), "YAML reads 1e-3 as text: taken as the number it spells"
    (tmp_path/'run.yaml').write_text('batch_size: eight\n')
    with pytest.raises(LegalnbError, match=r"run.yaml: batch_size: expected a number, got 'eight'"):
        config_from_args(['--config', tmp_path/'run.yaml'])
    (tmp_path/'run.yaml').write_text('batch_size: 2.5\n')
    with pytest.raises(LegalnbError, match=r'run.yaml: batch_size: expected a whole number, got 2.5'):
        config_from_args(['--config', tmp_path/'run.yaml'])
    (tmp_path/'run.yaml').write_text('lr: -1.0\n')
    with pytest.raises(LegalnbError, match=r'run.yaml: lr must be > 0, got -1.0'):
        config_from_args(['--config', tmp_path/'run.yaml'])
    with pytest.raises(LegalnbError, match=r'--lr must be > 0, got -1.0'):  # the flag overrides the file, and is named
        config_from_args(['--config', tmp_path/'run.yaml', '--lr', '-1'])

def test_a_failed_run_leaves_no_new_folder(split_dir, tmp_path, capsys):
    rc, _, err = run(capsys, '--data', tmp_path/'nowhere', '--out', tmp_path/'r1', *TINY)
    assert rc == 2 and not (tmp_path/'r1').exists()
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'r2', '--max-steps', 4, *TINY, '--lr', '1e4',
                     '--warmup-steps', '100', '--grad-clip', '0')
    assert rc == 2 and 'No checkpoint was written yet' in one_line(err) and not (tmp_path/'r2').exists()

# ---------------------------------------------------------------- any architecture of the registry
def test_model_gpt_from_the_command_line(split_dir, tmp_path, capsys):
    rc, out, _ = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--max-steps', 2, *shape('gpt'), *RUN)
    assert rc == 0 and "train a 'small' gpt model (num heads 2, dim 16, num layers 1)" in out and 'done: 2 steps' in out
    from legalnb.models import load_model
    m = load_model(tmp_path/'run'/'model')
    assert type(m).__name__ == 'GPTLanguageModel' and (m.config.dim, m.config.num_heads, m.config.max_seq_len) == (16, 2, 16)
    ck = json.loads((tmp_path/'run'/'checkpoints'/'step-00000002'/'config.json').read_text())
    assert ck['config']['model'] == 'gpt' and ck['config']['model_overrides'] == {'num_heads': 2, 'dim': 16, 'num_layers': 1}

def test_a_shape_flag_the_model_lacks_is_one_line(split_dir, tmp_path, capsys):
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--model', 'gpt', '--num-frequencies', '4')
    assert rc == 2 and "--num-frequencies: model 'gpt' has no field num_frequencies (its fields: vocab_size, dim" in one_line(err)
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--model', 'mamba')
    assert rc == 2 and "--model must be one of resonance, gpt, got 'mamba'" in one_line(err)
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--model-overrides', 'num_heads')
    assert rc == 2 and 'expected FIELD=VALUE such as num_heads=4' in one_line(err)
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--model', 'gpt', '--model-overrides', 'num_heads=x')
    assert rc == 2 and "--model-overrides: num_heads: expected a number, got 'x'" in one_line(err)
    assert not (tmp_path/'run').exists()

def test_a_checkpoint_from_before_the_registry_resumes(split_dir, tmp_path, capsys):
    "config.json of older checkpoints: no model (resonance), the shape as dim/num_layers/num_frequencies keys."
    out = tmp_path/'run'
    assert run(capsys, '--data', split_dir, '--out', out, '--max-steps', 2, *TINY)[0] == 0
    meta_path = out/'checkpoints'/'step-00000002'/'config.json'
    meta = json.loads(meta_path.read_text())
    cfg = {k: v for k, v in meta['config'].items() if k not in ('model', 'model_overrides', 'strategy')}
    meta_path.write_text(json.dumps({**meta, 'config': {**cfg, 'dim': 16, 'num_layers': 1, 'num_frequencies': 4}}))
    rc, text, _ = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 3, *TINY, '--resume')
    assert rc == 0 and 'done: 1 steps' in text
    rc, _, err = run(capsys, '--data', split_dir, '--out', out, '--max-steps', 4, *shape('gpt'), *RUN, '--resume')
    assert rc == 2 and 'checkpoint is from another model' in one_line(err)

def test_a_model_registered_here_trains_with_the_same_trainer(split_dir, tmp_path):
    "One registry line makes a new architecture trainable: the test toy (tests/toy_model.py), here through train()."
    from toy_model import TOY, Toy
    from legalnb.models import MODELS, register, load_model
    from legalnb.train import train
    register(TOY)
    try:
        cfg = TrainConfig(data=str(split_dir), out=str(tmp_path/'run'), model='toy', size='small', dim=12,
                          model_overrides={'num_heads': 3}, max_steps=4, batch_size=4, warmup_steps=1, lr=1e-2,
                          num_workers=0, eval_batches=1, progress=False, cpu_threads=1)
        s = train(cfg)
        m = load_model(tmp_path/'run'/'model')
        assert type(m) is Toy and (m.config.dim, m.config.num_heads) == (12, 3) and s['params'] == m.num_params()
        with pytest.raises(LegalnbError, match="TrainConfig.num_frequencies: model 'toy' has no field num_frequencies"):
            TrainConfig(model='toy', size='small', num_frequencies=2)
    finally: del MODELS['toy']

def test_batches_with_document_starts_reach_models_that_take_them():
    from legalnb.models import get_model
    from legalnb.train import evaluate_loss, Dist
    g = get_model('gpt')
    torch.manual_seed(0)
    m = g.build(g.config('small', 32, 8, dim=16, num_layers=1, num_heads=2)).eval()
    x, y = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
    starts = torch.zeros(2, 8, dtype=torch.bool); starts[:, 0] = starts[:, 5] = True
    with torch.no_grad(): masked, plain = m(x, y, doc_starts=starts)[1].item(), m(x, y)[1].item()
    assert masked != plain
    assert evaluate_loss(m, [(x, y, starts)], Dist(), 'fp32', 1) == pytest.approx(masked)
    assert evaluate_loss(m, [dict(input_ids=x, targets=y, doc_starts=starts)], Dist(), 'fp32', 1) == pytest.approx(masked)
    assert evaluate_loss(m, [(x, y)], Dist(), 'fp32', 1) == pytest.approx(plain)


# ---------------------------------------------------------------- long-context presets: batch in tokens, length warm-up
WARM = ['--batch-size', '2', '--batch-tokens', '128', '--seq-warmup-steps', '4', '--seq-warmup-start', '4',
        '--save-every', '3', '--eval-every', '0']  # 16-token rows: 8 rows of 16 = 16 rows of 8 = 32 rows of 4 per step

def test_the_resonance_presets_are_long_context_and_gpt_keeps_1k():
    from legalnb.presets import get_preset
    for name in ('fast', 'full', 'aggressive'):
        c, p = config_from_args(['--preset', name, '--model', 'resonance']), get_preset('scratch', name, model='resonance')
        assert (c.batch_tokens, c.seq_warmup_steps, c.seq_warmup_start, c.max_steps, c.lr) == (
            p.batch_tokens, p.seq_warmup_steps, 1024, p.steps, p.lr)
    assert config_from_args(['--preset', 'full']).batch_tokens == 524_288, 'resonance is the default model'
    g = config_from_args(['--preset', 'fast', '--model', 'gpt'])
    assert (g.batch_tokens, g.seq_warmup_steps, g.lr, g.max_steps) == (None, 0, 8e-4, 5000)

def test_warm_up_run_feeds_the_same_tokens_at_every_length(split_dir, tmp_path, capsys):
    rc, out, _ = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--max-steps', 6, *TINY, *WARM)
    assert rc == 0, out
    recs = read_metrics(tmp_path/'run'/'metrics.jsonl')
    assert [r['seq_len'] for r in recs] == [4, 4, 8, 8, 16, 16] and {r['step_tokens'] for r in recs} == {128}
    assert json.loads((tmp_path/'run'/'summary.json').read_text())['tokens'] == 6 * 128
    saved = json.loads((tmp_path/'run'/'checkpoints'/'step-00000006'/'config.json').read_text())['config']
    assert (saved['grad_accum'], saved['batch_tokens']) == (4, 128), 'accumulation = 128 / (2 rows x 16 tokens)'
    assert '6 steps of 128 tokens: 2 rows x accumulation (the nearest whole micro-batches' in out and 'rows cut to 4 tokens, doubling' in out

@pytest.fixture(scope='module')
def doc_split(tmp_path_factory):
    "The counting split with a document starting every 5 tokens (doc_starts/ beside the corpus's shards)."
    root = tmp_path_factory.mktemp('docs'); folder = make_split(root)
    (root/'corpus'/'doc_starts').mkdir()
    for shard in (root/'corpus').glob('shard_*.npy'):
        np.save(root/'corpus'/'doc_starts'/shard.name, np.arange(0, np.load(shard).size, 5, dtype=np.int64))
    return folder

@pytest.mark.parametrize('model', ARCHITECTURES)
def test_resume_across_the_warm_up_boundary_equals_the_unbroken_run(model, doc_split, tmp_path, capsys):
    "With document starts in the rows (each cut piece starts a new context): the same weights as an unbroken run."
    from legalnb.train import open_split
    assert open_split(doc_split)[0].doc_starts, 'the rows carry document starts'
    args = ['--data', doc_split, *shape(model), *RUN, *WARM, '--schedule', 'constant']  # LR free of --max-steps
    assert run(capsys, *args, '--out', tmp_path/'unbroken', '--max-steps', 6)[0] == 0
    assert run(capsys, *args, '--out', tmp_path/'stopped', '--max-steps', 3)[0] == 0   # stops at length 8, step 3
    assert run(capsys, *args, '--out', tmp_path/'stopped', '--max-steps', 6, '--resume')[0] == 0
    a, b = (torch.load(tmp_path/r/'checkpoints'/'step-00000006'/'model.pt') for r in ('unbroken', 'stopped'))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r['seq_len'] for r in read_metrics(tmp_path/'stopped'/'metrics.jsonl')] == [4, 4, 8, 8, 16, 16]

def test_cut_rows_mark_every_piece_as_a_new_context():
    from legalnb.train import cut_rows
    x = torch.arange(24).reshape(2, 12)
    starts = torch.zeros(2, 12, dtype=torch.bool); starts[:, 0] = True; starts[0, 7] = True
    cx, cy, cs = cut_rows(x, x + 1, starts, 4)
    assert cx.shape == (6, 4) and torch.equal(cx.flatten(), x.flatten()) and torch.equal(cy, cx + 1)
    assert cs[:, 0].all() and cs[1, 3] and cs.sum() == 7 and starts.sum() == 3, 'the caller\'s mask is not changed'
    assert cut_rows(x, x, None, 6)[2] is None

def test_the_preset_on_rows_the_warm_up_cannot_cut_is_one_line(split_dir, tmp_path, capsys):
    rc, _, err = run(capsys, '--data', split_dir, '--out', tmp_path/'run', '--preset', 'fast', *TINY)
    line = one_line(err)
    assert rc == 2 and '--seq-warmup-start 1,024: the rows of --data' in line and 'have 16 tokens' in line
    assert 'pass --seq-warmup-start 8 (a divisor of 16), or --seq-warmup-steps 0' in line
    assert not (tmp_path/'run').exists()

def test_batch_tokens_round_to_whole_micro_batches_and_bad_values_are_one_line():
    from legalnb.train import resolve_batch
    c = TrainConfig(batch_size=4, batch_tokens=262_144)
    assert [resolve_batch(c, n).grad_accum for n in (1024, 8192, 32768, 3072)] == [64, 8, 2, 21]  # 21 x 4 x 3,072 = 258,048
    assert resolve_batch(c, 8192, world_size=2).grad_accum == 4 and resolve_batch(c, 65536 * 2).grad_accum == 1
    with pytest.raises(LegalnbError, match='--seq-warmup-steps 5 needs seq_warmup_start'):
        config_from_args(['--seq-warmup-steps', '5'])
    with pytest.raises(LegalnbError, match='--batch-tokens must be >= 1, got 0'): config_from_args(['--batch-tokens', '0'])

def test_preset_fast_trains_at_the_data_row_length_with_its_batch_in_tokens(tmp_path, capsys):
    "legalnb train --preset fast --model resonance: 262,144 tokens per step, whatever the rows (here 1,024 tokens)."
    split_1k = make_split(tmp_path/'data', rows=32, seq_len=1024)
    rc, out, _ = run(capsys, '--data', split_1k, '--out', tmp_path/'run', '--preset', 'fast', '--model', 'resonance',
                     *TINY, '--max-steps', 1)
    assert rc == 0 and "(preset 'fast')" in out and '262,144 tokens: 4 rows x accumulation' in out
    assert [(r['seq_len'], r['step_tokens']) for r in read_metrics(tmp_path/'run'/'metrics.jsonl')] == [(1024, 262_144)]
    saved = json.loads((tmp_path/'run'/'checkpoints'/'step-00000001'/'config.json').read_text())['config']
    assert saved['grad_accum'] == 262_144 // (4 * 1024) and saved['batch_tokens'] == 262_144

def test_two_ranks_with_a_batch_in_tokens_and_the_warm_up_match_one_process(dist_runs):
    "The accumulation follows the ranks (4 on one process, 2 on two) so both feed 128 tokens a step, cut alike."
    extra = ['--batch-tokens', '128', '--seq-warmup-steps', '4', '--seq-warmup-start', '4']
    (one, _), (two, proc) = dist_runs('one-warm', 'resonance', 1, 1, *extra), dist_runs('two-warm', 'resonance', 2, 1, *extra)
    a, b = read_metrics(one/'metrics.jsonl'), read_metrics(two/'metrics.jsonl')
    assert [r['seq_len'] for r in a] == [r['seq_len'] for r in b] == [4, 4, 8, 8, 16, 16]
    assert {r['step_tokens'] for r in a} == {r['step_tokens'] for r in b} == {128}
    np.testing.assert_allclose([r['loss'] for r in b], [r['loss'] for r in a], rtol=1e-5)
    wa, wb = (torch.load(d/'checkpoints'/'step-00000006'/'model.pt') for d in (one, two))
    for k in wa: torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-5)
    configs = [json.loads((d/'checkpoints'/'step-00000006'/'config.json').read_text())['config'] for d in (one, two)]
    assert [c['grad_accum'] for c in configs] == [4, 2] and '128 tokens: 2 rows x accumulation' in proc.stdout

def test_a_wsd_run_stopped_by_max_cost_ends_at_the_floor_and_resumes_exactly(split_dir, tmp_path, capsys):
    "--schedule wsd under legalnb run's budget guard: the decay moves inside the budget, the last step runs at the "
    "floor, the checkpoints from the move on record it, and `legalnb train --resume` from one ends on the same weights."
    import shutil
    from legalnb.run import BudgetGuard
    from legalnb.train import train
    argv = ['--data', split_dir, '--max-steps', '12', '--schedule', 'wsd', '--decay-ratio', '0.25', '--save-every', '1',
            '--keep', '20', '--eval-every', '0', *TINY]
    out = tmp_path/'a'
    guard = BudgetGuard(max_cost=1e-6, price=3.6e6)   # spent at once: the second log's forecast passes it
    s = train(config_from_args([*map(str, argv), '--out', str(out)]), [guard])
    err = capsys.readouterr().err
    assert err.count('the learning rate now decays from step 2 to end the run annealed at step 3 of 12') == 1, err
    assert s['step'] == 3 and 'passes --max-cost' in s['stopped'] and 'annealed' in s['stopped'], s
    lr = {r['step']: r['lr'] for r in read_metrics(out/'metrics.jsonl')}
    assert lr[2] == 3e-3 and lr[3] == pytest.approx(3e-3 * 0.1, rel=1e-12), lr   # the last step at the floor
    assert [checkpoint_step(p) for p in list_checkpoints(out)] == [1, 2, 3] and not (out/'model').exists()
    ck = lambda run, n: torch.load(run/'checkpoints'/f'step-{n:08d}'/'trainer.pt', weights_only=True)['scheduler']
    assert ck(out, 1)['decay'] is None and tuple(ck(out, 2)['decay']) == tuple(ck(out, 3)['decay']) == (2, 3)
    copy = tmp_path/'b'; shutil.copytree(out, copy); shutil.rmtree(copy/'checkpoints'/'step-00000003')
    rc, printed, _ = run(capsys, *argv, '--out', copy, '--resume')   # no guard now: the checkpoint holds the decay
    assert rc == 3 and 'stopped at step 3 of 12' in printed and 'annealed' in printed, printed
    a, b = (torch.load(r/'checkpoints'/'step-00000003'/'model.pt') for r in (out, copy))
    assert all(torch.equal(a[k], b[k]) for k in a), 'resumed inside the moved decay: bit-for-bit the same weights'
