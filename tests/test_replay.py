"""Replay shown in seconds: a tiny GPT trained first on general text (stage 1), then on the legal sample twice from
those weights with the same settings and seed, once on law alone and once with 10% of the general text mixed back in
(`build-corpus --mix`). `legalnb evaluate --against` scores each arm against stage 1 on general text that no stage
trained on and on held-out acts; `compare_evaluations` sets the two arms' saved evaluations against each other. Law
alone forgets, replay forgets much less (the paired interval clear of zero), both gain on law. `bench/cpt.py` runs the
same comparison on the real SmolLM2-135M."""
import io, json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

from legalnb.against import compare_evaluations, reference_of
from legalnb.cli import main
from legalnb.sample import sample_general, write_sample
from legalnb.sources import parse_documents

SEED, SHARE = 0, 0.1        # one seed for the data, the models and the bootstrap; replay's share of the training tokens
HELD_GENERAL = 100          # general documents no stage trains on: forgetting is measured there
SHAPE = ['--model', 'gpt', '--dim', 32, '--num-layers', 2, '--model-overrides', 'num_heads=2']
STEPS = {'stage1': 150, 'stage2': 60}
QUICK = ['--citations', 0, '--samples', 0, '--rouge', 0, '--device', 'cpu', '--no-progress']


def cli(*argv) -> str:
    "stdout of `legalnb ARGV` run in this process, which must succeed."
    with redirect_stdout(out := io.StringIO()), redirect_stderr(err := io.StringIO()):
        code = main([str(a) for a in argv])
    assert code == 0, err.getvalue()[-2000:]
    return out.getvalue()


def write_jsonl(path: Path, texts: list[tuple[str, str]], first: int = 0):
    path.write_text(''.join(json.dumps(dict(text=t, lang=l, id=f'g{i}'), ensure_ascii=False) + '\n'
                            for i, (t, l) in enumerate(texts, first)), encoding='utf-8')


def train(d: Path, data: str, out: str, steps: int, *extra):
    "`legalnb train`: the same settings and seed for every stage and arm; only the data and the start differ."
    cli('train', '--data', d/data, '--out', d/out, '--max-steps', steps, *SHAPE, '--batch-size', 8, '--lr', 3e-3,
        '--warmup-steps', 5, '--eval-every', 0, '--eval-batches', 1, '--save-every', 1000, '--log-every', 1000,
        '--num-workers', 0, '--seed', SEED, '--device', 'cpu', '--cpu-threads', 1, '--no-progress', *extra)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    "Stage 1 on general text; stage 2 on law, without and with replay; each compared with stage 1, and with each other."
    d, threads = tmp_path_factory.mktemp('replay'), torch.get_num_threads()
    general = sample_general(700, seed=SEED)   # everyday sentences in English and French
    write_jsonl(d/'general-heldout.jsonl', general[:HELD_GENERAL])
    write_jsonl(d/'general.jsonl', general[HELD_GENERAL:], first=HELD_GENERAL)
    write_sample(d/'formex', docs=40, seed=SEED); parse_documents([d/'formex'], d/'law.jsonl', progress=False)
    rows = ['--seq-len', 63, '--shards', 1, '--no-progress']
    # stage 1 "pretrains" on general text with its own tokenizer, which stage 2 keeps, as a base model's
    cli('build-corpus', d/'general.jsonl', '--out', d/'general-corpus', '--train-tokenizer', 400, *rows)
    law = ['--tokenizer', d/'general-corpus'/'tokenizer.json', '--val-docs', 0.2, '--val-min-acts', 6, *rows]
    cli('build-corpus', d/'law.jsonl', '--out', d/'law-corpus', *law)
    # the replay source is stage 1's own text; no slice of it is held out (--mix-heldout 0): stage 1 saw all of it,
    # so forgetting is measured on general-heldout.jsonl, which no build was given
    replay = ['--mix', f'general={d/"general.jsonl"}:{SHARE}', '--mix-heldout', 0]
    cli('build-corpus', d/'law.jsonl', '--out', d/'replay-corpus', *law, *replay)
    for c in ('general', 'law', 'replay'): cli('split', d/f'{c}-corpus', '--out', d/f'{c}-split')
    try:
        train(d, 'general-split', 'stage1', STEPS['stage1'])
        for arm in ('law', 'replay'):
            train(d, f'{arm}-split', arm, STEPS['stage2'], '--init-from', d/'stage1'/'model')
    finally: torch.set_num_threads(threads)   # --cpu-threads 1 set it for this process: give the next tests theirs
    score = ['--data', d/'law-corpus', '--general', d/'general-heldout.jsonl', *QUICK]
    for arm in ('law', 'replay'): cli('evaluate', d/arm, '--against', '--out', d/f'{arm}-vs-stage1', *score)
    c = {k: json.loads((d/k/'against.json').read_text()) for k in ('law-vs-stage1', 'replay-vs-stage1')}
    # the two arms against each other, from the evaluations just saved (same windows, same general documents)
    scored = {arm: json.loads((d/f'{arm}-vs-stage1'/'eval.json').read_text()) for arm in ('law', 'replay')}
    return d, c | {'replay-vs-law': compare_evaluations(scored['replay'], scored['law'])}


def test_both_arms_start_from_stage_one_and_differ_only_by_replay(runs):
    d, c = runs
    for arm in ('law', 'replay'):   # a bare --against picked stage 1: the weights --init-from started them from
        ref = c[f'{arm}-vs-stage1']['reference']['name']
        assert reference_of(d/arm) == d/'stage1'/'model' and ref == str(d/'stage1'/'model'), ref
    law, mixed = (json.loads((d/f'{k}-corpus'/'manifest.json').read_text()) for k in ('law', 'replay'))
    assert mixed['shards'] == law['shards'] and mixed['heldout_celex'] == law['heldout_celex'], 'the same legal rows'
    (m,) = mixed['mix']
    assert m['asked_share'] == SHARE and abs(m['realised_share'] - SHARE) < 0.01 and 'mix' not in law
    trained = {json.loads(l)['text'] for l in (d/'general.jsonl').read_text(encoding='utf-8').splitlines()}
    held = [json.loads(l)['text'] for l in (d/'general-heldout.jsonl').read_text(encoding='utf-8').splitlines()]
    assert len(held) == HELD_GENERAL and not trained & set(held), 'forgetting is measured on text no stage saw'


def test_law_alone_forgets_general_text(runs):
    f = runs[1]['law-vs-stage1']['forgetting']
    assert f['verdict'] == 'worse' and f['change'] > 1.0 and f['change_ci'][0] > 0.5, f   # bits per byte went up
    for lang in ('en', 'fr'):
        assert f['by_language'][lang]['verdict'] == 'worse' and f['by_language'][lang]['change_ci'][0] > 0.5, lang


def test_replay_forgets_less_with_intervals(runs):
    _, c = runs
    alone, replay = c['law-vs-stage1']['forgetting'], c['replay-vs-stage1']['forgetting']
    assert replay['change'] < alone['change'] * 2 / 3, (replay['change'], alone['change'])   # a third less at least
    assert replay['change_ci'][1] < alone['change_ci'][0], 'the two intervals are clear of each other'
    # the honest statement: both arms scored on the same general documents, the change paired document by document
    paired = c['replay-vs-law']['forgetting']
    assert paired['change'] == pytest.approx(replay['change'] - alone['change'], abs=1e-9)
    assert paired['verdict'] == 'better' and paired['change_ci'][1] < -0.3, paired
    for lang in ('en', 'fr'):
        assert paired['by_language'][lang]['verdict'] == 'better', (lang, paired['by_language'][lang])


def test_both_arms_gained_on_held_out_law(runs):
    _, c = runs
    for k in ('law-vs-stage1', 'replay-vs-stage1'):
        o = c[k]['overall']['bits_per_byte']
        assert o['verdict'] == 'better' and o['change'] < -1.0 and o['change_ci'][1] < -0.5, (k, o)
        assert c[k]['data']['acts'] >= 5 and c[k]['windows'].startswith('the same windows')
    # what replay costs on law is small beside what it saves on general text
    cost = c['replay-vs-law']['overall']['bits_per_byte']['change']
    assert abs(cost) < -c['replay-vs-law']['forgetting']['change'] / 4, cost


def test_the_replay_corpus_is_refused_as_general_text(runs, tmp_path):
    "Its source was trained on whole (--mix-heldout 0): one line that says so, instead of 'no mix sources'."
    d, _ = runs
    with redirect_stdout(io.StringIO()), redirect_stderr(err := io.StringIO()):
        code = main([str(a) for a in ('evaluate', d/'replay', '--against', '--data', d/'law-corpus', '--general',
                                      d/'replay-corpus', '--out', tmp_path/'eval', *QUICK)])
    assert code == 2 and len(err.getvalue().splitlines()) == 1, err.getvalue()
    assert 'its mix sources (general) kept no held-out slice (built with --mix-heldout 0)' in err.getvalue()
    assert not (tmp_path/'eval').exists()
