"""`legalnb run` on the generated sample at a tiny size: a run from the CLI, a second run that skips every stage, a
changed seq_len that re-runs build-corpus and what follows, kill -9 during build-corpus and during training, the budget
guard stopping a run and --resume finishing it, and inconsistent plans refused before any stage runs."""
import hashlib, json, os, shutil, signal, subprocess, sys, time
from pathlib import Path

import pytest
import torch
import yaml

from legalnb.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ['--select.target-tokens', '1M', '--build-corpus.seq-len', '32', '--build-corpus.train-tokenizer', '300',
        '--build-corpus.shards', '2', '--build-corpus.val-docs', '0.1', '--train.dim', '16', '--train.num-layers', '1',
        '--train.num-frequencies', '4', '--train.batch-size', '4', '--train.batch-tokens', '128',
        '--train.seq-warmup-steps', '0', '--train.max-steps', '20', '--train.eval-every', '10', '--train.eval-batches', '2',
        '--train.log-every', '5', '--train.save-every', '10', '--train.num-workers', '0', '--train.cpu-threads', '1',
        '--train.device', 'cpu', '--evaluate.device', 'cpu', '--evaluate.citations', '20', '--evaluate.samples', '1',
        '--evaluate.rouge', '2', '--train.no-progress', '--yes']

@pytest.fixture(autouse=True)
def restore_threads():
    "train(cpu_threads=1) sets torch's threads for the process: give the next test back what it had."
    n = torch.get_num_threads(); yield; torch.set_num_threads(n)

def sha(path: Path) -> str: return hashlib.sha256(Path(path).read_bytes()).hexdigest()

def outputs(work: Path) -> dict:
    "What must be the same after an interrupted run and an uninterrupted one: shards, tokenizer, weights, evaluation."
    m = json.loads((work/'corpus'/'manifest.json').read_text())
    final = torch.load(work/'run'/'checkpoints'/'step-00000020'/'model.pt')
    ev = json.loads((work/'eval'/'eval.json').read_text())
    return dict(shards=[s['sha256'] for s in m['shards'] + m['val_shards']], tokenizer=m['tokenizer_sha256'],
                weights={k: v.clone() for k, v in final.items()}, loss=ev['overall']['loss'])

def same(a: dict, b: dict) -> bool:
    return (a['shards'], a['tokenizer'], a['loss']) == (b['shards'], b['tokenizer'], b['loss']) and all(
        torch.equal(a['weights'][k], b['weights'][k]) for k in a['weights'])

@pytest.fixture(scope='module')
def sample(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp('sample')
    assert main(['sample', str(d/'formex'), '--docs', '40']) == 0
    return d/'formex'

def hf_folder(tmp_path: Path, context: int) -> Path:
    "A folder that says it holds a Hugging Face model (its config.json), enough for the plan's checks."
    (tmp_path/'llama').mkdir()
    (tmp_path/'llama'/'config.json').write_text(json.dumps({'model_type': 'llama', 'max_position_embeddings': context}))
    return tmp_path/'llama'

@pytest.fixture(scope='module')
def config_only_model(tmp_path_factory) -> Path: return hf_folder(tmp_path_factory.mktemp('hf'), 64)

@pytest.fixture(scope='module')
def reference(sample, tmp_path_factory):
    "One uninterrupted run, from the CLI, and its outputs."
    work = tmp_path_factory.mktemp('ref')/'work'
    n = torch.get_num_threads()
    assert main(['run', '--input', str(sample), '--out', str(work), *TINY]) == 0
    torch.set_num_threads(n)
    return work, outputs(work)

def test_a_run_then_nothing_to_do_then_a_changed_seq_len(reference, sample, capsys):
    work, _ = reference
    report = (work/'report.md').read_text()
    for part in ('## What each stage made', '| build-corpus | `corpus/` |', '| train | `run/` | 20 steps',
                 '![loss](loss.png)', 'bits per byte'):
        assert part in report, part
    assert (work/'loss.png').exists() and (work/'eval'/'eval.json').exists()
    assert sorted(p.stem for p in (work/'.legalnb-run').glob('*.json')) == sorted(
        ['parse', 'select', 'build-corpus', 'split', 'train', 'evaluate'])
    capsys.readouterr()
    assert main(['run', '--input', str(sample), '--out', str(work), *TINY]) == 0
    out = capsys.readouterr().out
    assert out.count('skipped, up to date') == 6 and '[1/6]' not in out, out
    assert main(['run', '--input', str(sample), '--out', str(work), *TINY, '--build-corpus.seq-len', '16']) == 0
    out = capsys.readouterr().out
    assert 'build-corpus: settings changed (--seq-len 32 -> 16): it runs, and so do the stages after it: split, ' \
           'train, evaluate' in out, out
    assert 'parse: skipped' in out and 'select: skipped' in out and '[3/6] build-corpus' in out and '[6/6] evaluate' in out
    assert json.loads((work/'corpus'/'manifest.json').read_text())['seq_len'] == 16

def _kill_when(cmd: list[str], cwd: Path, ready, done) -> bool:
    "Start `cmd`, SIGKILL it as soon as `ready()` holds; whether `done()` was still false then (killed mid-stage)."
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, 'OMP_NUM_THREADS': '1'})
    try:
        while p.poll() is None and not ready(): time.sleep(0.002)
        midway = p.poll() is None and not done()
        p.send_signal(signal.SIGKILL); p.wait()
    finally:
        if p.poll() is None: p.kill()
    return midway

def test_kill_9_in_build_corpus_and_in_training_then_the_same_command_finishes(reference, sample, tmp_path, capsys):
    work = tmp_path/'work'
    cmd = [sys.executable, '-m', 'legalnb.cli', 'run', '--input', str(sample), '--out', str(work), *TINY]
    assert _kill_when(cmd, ROOT, lambda: (work/'corpus'/'tokenizer.json').exists(),
                      lambda: (work/'corpus'/'manifest.json').exists()), 'build-corpus finished before the kill'
    ckpt = work/'run'/'checkpoints'/'step-00000010'
    assert _kill_when(cmd, ROOT, ckpt.exists, lambda: (work/'run'/'summary.json').exists()), \
        'training finished before the kill'
    capsys.readouterr()
    assert main(cmd[3:]) == 0
    out = capsys.readouterr().out
    assert 'train: interrupted: resuming' in out and '[5/6] train (resuming)' in out, out
    assert same(outputs(work), reference[1]), 'the interrupted run ends with the outputs of the uninterrupted one'

def test_budget_guard_stops_and_resume_finishes(reference, sample, tmp_path, capsys):
    work = tmp_path/'work'
    base = ['run', '--input', str(sample), '--out', str(work), *TINY]
    # $1,000 per GPU-hour-second: any forecast of this run costs far more than $1
    assert main([*base, '--max-cost', '1', '--price-per-hour', '3.6e6']) == 3
    out = capsys.readouterr().out
    assert 'passes --max-cost $1.00' in out and 'stopped cleanly at step 10 of 20 (50%)' in out, out
    assert '--resume --max-cost' in out and not (work/'run'/'summary.json').exists()
    assert not (work/'report.md').exists()
    assert main([*base, '--resume', '--max-cost', '1e9', '--price-per-hour', '3.6e6']) == 0
    out = capsys.readouterr().out
    assert out.count('skipped, up to date') == 4 and '[5/6] train (resuming)' in out, out
    assert same(outputs(work), reference[1]), 'stopped and resumed, the run ends as the one that never stopped'

@pytest.mark.parametrize('plan,expect', [
    ({'build-corpus': {'val_docs': 0}}, 'build-corpus.val_docs is 0'),
    ({'build-corpus': {'seq_len': 32}, 'train': {'seq_warmup_steps': 10}},
     'build-corpus.seq_len 32 and train.seq_warmup_start 1,024'),
    ({'train': {'vocab_size': 256}}, 'build-corpus.train_tokenizer 300 and train.vocab_size 256'),
    ({'build-corpus': {'out': 'elsewhere'}}, 'build-corpus.out: set by legalnb run'),
    ({'build-corpus': {'seq_lenn': 3}}, 'build-corpus.seq_lenn: `legalnb build-corpus` has no flag --seq-lenn'),
    ({'train': {'lr': 0}}, 'train: --lr must be > 0'),
    ({'stages': {}}, 'unknown key(s) stages'),
    ({'stage2': {'trian': {}}}, 'stage2.trian: unknown; stage2 has select:, train: (a native model) and finetune: '
                                '(a Hugging Face model)'),
    ({'stage2': {'finetune': {'lr': 1e-4}}}, 'stage2.finetune: a native model is trained by legalnb train; use '
                                             'stage2.train'),
    ({'model': 'HF', 'stage2': {'train': {'lr': 1e-4}}},
     'stage2.train: a Hugging Face model is fine-tuned by legalnb finetune; use stage2.finetune'),
    ({'model': 'HF', 'stage2': {'finetune': {'model': 'other'}}}, 'stage2.finetune.model: set by legalnb run'),
    ({'model': 'HF', 'stage2': {'finetune': {'out': 'other'}}}, 'stage2.finetune.out: set by legalnb run'),
    ({'model': 'HF', 'finetune': {'lora': True}, 'stage2': {}},
     "stage2 and finetune.lora: the first run's final/ would be a LoRA adapter"),
    ({'model': 'HF', 'stage2': {'finetune': {'init_optimizer': True}}},
     'stage2.finetune.init_optimizer: `legalnb finetune` has no flag --init-optimizer'),
])
def test_inconsistent_plans_are_refused_before_any_stage(plan, expect, sample, config_only_model, tmp_path, capsys):
    base = {'input': [str(sample)], 'out': 'work', 'build-corpus': {'train_tokenizer': 300, 'seq_len': 32},
            'train': {'seq_warmup_steps': 0, 'device': 'cpu'}}
    for k, v in plan.items(): base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    if base.get('model') == 'HF': base['model'] = str(config_only_model)   # a stage2 refused before any check
    (tmp_path/'plan.yaml').write_text(yaml.safe_dump(base))
    assert main(['run', str(tmp_path/'plan.yaml'), '--yes']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expect in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['plan.yaml'], 'nothing was written'

def test_no_terminal_needs_yes(sample, tmp_path, capsys):
    (tmp_path/'plan.yaml').write_text(yaml.safe_dump({'input': [str(sample)], 'out': 'work'}))
    assert main(['run', str(tmp_path/'plan.yaml'), '--train.seq-warmup-steps', '0']) == 2   # pytest's stdin is no terminal
    err = capsys.readouterr().err
    assert '--yes is required when stdin is not a terminal' in err and not (tmp_path/'work').exists()

def _on_a_terminal(argv: list[str], answer: str, cwd: Path) -> tuple[int, str]:
    "Run `legalnb ARGV` with a pseudo-terminal as stdin and stdout; type `answer` at the question; (exit code, output)."
    import pty, select
    leader, follower = pty.openpty()
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': str(ROOT)}
    p = subprocess.Popen([sys.executable, '-m', 'legalnb.cli', *argv], stdin=follower, stdout=follower, stderr=follower,
                         cwd=cwd, env=env, close_fds=True)
    os.close(follower)
    out, asked, deadline = b'', False, time.time() + 300
    while time.time() < deadline:
        if select.select([leader], [], [], 0.5)[0]:
            try: chunk = os.read(leader, 65536)
            except OSError: break   # the child closed the terminal
            if not chunk: break
            out += chunk
        if not asked and b'[y/N]' in out: os.write(leader, answer.encode() + b'\n'); asked = True
        if p.poll() is not None and not select.select([leader], [], [], 0.2)[0]: break
    os.close(leader)
    return p.wait(timeout=60), out.decode(errors='replace')

def test_on_a_terminal_the_run_asks_before_training(sample, tmp_path):
    argv = ['run', '--input', str(sample), '--out', 'work', *[a for a in TINY if a != '--yes']]
    rc, out = _on_a_terminal(argv, 'n', tmp_path)
    assert 'start training? [y/N]' in out and rc == 2 and 'training not started: not confirmed' in out, out
    assert not (tmp_path/'work'/'run').exists()
    rc, out = _on_a_terminal(argv, 'y', tmp_path)
    assert rc == 0 and out.count('skipped, up to date') == 4 and (tmp_path/'work'/'report.md').exists(), out


def test_write_plan_is_a_plan(capsys):
    assert main(['run', '--write-plan', '--input', 'docs', '--out', 'w']) == 0
    text = capsys.readouterr().out
    plan = yaml.safe_load(text)
    assert plan['input'] == ['docs'] and plan['out'] == 'w' and plan['select']['target_tokens'] == '2B'
    assert text.count('#') > 10, 'commented'

def test_stage_to_copies_the_split_verified_and_trains_from_it(reference, sample, tmp_path, capsys):
    work = reference[0]
    argv = ['run', '--input', str(sample), '--out', str(work), *TINY, '--build-corpus.seq-len', '16']   # as the first test left it
    assert main([*argv, '--stage-to', str(tmp_path/'local')]) == 0
    out = capsys.readouterr().out
    assert 'train: settings changed (--data' in out and 'every checksum verified' in out, out
    staged = sorted((tmp_path/'local'/'split'/'train').glob('*.npy'))
    assert staged and not any(p.is_symlink() for p in staged)
    assert all(p.read_bytes() == (work/'split'/'train'/p.name).read_bytes() for p in staged)
    from legalnb.checkpoint import load_checkpoint
    assert load_checkpoint(work/'run'/'checkpoints'/'step-00000020')['config']['data'] == str(tmp_path/'local'/'split')


@pytest.mark.parametrize('flags,expect', [
    (['--build-corpus.seq-len', '64'], 'build-corpus.seq_len 64 is longer than the context of model'),
    (['--build-corpus.seq-len', '8', '--build-corpus.train-tokenizer', '300'], 'build-corpus.train_tokenizer and model'),
    (['--build-corpus.seq-len', '8'], 'preset fast (cpt) is sized for 4 GPUs'),
])
def test_a_hugging_face_plan_is_checked_against_the_model(flags, expect, sample, tmp_path, capsys):
    model = hf_folder(tmp_path, 16)
    assert main(['run', '--input', str(sample), '--out', str(tmp_path/'work'), '--model', str(model), *flags,
                 '--yes']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expect in err[0], err
    assert not (tmp_path/'work').exists()

def test_a_hugging_face_model_finetunes_through_the_same_stages(sample, tmp_path, capsys):
    from legalnb.hf import build_tiny_model
    model = build_tiny_model(tmp_path/'llama', 'llama')
    argv = ['run', '--input', str(sample), '--out', str(tmp_path/'work'), '--model', str(model), '--select.target-tokens', '1M',
            '--build-corpus.seq-len', '32', '--build-corpus.shards', '2', '--build-corpus.val-docs', '0.1', '--finetune.force-single', '--finetune.max-steps', '2',
            '--finetune.batch-size', '2', '--finetune.grad-accum', '1', '--finetune.workers', '0', '--evaluate.citations', '10', '--evaluate.samples', '1',
            '--evaluate.rouge', '2', '--evaluate.device', 'cpu', '--yes']
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert '[5/6] finetune' in out and 'preset fast (cpt, llama)' in out
    assert (tmp_path/'work'/'run'/'final').is_dir() and (tmp_path/'work'/'eval'/'eval.json').exists()
    assert '| finetune | `run/` | 2 steps' in (tmp_path/'work'/'report.md').read_text()
    assert main(argv) == 0 and capsys.readouterr().out.count('skipped, up to date') == 6

def test_a_hugging_face_run_stops_under_the_budget_guard_and_resumes_from_its_staged_corpus(sample, tmp_path, capsys):
    from legalnb.hf import build_tiny_model
    model, work, local = build_tiny_model(tmp_path/'llama', 'llama'), tmp_path/'work', tmp_path/'local'
    argv = ['run', '--input', str(sample), '--out', str(work), '--model', str(model), '--select.target-tokens', '1M',
            '--build-corpus.seq-len', '32', '--build-corpus.shards', '2', '--build-corpus.val-docs', '0.1', '--finetune.force-single', '--finetune.max-steps', '4',
            '--finetune.logging-steps', '1', '--finetune.batch-size', '2', '--finetune.grad-accum', '1', '--finetune.workers', '0', '--evaluate.citations', '10',
            '--evaluate.samples', '1', '--evaluate.rouge', '2', '--evaluate.device', 'cpu', '--yes', '--stage-to', str(local),
            '--price-per-hour', '3.6e6']
    assert main([*argv, '--max-cost', '1']) == 3   # $1,000 per GPU-second: the second log's forecast passes $1
    out = capsys.readouterr().out
    assert 'every checksum verified' in out and 'passes --max-cost $1.00' in out, out
    assert 'stopped cleanly at step 2 of 4 (50%)' in out and '--resume --max-cost' in out, out
    assert (work/'run'/'checkpoint-2').is_dir() and not (work/'run'/'final').exists()
    shards = sorted((work/'corpus').glob('shard_*.npy'))
    assert shards and all((local/'corpus'/p.name).read_bytes() == p.read_bytes() for p in shards)
    assert main([*argv, '--resume', '--max-cost', '1e9']) == 0
    out = capsys.readouterr().out
    assert '[5/6] finetune (resuming)' in out and (work/'run'/'final').is_dir(), out
    assert json.loads((work/'run'/'finetune.json').read_text())['steps'] == 4
    from legalnb.run import read_record
    assert str(local/'corpus') in read_record(work, 'finetune')['argv'], 'finetune read the staged copy'


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(reference, sample, tmp_path, capsys):
    model = hf_folder(tmp_path, 64)
    cfg = json.loads((model/'config.json').read_text()); cfg['vocab_size'] = 256
    (model/'config.json').write_text(json.dumps(cfg))
    tokenizer = reference[0]/'corpus'/'tokenizer.json'   # 300 tokens
    assert main(['run', '--input', str(sample), '--out', str(tmp_path/'work'), '--model', str(model), '--build-corpus.seq-len', '8',
                 '--build-corpus.tokenizer', str(tokenizer), '--finetune.force-single', '--yes']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'has 300 tokens and model' in err[0] and 'a vocabulary of 256' in err[0], err

def test_command_line_paths_start_from_the_shell_plan_paths_from_the_plan(sample, tmp_path, capsys, monkeypatch):
    (tmp_path/'plans').mkdir(); (tmp_path/'cwd'/'elsewhere').mkdir(parents=True)
    (tmp_path/'cwd'/'elsewhere'/'notes.txt').write_text('mine')
    (tmp_path/'plans'/'plan.yaml').write_text(yaml.safe_dump({'input': [str(sample)], 'out': 'work'}))
    monkeypatch.chdir(tmp_path/'cwd')
    assert main(['run', str(tmp_path/'plans'/'plan.yaml'), '--out', 'elsewhere', '--train.seq-warmup-steps', '0']) == 2
    err = capsys.readouterr().err
    assert f'--out {tmp_path/"cwd"/"elsewhere"} holds files legalnb did not write (notes.txt)' in err, err

def test_a_second_stage_on_the_best_documents_from_the_first_run_weights(sample, tmp_path, capsys):
    "stage2: in the plan adds select-2, build-corpus-2, split-2, train-2 (from run/model); evaluate scores run-2."
    plan, work = tmp_path/'plan.yaml', tmp_path/'work'
    plan.write_text(yaml.safe_dump({'input': [str(sample)], 'out': str(work)}))
    assert main(['run', str(plan), *TINY]) == 0
    plan.write_text(yaml.safe_dump({'input': [str(sample)], 'out': str(work), 'stage2': {
        'select': {'target_tokens': '30k'}, 'train': {'lr': 3e-4, 'batch_size': 2}}}))
    capsys.readouterr()
    assert main(['run', str(plan), *TINY, '--max-cost', '1', '--price-per-hour', '3.6e6']) == 3
    out = capsys.readouterr().out
    assert 'train: skipped, up to date' in out and 'select-2: not run yet: it runs' in out, out
    assert 'stopped cleanly at step 10 of 20' in out and not (work/'run-2'/'summary.json').exists(), out
    assert main(['run', str(plan), *TINY, '--resume', '--max-cost', '1e9', '--price-per-hour', '3.6e6']) == 0
    out = capsys.readouterr().out
    assert out.count('skipped, up to date') == 8 and '[9/10] train-2 (resuming)' in out, out
    s2 = json.loads((work/'run-2'/'summary.json').read_text())
    assert s2['resumed_from'] == 10 and s2['steps'] == 10
    argv = json.loads((work/'.legalnb-run'/'train-2.json').read_text())['argv']
    assert argv[argv.index('--init-from') + 1] == str(work/'run'/'model') and str(work/'split-2') in argv
    ev = json.loads((work/'.legalnb-run'/'evaluate.json').read_text())['argv']
    assert ev[0] == str(work/'run-2')
    assert '| train-2 | `run-2/` | 10 steps' in (work/'report.md').read_text(), 'steps of the resumed process'
    held = set(json.loads((work/'corpus'/'manifest.json').read_text())['heldout_celex'])
    m2 = json.loads((work/'corpus-2'/'manifest.json').read_text())
    assert m2['tokenizer_sha256'] == json.loads((work/'corpus'/'manifest.json').read_text())['tokenizer_sha256']
    trained = {json.loads(l)['celex'] for l in (work/'selected-2.jsonl').read_text().splitlines()} - set(m2['heldout_celex'])
    assert not trained & held, 'no act held out by the first corpus is trained on in the second stage'
    assert set(m2['heldout_celex']) <= held and m2['heldout_celex'], 'and none the first run trained on is held out'
    ck = json.loads((work/'run-2'/'checkpoints'/'step-00000020'/'config.json').read_text())['config']
    assert (ck['init_from'], ck['lr'], ck['batch_size']) == (str(work/'run'/'model'), 3e-4, 2), 'its own values'

def test_the_estimate_before_training_prices_a_batch_schedule():
    from legalnb.run import training_estimate
    from legalnb.train import TrainConfig
    cfg = TrainConfig(batch_size=2, batch_schedule='0:8,10:2', max_steps=20, device='cpu', dim=16, num_layers=1,
                      num_frequencies=4)
    e = training_estimate(cfg, 32, 300, 2.5)
    assert (e.steps, e.sequences, e.tokens) == (20, 2 * (10 * 8 + 10 * 2), 2 * (10 * 8 + 10 * 2) * 32)

def test_a_native_second_stage_of_the_top_documents_has_no_token_budget():
    "stage2: {select: {top: 5}}: select-2 takes the 5 best documents, with no --target-tokens (2B when neither is set)."
    from legalnb.commands import command_flags
    from legalnb.run import build_stages, plan_of
    stages, _ = build_stages(plan_of({'input': ['formex'], 'out': 'work', 'stage2': {'select': {'top': 5}}}))
    select2 = next(s for s in stages if s.name == 'select-2')
    assert '--target-tokens' not in select2.argv and select2.argv[-2:] == ['--top', '5'], select2.argv
    assert command_flags('select').parse_args(select2.argv).top == 5
    stages, _ = build_stages(plan_of({'input': ['formex'], 'out': 'work', 'stage2': {}}))
    assert next(s for s in stages if s.name == 'select-2').argv[-2:] == ['--target-tokens', '2000000000']

def test_a_plans_select_section_keeps_languages_types_and_dates(tmp_path):
    "select: {languages, types, since, until} in a YAML plan (issue 38): the keys are legalnb select's flags, typed."
    from datetime import date
    from legalnb.run import build_stages, plan_of
    plan = yaml.safe_load('input: [formex]\nout: work\nselect:\n  languages: [en, de]\n  types: regulation,directive\n'
                          '  since: 2015-01-01\n  until: 2020-12-31\n  top: 10\nstage2: {select: {languages: fr}}')
    stages, _ = build_stages(plan_of(plan))
    sel, sel2 = (next(s for s in stages if s.name == n) for n in ('select', 'select-2'))
    assert sel.argv[sel.argv.index('--languages'):][:3] == ['--languages', 'en', 'de'], sel.argv
    got = sel.settings
    assert (got['languages'], got['types'], got['since'], got['until'], got['top']) == (
        [['en'], ['de']], [['regulation', 'directive']], date(2015, 1, 1), date(2020, 12, 31), 10)
    assert sel2.settings['languages'] == [['fr']]
    with pytest.raises(Exception, match="select.langs: `legalnb select` has no flag --langs"):
        build_stages(plan_of({'input': ['formex'], 'out': 'work', 'select': {'langs': ['en']}}))
    with pytest.raises(Exception, match="select.since: expected a date as yyyy-mm-dd, such as 2015-01-01, got '2015'"):
        build_stages(plan_of({'input': ['formex'], 'out': 'work', 'select': {'since': 2015}}))
    from legalnb.run import selection_result   # report.md's line for the select stage names the filters
    from legalnb.scoring import SelectConfig, select_documents, synthetic_documents
    from legalnb.sources import write_jsonl
    write_jsonl((d.to_json() for d in synthetic_documents(40, seed=3)), tmp_path/'parsed.jsonl')
    r = select_documents(SelectConfig(tmp_path/'parsed.jsonl', tmp_path/'selected.jsonl', None, top=5, languages='en',
                         since='2010-01-01', report=tmp_path/'selection.json', near_dup=0, num_proc=1))
    c = r['counters']
    assert selection_result(tmp_path) == (f'5 documents kept; only --languages en --since 2010-01-01 (dropped: language '
                                          f'{c["dropped.language"]}, undated {c["dropped.undated"]}, before since '
                                          f'{c["dropped.before_since"]})') and c['dropped.language'] > 0

def test_a_hugging_face_second_stage_finetunes_run_final_on_the_top_documents(sample, tmp_path, capsys):
    "stage2 with an HF model: select-2 (top), build-corpus-2 in the model's tokenizer, finetune-2 from run/final; "
    "one question on a terminal, the budget guard's stop and --resume, then every stage up to date."
    from legalnb.hf import build_tiny_model
    model, work, local = build_tiny_model(tmp_path/'llama'), tmp_path/'work', tmp_path/'local'
    plan = tmp_path/'plan.yaml'
    write = lambda steps: plan.write_text(yaml.safe_dump({'input': [str(sample)], 'out': str(work), 'model': str(model),
        'stage2': {'select': {'top': 10}, 'finetune': {'max_steps': steps, 'logging_steps': 1, 'lr': 1e-4}}}))
    argv = ['run', str(plan), '--select.target-tokens', '1M', '--build-corpus.seq-len', '32', '--build-corpus.shards', '2', '--build-corpus.val-docs', '0.1',
            '--finetune.force-single', '--finetune.max-steps', '2', '--finetune.batch-size', '2', '--finetune.grad-accum', '1', '--finetune.workers', '0',
            '--evaluate.citations', '10', '--evaluate.samples', '1', '--evaluate.rouge', '2', '--evaluate.device', 'cpu', '--stage-to', str(local)]
    write(2)
    rc, out = _on_a_terminal(argv, 'y', tmp_path)
    assert rc == 0 and out.count('[y/N]') == 1 and '[8/9] finetune-2' in out, out
    assert f"finetune-2: from {work/'run'/'final'} (the first run's weights)" in out, out
    rec = lambda name: json.loads((work/'.legalnb-run'/f'{name}.json').read_text())['argv']
    f2 = rec('finetune-2')
    assert (f2[f2.index('--model') + 1], f2[f2.index('--data') + 1], f2[f2.index('--lr') + 1]) == (
        str(work/'run'/'final'), str(local/'corpus-2'), '0.0001'), 'run/final, the staged corpus-2, its own lr'
    assert '--target-tokens' not in rec('select-2') and len((work/'selected-2.jsonl').read_text().splitlines()) <= 10
    assert rec('evaluate')[0] == str(work/'run-2') and (work/'run-2'/'final').is_dir()
    m1, m2 = (json.loads((work/c/'manifest.json').read_text()) for c in ('corpus', 'corpus-2'))
    assert m2['tokenizer_sha256'] == m1['tokenizer_sha256'] and m2['seq_len'] == m1['seq_len'] == 32
    trained = {json.loads(l)['celex'] for l in (work/'selected-2.jsonl').read_text().splitlines()}
    assert not (trained - set(m2['heldout_celex'])) & set(m1['heldout_celex']), \
        'no act held out by the first corpus is trained on in the second stage'
    write(4)   # its own max_steps changed: finetune-2 runs again, and the budget guard stops it
    budget = ['--yes', '--price-per-hour', '3.6e6', '--max-cost']
    assert main([*argv, *budget, '1']) == 3
    out = capsys.readouterr().out
    assert out.count('skipped, up to date') == 7 and 'stopped cleanly at step 2 of 4 (50%)' in out, out
    assert main([*argv, *budget, '1e9', '--resume']) == 0
    out = capsys.readouterr().out
    assert '[8/9] finetune-2 (resuming)' in out and 'fine-tuning not started' not in out, out
    s2 = json.loads((work/'run-2'/'finetune.json').read_text())
    assert s2['steps'] == 4 and s2['resumed_from'] == 'checkpoint-2', s2
    assert '| finetune-2 | `run-2/` | 4 steps from the weights of run/final' in (work/'report.md').read_text()
    assert main([*argv, '--yes']) == 0 and capsys.readouterr().out.count('skipped, up to date') == 9


def test_each_command_parser_is_built_once_in_a_run(monkeypatch, tmp_path):
    "Planning a run reads every stage's flags, checks them and resolves the training config: each command's parser is "
    "built once for all of it (it was up to five times for `legalnb train`)."
    from collections import Counter
    from legalnb import commands, evaluate, hf, options, run, train
    for cached in (commands.command_flags, options._parser_of, train.train_parser, hf.finetune_parser, evaluate.evaluate_parser,
                   run.run_parser):
        cached.cache_clear()
    built, real = Counter(), options.command_parser
    def counting(func, prog, *args, **kwargs):
        built[prog] += 1
        return real(func, prog, *args, **kwargs)
    for module in (options, evaluate, hf, run, train): monkeypatch.setattr(module, 'command_parser', counting)
    stages, top = run.build_stages(run.plan_of({'input': ['formex'], 'out': str(tmp_path/'work'), 'baseline': 'gpt'}))
    run.check_plan(stages, top)
    train.config_from_args(next(s for s in stages if s.name == 'train').argv)
    assert built == Counter({f'legalnb {c}': 1 for c in ('parse', 'select', 'build-corpus', 'split', 'train', 'evaluate')})

def test_a_plan_that_starts_from_a_download_stage(sample, tmp_path, capsys):
    "A `download:` section fetches the acts (from a local stand-in for CELLAR) before parse; what could not be "
    "fetched is one line and the run goes on; a second run skips the download."
    from cellar_server import Cellar
    work, plan = tmp_path/'work', tmp_path/'plan.yaml'
    with Cellar() as cellar:
        plan.write_text(yaml.safe_dump({'input': str(sample), 'out': str(work), 'download': {
            'celex': ['32011R1319', '32016R0679', '32099R9999'], 'languages': ['en'], 'sparql': cellar.sparql,
            'resource': cellar.resource, 'backoff': 0.01}}))
        assert main(['run', str(plan), *TINY]) == 0
        printed = capsys.readouterr().out
        assert '[1/7] download' in printed and f'what could not be fetched is listed in {work/"download"/"download.json"}' \
            in printed and 'failed: 32099R9999 : not in CELLAR' in printed
        docs = {d['celex']: d for d in map(json.loads, (work/'parsed.jsonl').read_text().splitlines())}
        assert docs['32011R1319']['cellar'].startswith('http://publications.europa.eu/resource/cellar/')
        assert sum('cellar' in d for d in docs.values()) == 2, 'the sample has no CELLAR URI'
        chosen = [json.loads(l) for l in (work/'selected.jsonl').read_text().splitlines()]
        assert {d['celex'] for d in chosen if 'cellar' in d} == {'32011R1319', '32016R0679'}, 'carried to the selection'
        assert main(['run', str(plan), *TINY]) == 0
        assert 'download: skipped, up to date' in capsys.readouterr().out
        assert len([1 for _, m, *_ in cellar.log if m == 'GET']) == 2, 'nothing fetched again'
    plan.write_text(yaml.safe_dump({'out': str(tmp_path/'w2')}))
    assert main(['run', str(plan), *TINY]) == 2
    assert 'or a download: section' in capsys.readouterr().err
