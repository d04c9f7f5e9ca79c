"""--report-to: the trackers run for real, offline, and are read back with their own readers. A native run stopped by
the budget guard and resumed is one run in TensorBoard and in MLflow, with val_bpb; a resumed run keeps its W&B run
id; an error mid-run still closes the writers; `finetune --report-to` writes events and continues its runs."""
import json, sys
from pathlib import Path

import pytest
import torch

from conftest import make_split, tree
from legalnb.cli import main
from legalnb.core import LegalnbError
from legalnb.train import config_from_args, train

TINY = ['--dim', '16', '--num-layers', '1', '--num-frequencies', '4', '--batch-size', '4', '--warmup-steps', '1',
        '--eval-batches', '1', '--num-workers', '0', '--log-every', '1', '--lr', '3e-3', '--cpu-threads', '1',
        '--no-progress']
TRACKER_ENV = ('TENSORBOARD_LOGGING_DIR', 'MLFLOW_TRACKING_URI', 'MLFLOW_EXPERIMENT_NAME', 'MLFLOW_RUN_ID',
               'WANDB_MODE', 'WANDB_DIR', 'WANDB_CACHE_DIR', 'WANDB_PROJECT', 'WANDB_RUN_ID', 'WANDB_RESUME',
               'WANDB_API_KEY', 'TRACKIO_DIR')

@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    "No tracker setting of the machine leaks in, an empty home: a machine never logged in to W&B (so it runs offline)."
    for k in TRACKER_ENV: monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv('HOME', str(tmp_path/'home')); (tmp_path/'home').mkdir()
    for k in ('XDG_CACHE_HOME', 'XDG_CONFIG_HOME', 'XDG_DATA_HOME', 'NETRC'): monkeypatch.delenv(k, raising=False)
    n = torch.get_num_threads(); yield; torch.set_num_threads(n)

@pytest.fixture(scope='module')
def split_dir(tmp_path_factory):
    "The counting split, with a tokenizer.json so that evaluation reports bits per byte."
    from tokenizers import Tokenizer, models
    d = make_split(tmp_path_factory.mktemp('trackers'))
    Tokenizer(models.WordLevel({c: i for i, c in enumerate('abcdefghijklmnopqrstuvwxyz012345')}, unk_token='a')) \
        .save(str(d/'tokenizer.json'))
    return d

def run_args(split_dir, out, *extra) -> list[str]:
    return ['--data', str(split_dir), '--out', str(out), '--max-steps', '6', '--eval-every', '2', *TINY, *extra]

class StopAt:
    "A callback that asks to stop at a step, as legalnb run's budget guard does."
    def __init__(self, step): self.step = step
    def should_stop(self, r): return f"step {r['step']} reached" if r['step'] >= self.step else None

class CrashAt:
    "A callback that raises at a step: a crash in mid-run."
    def __init__(self, step): self.step = step
    def on_step(self, r):
        if r['step'] == self.step: raise RuntimeError(f'crash at step {self.step}')

def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    "Every scalar tag of a TensorBoard log folder, read back with tensorboard's own reader: [(step, value)]."
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(logdir)).Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()['scalars']}

def mlflow_runs(store: Path, monkeypatch) -> tuple:
    "(client, the runs of the 'legalnb' experiment) of an MLflow file store, read back with mlflow's client."
    monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')
    from mlflow import MlflowClient
    client = MlflowClient(store.as_uri())
    return client, client.search_runs([client.get_experiment_by_name('legalnb').experiment_id])

def steps(history) -> list[int]: return sorted(m.step for m in history)

def writer_threads() -> int:
    "TensorBoard writers open in this process: each holds a thread until it is closed (its events are written as "
    "they come)."
    import threading
    return sum(type(t).__name__ == '_AsyncWriterThread' for t in threading.enumerate())

def test_budget_stop_then_resume_is_one_run_in_tensorboard_and_mlflow(split_dir, tmp_path, monkeypatch, capsys):
    from legalnb.run import BudgetGuard
    out, report = tmp_path/'run', ['--report-to', 'tensorboard', 'mlflow']
    guard = BudgetGuard(max_cost=1, price=3.6e6)   # $1,000 a second: the second log's forecast passes $1
    writers = writer_threads()
    s = train(config_from_args(run_args(split_dir, out, *report)), [guard])
    assert s['stopped'] and 'passes --max-cost $1.00' in s['stopped'] and s['step'] == 2
    assert writer_threads() == writers, 'the stopped run closed its TensorBoard writer'
    ids = json.loads((out/'trackers.json').read_text())
    client, runs = mlflow_runs(out/'mlruns', monkeypatch)
    assert [r.info.run_id for r in runs] == [ids['mlflow']] and runs[0].info.status == 'KILLED', 'stopped, resumable'
    assert main(['train', *run_args(split_dir, out, '--report-to', 'tensorboard,mlflow'), '--resume']) == 0
    assert json.loads((out/'trackers.json').read_text()) == ids, 'the resumed run kept its trackers\' runs'
    printed = capsys.readouterr().out
    assert f"mlflow: run {ids['mlflow']} in {(out/'mlruns').absolute().as_uri()}" in printed
    assert f"tensorboard: {(out/'tb').absolute()}" in printed and 'report to tensorboard, mlflow' in printed
    tb = scalars(out/'tb')
    assert [step for step, _ in tb['train/loss']] == [1, 2, 3, 4, 5, 6], 'one continuous run in TensorBoard'
    assert [step for step, _ in tb['val/bpb']] == [4, 6] and all(0 < v < 20 for _, v in tb['val/bpb'])
    assert {'train/lr', 'train/tokens_per_sec', 'val/loss', 'val/ppl'} <= set(tb)
    client, runs = mlflow_runs(out/'mlruns', monkeypatch)
    assert [r.info.run_id for r in runs] == [ids['mlflow']] and runs[0].info.status == 'FINISHED', 'one MLflow run'
    assert steps(client.get_metric_history(ids['mlflow'], 'train/loss')) == [1, 2, 3, 4, 5, 6]
    bpb = client.get_metric_history(ids['mlflow'], 'val/bpb')
    assert [(m.step, round(m.value, 6)) for m in sorted(bpb, key=lambda m: m.step)] == \
        [(step, round(v, 6)) for step, v in tb['val/bpb']], 'the same val_bpb in both trackers'
    assert runs[0].data.params['max_steps'] == '6' and runs[0].info.run_name == ids['name']
    assert not any((tmp_path/'home').iterdir()), 'nothing written to the home folder'

def test_a_resumed_run_continues_its_wandb_run_offline(split_dir, tmp_path):
    wandb = pytest.importorskip('wandb')
    out = tmp_path/'run'
    assert train(config_from_args(run_args(split_dir, out, '--report-to', 'wandb')), [StopAt(2)])['stopped']
    run_id = json.loads((out/'trackers.json').read_text())['wandb']
    assert wandb.run is None, 'the stopped run finished its W&B run'
    assert train(config_from_args(run_args(split_dir, out, '--wandb', '--resume')))['steps'] == 4   # the old flag
    assert json.loads((out/'trackers.json').read_text())['wandb'] == run_id and wandb.run is None
    tries = sorted((out/'wandb').glob('offline-run-*'))
    assert [p.name.rsplit('-', 1)[1] for p in tries] == [run_id, run_id], 'both tries log to one W&B run'
    assert all((p/f'run-{run_id}.wandb').stat().st_size > 0 for p in tries)
    assert not any((tmp_path/'home').iterdir()), 'nothing written to the home folder'

def test_an_error_mid_run_closes_the_trackers(split_dir, tmp_path, monkeypatch):
    out = tmp_path/'run'
    cfg = config_from_args(run_args(split_dir, out, '--report-to', 'tensorboard,mlflow', '--save-every', '2'))
    writers = writer_threads()
    with pytest.raises(RuntimeError, match='crash at step 3'): train(cfg, [CrashAt(3)])
    assert writer_threads() == writers, 'the TensorBoard writer was closed'
    assert [step for step, _ in scalars(out/'tb')['train/loss']] == [1, 2, 3], 'every event up to the crash is there'
    ids = json.loads((out/'trackers.json').read_text())
    client, runs = mlflow_runs(out/'mlruns', monkeypatch)
    assert runs[0].info.status == 'FAILED'
    assert steps(client.get_metric_history(ids['mlflow'], 'train/loss')) == [1, 2, 3]

def test_report_to_flags_plans_and_missing_packages(split_dir, tmp_path, capsys, monkeypatch):
    assert config_from_args(['--report-to', 'tensorboard', 'mlflow']).report_to == 'tensorboard,mlflow'
    old = config_from_args(['--report-to', 'mlflow', '--tensorboard', '--wandb'])   # the older flags still work
    assert old.report_to == 'mlflow,tensorboard,wandb'
    assert config_from_args([]).report_to == 'none'
    assert main(['train', *run_args(split_dir, tmp_path/'r', '--report-to', 'comet')]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--report-to: 'comet' is not a tracker: choose none, or one or more of" in err
    from legalnb.run import build_stages, plan_of, read_command_line
    plan = {'input': str(tmp_path), 'out': str(tmp_path/'w'), 'train': {'report_to': ['tensorboard', 'mlflow']}}
    train_stage = next(s for s in build_stages(plan_of(plan))[0] if s.name == 'train')
    assert train_stage.config.report_to == 'tensorboard,mlflow' and '--report-to' in train_stage.argv
    with pytest.raises(LegalnbError, match="plan: train.report_to: 'comet' is not a tracker"):
        plan_of({'input': str(tmp_path), 'train': {'report_to': 'comet'}})
    assert read_command_line(['--train.report-to', 'tensorboard', 'wandb'])[1]['train'] == {
        'report_to': ['tensorboard', 'wandb']}
    monkeypatch.setitem(sys.modules, 'trackio', None)   # as Python sees a package that is not installed
    assert main(['train', *run_args(split_dir, tmp_path/'r', '--report-to', 'trackio')]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "needs the trackio package: pip install trackio (pip install 'legalnb[track]' installs every" in err
    assert not (tmp_path/'r').exists()

@pytest.fixture(scope='module')
def hf_work(tmp_path_factory):
    "A tiny Llama-style model and an SFT JSONL file."
    from legalnb.sources import write_jsonl
    from legalnb.hf import build_tiny_model, demo_examples
    d = tmp_path_factory.mktemp('hf-trackers')
    build_tiny_model(d/'model', 'llama'); write_jsonl(demo_examples(24), d/'sft.jsonl')
    return d

def test_finetune_reports_to_tensorboard_and_a_resume_continues_its_mlflow_and_wandb_runs(hf_work, tmp_path,
                                                                                          monkeypatch, capsys):
    wandb = pytest.importorskip('wandb')
    from legalnb.options import Output, run_writing
    from legalnb.hf import _run_file, finetune_command, finetune_parser
    out = tmp_path/'run'
    flags = ['--model', str(hf_work/'model'), '--data', str(hf_work/'sft.jsonl'), '--out', str(out), '--max-steps', '4',
             '--batch-size', '2', '--grad-accum', '1', '--workers', '0', '--logging-steps', '1', '--save-steps', '100']
    parsed = vars(finetune_parser().parse_args([*flags, '--report-to', 'tensorboard', 'mlflow', 'wandb']))
    stopped = dict(parsed, sinks=[StopAt(2)])   # legalnb finetune, stopped as legalnb run's budget guard stops it
    assert run_writing(finetune_command, stopped, 'legalnb finetune', [Output(ours=_run_file)]) == 3
    ids = json.loads((out/'trackers.json').read_text())
    assert wandb.run is None, 'the W&B run the integration leaves open was finished'
    assert main(['finetune', *flags, '--resume', '--report-to', 'tensorboard,mlflow,wandb']) == 0
    assert json.loads((out/'trackers.json').read_text()) == ids
    tb = scalars(out/'tb')
    assert [step for step, _ in tb['train/loss']] == [1, 2, 3, 4] and 'eval/loss' in tb
    client, runs = mlflow_runs(out/'mlruns', monkeypatch)
    assert [r.info.run_id for r in runs] == [ids['mlflow']] and runs[0].info.status == 'FINISHED'
    assert steps(client.get_metric_history(ids['mlflow'], 'loss')) == [1, 2, 3, 4], 'one MLflow run'
    tries = sorted((out/'wandb').glob('offline-run-*'))
    assert [p.name.rsplit('-', 1)[1] for p in tries] == [ids['wandb']] * 2, 'one W&B run'
    assert not any((tmp_path/'home').iterdir()), 'nothing written to the home folder'

def test_trackio_stopped_and_resumed_is_one_run(split_dir, tmp_path):
    "trackio runs locally (a SQLite file, no server)."
    import importlib.util
    if importlib.util.find_spec('trackio') is None: pytest.skip('trackio is not installed')   # found, not imported
    out = tmp_path/'run'   # trackio reads TRACKIO_DIR when it is imported: the first run here imports it
    assert train(config_from_args(run_args(split_dir, out, '--report-to', 'trackio')), [StopAt(2)])['stopped']
    train(config_from_args(run_args(split_dir, out, '--report-to', 'trackio', '--resume')))
    from trackio.sqlite_storage import SQLiteStorage
    assert (out/'trackio'/'legalnb.db').is_file()
    name = json.loads((out/'trackers.json').read_text())['name']
    assert SQLiteStorage.get_runs('legalnb') == [name], 'one trackio run'
    logs = SQLiteStorage.get_logs('legalnb', name)
    assert [r['step'] for r in logs if 'train/loss' in r] == [1, 2, 3, 4, 5, 6]
    assert any('val/bpb' in r for r in logs)

def test_a_damaged_trackers_json_or_tracker_environment_is_one_line_before_anything_is_written(split_dir, tmp_path,
                                                                                                monkeypatch, capsys):
    "Ids that are numbers, objects, paths or long strings; W&B online without a key; an MLflow server that is closed "
    "or never answers: exit 2, one line, the run folder as it was."
    import socket, time
    import legalnb.metrics
    out = tmp_path/'run'
    assert train(config_from_args(run_args(split_dir, out, '--save-every', '2', '--report-to', 'tensorboard')),
                 [StopAt(2)])['stopped']
    (out/'trackers.json').write_text('{"name": "run-ab12cd", "wandb": "0a1b2c3d4e5f", "mlflow": "9f8e7d6c5b4a"}\n')
    before = tree(out); capsys.readouterr()
    def refused(tracker: str, *expected: str):
        t = time.monotonic()
        assert main(['train', *run_args(split_dir, out, '--report-to', tracker), '--resume']) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and all(e in err for e in expected), err
        assert tree(out) == before, 'nothing written'
        return time.monotonic() - t
    good = (out/'trackers.json').read_text()
    for tracker, key, bad, what in (('wandb', 'wandb', 7, 'a W&B run id'), ('mlflow', 'mlflow', {'id': 'x'}, 'an MLflow'),
                                    ('trackio', 'name', '../../elsewhere', 'a run name'),
                                    ('wandb', 'wandb', 'x' * 65, 'a W&B run id')):
        (out/'trackers.json').write_text(json.dumps(dict(json.loads(good), **{key: bad})))
        before = tree(out)
        refused(tracker, f'{out/"trackers.json"}: "{key}" is {json.dumps(bad)[:60]}; expected {what}')
    (out/'trackers.json').write_text(good); before = tree(out)
    monkeypatch.setenv('WANDB_MODE', 'online')   # and no key: the fixture's home has no .netrc
    refused('wandb', 'WANDB_MODE=online, but W&B has no key', 'run `wandb login`, or set WANDB_MODE=offline')
    monkeypatch.delenv('WANDB_MODE')
    with socket.socket() as closed:   # bound, not listening: connections are refused
        closed.bind(('127.0.0.1', 0)); uri = f'http://127.0.0.1:{closed.getsockname()[1]}'
        monkeypatch.setenv('MLFLOW_TRACKING_URI', uri)
        assert refused('mlflow', f'MLFLOW_TRACKING_URI {uri}: Connection refused within 5 s', 'start the server') < 60
    monkeypatch.setattr(legalnb.metrics, 'MLFLOW_ANSWER_S', 0.5)
    with socket.socket() as silent:   # accepts connections (the kernel's backlog) and never answers
        silent.bind(('127.0.0.1', 0)); silent.listen(); uri = f'http://127.0.0.1:{silent.getsockname()[1]}'
        monkeypatch.setenv('MLFLOW_TRACKING_URI', uri)
        assert refused('mlflow', f'MLFLOW_TRACKING_URI {uri}: no answer within 0.5 s') < 60

def test_finetune_killed_after_a_checkpoint_and_resumed_is_one_run_in_tensorboard(hf_work, tmp_path, capsys):
    "The first try fails at step 3, after its checkpoint at step 2 and its log of step 3 (a deterministic kill); the "
    "resumed try logs step 3 again: TensorBoard's reader shows each step once. A damaged trackers.json is refused first."
    from legalnb.options import Output, run_writing
    from legalnb.hf import _run_file, finetune_command, finetune_parser
    out = tmp_path/'run'
    flags = ['--model', str(hf_work/'model'), '--data', str(hf_work/'sft.jsonl'), '--out', str(out), '--max-steps', '4',
             '--batch-size', '2', '--grad-accum', '1', '--workers', '0', '--logging-steps', '1', '--save-steps', '2',
             '--report-to', 'tensorboard']
    crashed = dict(vars(finetune_parser().parse_args(flags)), sinks=[CrashAt(3)])
    with pytest.raises(RuntimeError, match='crash at step 3'):
        run_writing(finetune_command, crashed, 'legalnb finetune', [Output(ours=_run_file)])
    assert sorted(p.name for p in out.glob('checkpoint-*')) == ['checkpoint-2']
    assert [step for step, _ in scalars(out/'tb')['train/loss']] == [1, 2, 3], 'step 3 logged after the checkpoint'
    good = json.loads((out/'trackers.json').read_text())
    (out/'trackers.json').write_text(json.dumps(dict(good, name=['not', 'a', 'name'])))
    before = tree(out); capsys.readouterr()
    assert main(['finetune', *flags, '--resume']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f'{out/"trackers.json"}: "name" is ["not", "a", "name"]; expected a run' in err
    assert tree(out) == before, 'nothing written'
    (out/'trackers.json').write_text(json.dumps(good))
    assert main(['finetune', *flags, '--resume']) == 0
    assert len(list((out/'tb').glob('events.out.tfevents.*'))) == 2, 'two tries, two event files'
    tb = scalars(out/'tb')
    assert [step for step, _ in tb['train/loss']] == [1, 2, 3, 4], 'each step once: the killed try\'s step 3 purged'
    assert [step for step, _ in tb['train/learning_rate']] == [1, 2, 3, 4]
