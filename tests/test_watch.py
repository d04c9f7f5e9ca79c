"""Watching what a continued-pretraining run forgets while it trains (issue 47): a tiny GPT trained first on general
text, then on law from those weights, without and with replay (`build-corpus --mix`). Every validation source (the
held-out acts, the mix source's held-out slice, a `--general` file) is scored from step 0, per language, into
metrics.jsonl and TensorBoard; `--max-forgetting` stops the law-only run at a checkpoint (exit 3) naming the source and
language, `--resume` continues it; the replayed run trains to the end."""
import io, json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

from legalnb.cli import main
from legalnb.metrics import read_metrics
from legalnb.sample import sample_general, write_sample
from legalnb.sources import parse_documents

SHAPE = ['--model', 'gpt', '--dim', 32, '--num-layers', 2, '--model-overrides', 'num_heads=2']
LIMIT = 1.0   # bits per byte over step 0: law alone rises ~1.5 in 10 steps here, 30% replay ~0.5


def cli(*argv, code: int = 0) -> str:
    "stdout of `legalnb ARGV` run in this process, which must exit with `code`."
    with redirect_stdout(out := io.StringIO()), redirect_stderr(err := io.StringIO()):
        got = main([str(a) for a in argv])
    assert got == code, (got, err.getvalue()[-2000:], out.getvalue()[-2000:])
    return out.getvalue()


def write_jsonl(path: Path, texts: list[tuple[str, str]], first: int = 0):
    path.write_text(''.join(json.dumps(dict(text=t, lang=l, id=f'g{i}'), ensure_ascii=False) + '\n'
                            for i, (t, l) in enumerate(texts, first)), encoding='utf-8')


def train(d: Path, data: str, out: str, steps: int, *extra, code: int = 0) -> str:
    return cli('train', '--data', d/data, '--out', d/out, '--max-steps', steps, *SHAPE, '--batch-size', 8, '--lr', 3e-3,
               '--warmup-steps', 5, '--eval-batches', 1, '--save-every', 10, '--log-every', 1000, '--num-workers', 0,
               '--seed', 0, '--device', 'cpu', '--cpu-threads', 1, '--no-progress', *extra, code=code)


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    "Stage 1 on general text (web.jsonl); a law corpus and a law + 30% web replay corpus from its tokenizer."
    d, threads = tmp_path_factory.mktemp('watch'), torch.get_num_threads()
    general = sample_general(700, seed=0)            # everyday sentences in English and French
    write_jsonl(d/'general.jsonl', general[:100])    # never trained on: what --general watches
    write_jsonl(d/'web.jsonl', general[100:], first=100)
    write_sample(d/'formex', docs=40, seed=0); parse_documents([d/'formex'], d/'law.jsonl', progress=False)
    rows = ['--seq-len', 63, '--shards', 1, '--no-progress']
    cli('build-corpus', d/'web.jsonl', '--out', d/'web-corpus', '--train-tokenizer', 400, *rows)
    law = ['--tokenizer', d/'web-corpus'/'tokenizer.json', '--val-docs', 0.2, '--val-min-acts', 6, *rows]
    cli('build-corpus', d/'law.jsonl', '--out', d/'law-corpus', *law)
    cli('build-corpus', d/'law.jsonl', '--out', d/'replay-corpus', *law, '--mix', f'web={d/"web.jsonl"}:0.3',
        '--mix-heldout', 3000)
    for c in ('web', 'law', 'replay'): cli('split', d/f'{c}-corpus', '--out', d/f'{c}-split')
    try: train(d, 'web-split', 'stage1', 150, '--eval-every', 0)
    finally: torch.set_num_threads(threads)
    yield d
    torch.set_num_threads(threads)


WATCH = ['--eval-every', 10, '--eval-tokens', 3000, '--max-forgetting', LIMIT]


def test_law_alone_is_stopped_by_the_forgetting_guard_and_resumes(work, monkeypatch):
    d = work
    monkeypatch.setenv('TENSORBOARD_LOGGING_DIR', str(d/'law'/'tb'))
    out = train(d, 'law-split', 'law', 60, '--init-from', d/'stage1'/'model', '--general', d/'general.jsonl', *WATCH,
                '--report-to', 'tensorboard', code=3)
    assert 'forgetting guard: general (all languages) bits per byte rose +' in out, out
    assert f'above --max-forgetting {LIMIT:g}' in out and 'Replay more general text' in out and '--lower' not in out
    assert 'stopped at step 10 of 60' in out and 'checkpoint' in out and 'its curve (step: bits per byte): 0: ' in out
    evals = read_metrics(d/'law'/'metrics.jsonl', 'eval')
    assert [r['step'] for r in evals] == [0, 10] and evals[0]['tokens'] == 0 and evals[1]['tokens'] == 10 * 8 * 63
    for key in ('legal/bpb', 'legal/en/bpb', 'legal/fr/bpb', 'general/bpb', 'general/en/bpb', 'general/fr/bpb'):
        assert all(key in r for r in evals), key
    assert evals[1]['general/bpb'] - evals[0]['general/bpb'] > LIMIT, 'general text forgotten'
    assert evals[1]['legal/bpb'] < evals[0]['legal/bpb'], 'law learnt'
    assert (d/'law'/'checkpoints'/'step-00000010').is_dir() and not (d/'law'/'model').exists()
    # the same curves in the tracker, from step 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(d/'law'/'tb')).Reload()
    for tag in ('val/legal/bpb', 'val/legal/fr/bpb', 'val/general/bpb', 'val/general/en/bpb'):
        assert [e.step for e in ea.Scalars(tag)] == [0, 10], tag
    assert ea.Scalars('val/general/bpb')[0].value == pytest.approx(evals[0]['general/bpb'], rel=1e-6)
    # --resume continues it (the guard loosened): the base is read back, not scored again
    out = train(d, 'law-split', 'law', 60, '--init-from', d/'stage1'/'model', '--general', d/'general.jsonl',
                '--eval-every', 10, '--eval-tokens', 3000, '--max-forgetting', 50, '--resume')
    evals = read_metrics(d/'law'/'metrics.jsonl', 'eval')
    assert [r['step'] for r in evals] == [0, 10, 20, 30, 40, 50, 60] and (d/'law'/'model').is_dir()
    assert 'rows' in evals[0] and all('rows' not in r for r in evals[1:])
    assert 'evaluation took ' in out and 'of the training time (3,000 tokens an evaluation; goal 5%)' in out


def test_replay_trains_to_the_end_watched_on_every_source(work):
    d = work
    out = train(d, 'replay-split', 'replay', 60, '--init-from', d/'stage1'/'model', '--general', d/'general.jsonl',
                *WATCH)
    assert 'forgetting guard' not in out and (d/'replay'/'model').is_dir()
    assert 'evaluation: 3,000 tokens of legal, web, general (--eval-tokens), at step 0 and every 10 steps' in out
    evals = read_metrics(d/'replay'/'metrics.jsonl', 'eval')
    assert [r['step'] for r in evals] == [0, 10, 20, 30, 40, 50, 60]
    for key in ('legal/bpb', 'web/bpb', 'web/en/bpb', 'web/fr/bpb', 'general/bpb', 'general/fr/bpb'):
        assert all(key in r for r in evals), key   # the mix source's held-out slice, by its --mix name
    rise = max(r['general/bpb'] for r in evals) - evals[0]['general/bpb']
    assert 0 < rise < LIMIT, rise
    s = json.loads((d/'replay'/'summary.json').read_text())
    assert s['eval_tokens'] == 3000 and 0 < s['eval_share'] < 1 and set(s['sources']) == {'legal', 'web', 'general'}


def test_the_guard_needs_general_text(work):
    d = work
    with redirect_stdout(io.StringIO()), redirect_stderr(err := io.StringIO()):
        code = main([str(a) for a in ('train', '--data', d/'law-split', '--out', d/'nowhere', *SHAPE,
                                      '--max-forgetting', 0.1, '--device', 'cpu', '--no-progress')])
    assert code == 2 and '--max-forgetting: no general text to watch' in err.getvalue()
    assert len(err.getvalue().strip().splitlines()) == 1 and not (d/'nowhere').exists()


# -- the same on the Hugging Face path: a tiny random Llama "pretrained" on general text by `legalnb finetune`, then
# continued on law from its final/, without and with replay
HF_LIMIT = 0.8   # law alone rises ~1.2 bits per byte in 10 steps here, 30% replay ~0.35
FT = ['--batch-size', 8, '--grad-accum', 1, '--warmup-steps', 2, '--workers', 0, '--logging-steps', 10,
      '--force-single', '--lr', 3e-3]


@pytest.fixture(scope='module')
def hf(work):
    from legalnb.hf import build_tiny_model
    d = work
    texts = [json.loads(l)['text'] for f in ('web.jsonl', 'law.jsonl') for l in (d/f).read_text().splitlines()]
    build_tiny_model(d/'base', texts=texts)
    rows = ['--seq-len', 63, '--shards', 1, '--no-progress', '--tokenizer', d/'base'/'tokenizer.json']
    cli('build-corpus', d/'web.jsonl', '--out', d/'hf-web', *rows)
    law = ['--val-docs', 0.2, '--val-min-acts', 6, *rows]
    cli('build-corpus', d/'law.jsonl', '--out', d/'hf-law', *law)
    cli('build-corpus', d/'law.jsonl', '--out', d/'hf-replay', *law, '--mix', f'web={d/"web.jsonl"}:0.3',
        '--mix-heldout', 3000)
    cli('finetune', '--model', d/'base', '--data', d/'hf-web', '--out', d/'hf-stage1', '--max-steps', 100,
        '--save-steps', 100, '--eval-share', 0, *FT)
    return d


def finetune(d: Path, data: str, out: str, *extra, code: int = 0) -> str:
    return cli('finetune', '--model', d/'hf-stage1'/'final', '--data', d/data, '--out', d/out, '--max-steps', 40,
               '--save-steps', 10, '--general', d/'general.jsonl', '--eval-tokens', 3000, *FT, *extra, code=code)


def test_finetune_law_alone_is_stopped_by_the_guard_and_resumes(hf, monkeypatch):
    d = hf
    monkeypatch.setenv('TENSORBOARD_LOGGING_DIR', str(d/'hf-law-run'/'tb'))
    out = finetune(d, 'hf-law', 'hf-law-run', '--max-forgetting', HF_LIMIT, '--report-to', 'tensorboard', code=3)
    assert 'forgetting guard: general (all languages) bits per byte rose +' in out, out
    assert 'stopped at step 10 of 40' in out and '(--resume continues)' in out
    evals = read_metrics(d/'hf-law-run'/'metrics.jsonl', 'eval')
    assert [r['step'] for r in evals] == [0, 10] and [r['tokens'] for r in evals] == [0, 10 * 8 * 63]
    for key in ('legal/bpb', 'legal/en/bpb', 'general/bpb', 'general/en/bpb', 'general/fr/bpb'):
        assert all(key in r for r in evals), key
    assert evals[1]['general/bpb'] - evals[0]['general/bpb'] > HF_LIMIT and evals[1]['legal/bpb'] < evals[0]['legal/bpb']
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(d/'hf-law-run'/'tb')).Reload()
    for tag in ('eval/legal/bpb', 'eval/legal/fr/bpb', 'eval/general/bpb', 'eval/general/en/bpb'):
        assert [e.step for e in ea.Scalars(tag)] == [0, 10], tag   # transformers names its evaluations eval/
    assert ea.Scalars('eval/general/bpb')[1].value == pytest.approx(evals[1]['general/bpb'], rel=1e-5)
    finetune(d, 'hf-law', 'hf-law-run', '--max-forgetting', 50, '--resume')
    evals = read_metrics(d/'hf-law-run'/'metrics.jsonl', 'eval')
    assert [r['step'] for r in evals] == [0, 10, 20, 30, 40] and (d/'hf-law-run'/'final').is_dir()


def test_finetune_with_replay_trains_to_the_end(hf):
    d = hf
    out = finetune(d, 'hf-replay', 'hf-replay-run', '--max-forgetting', HF_LIMIT)
    assert 'forgetting guard' not in out and 'evaluation took ' in out
    assert 'and 3,000 tokens of legal, web, general, every 10 steps and at step 0' in out, out
    evals = read_metrics(d/'hf-replay-run'/'metrics.jsonl', 'eval')
    assert [r['step'] for r in evals] == [0, 10, 20, 30, 40]
    for key in ('legal/bpb', 'web/bpb', 'web/fr/bpb', 'general/bpb'): assert all(key in r for r in evals), key
    s = json.loads((d/'hf-replay-run'/'finetune.json').read_text())
    assert s['eval_tokens'] == 3000 and 0 < s['eval_share'] < 1
