"`legalnb compare` on a tiny split with a real tokenizer: table, JSON, plots, resume after an interruption, bad input."
import contextlib, io, json, math
from pathlib import Path

import pytest

from conftest import make_split, tree
from dataclasses import replace

from legalnb.compare import (PLAN, PLOTS, REPORT, RESULTS, CompareConfig, compare_main, compare_models,
                             plan_comparison, short_runs, split_bytes_per_token)
from legalnb.core import LegalnbError

TINY = ['--dim', '32', '--num-layers', '2', '--num-frequencies', '8', '--num-heads', '2']


@pytest.fixture(scope='module')
def split(tmp_path_factory) -> Path:
    "A split of the sample corpus: 30 publications, a 300-token BPE, rows of 32 tokens (tokenizer.json linked)."
    from legalnb.corpus import build_corpus_main
    from legalnb.data import split_main
    from legalnb.scoring import select_main
    from legalnb.sources import parse_main
    from legalnb.sample import sample_main
    root = tmp_path_factory.mktemp('compare')
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert not sample_main([str(root/'sample'), '--docs', '30'])
        assert not parse_main([str(root/'sample'), '--out', str(root/'parsed.jsonl')])
        assert not select_main([str(root/'parsed.jsonl'), '--out', str(root/'selected.jsonl'), '--target-tokens', '2M'])
        assert not build_corpus_main([str(root/'selected.jsonl'), '--out', str(root/'corpus'), '--seq-len', '32',
                                      '--shards', '2', '--train-tokenizer', '300', '--no-progress'])
        assert not split_main([str(root/'corpus'), '--out', str(root/'split'), '--val-ratio', '0.1'])
    return root/'split'


def run_cli(argv) -> str:
    "stdout of `legalnb compare ARGV` (exit 0 asserted)."
    with contextlib.redirect_stdout(io.StringIO()) as f: assert compare_main([str(a) for a in argv]) == 0
    return f.getvalue()


def test_compare_two_models_table_json_plots_and_a_second_call_skips(split, tmp_path):
    out = tmp_path/'cmp'
    # six evaluations: the loss at equal time lies inside both curves even when, on a loaded machine, one model's steps
    # run several times slower than the other's (with three, the slower model's first evaluation came too late)
    flags = ['--data', split, *TINY, '--budget', '12k', '--lr', '2e-3', '--eval-points', 6, '--eval-batches', 2,
             '--out', out, '--cpu-threads', 1, '--no-progress']
    printed = run_cli(flags)
    assert 'loss @ 11.8k tokens' in printed and 'tokens/s' in printed and 'peak MiB' in printed
    assert printed.count('\n| resonance') == 4 and printed.count('\n| gpt') == 4   # the table + three sweep rows
    for name in (PLAN, REPORT, RESULTS, *PLOTS): assert (out/name).is_file(), name
    for png in PLOTS: assert (out/png).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    r = json.loads((out/RESULTS).read_text())
    assert [x['name'] for x in r['runs']] == ['resonance-lr0.001', 'resonance-lr0.002', 'resonance-lr0.004',
                                              'gpt-lr0.001', 'gpt-lr0.002', 'gpt-lr0.004']
    steps = 12_000 // (8 * 32)
    assert {x['steps'] for x in r['runs']} == {steps} and r['equal_tokens'] == steps * 8 * 32
    for m in ('resonance', 'gpt'):
        row = r['models'][m]
        best = min((x for x in r['runs'] if x['model'] == m), key=lambda x: x['loss'])
        assert row['best'] == best['name'] and math.isclose(row['loss_at_tokens'], best['loss'])
        assert math.isclose(row['bpb_at_tokens'], row['loss_at_tokens'] / math.log(2) / r['bytes_per_token'])
        assert row['params'] > row['non_embedding'] > 0 and row['peak_mib'] > 0 and row['tokens_per_sec'] > 0
        assert row['loss_at_seconds'] is not None
    # the same runs see the same rows: each run's curve has an evaluation at the same steps
    assert len({tuple(p['step'] for p in x['curve']) for x in r['runs']}) == 1
    report = (out/REPORT).read_text()
    assert '## The sweep' in report and f'![held-out loss against tokens]({PLOTS[0]})' in report
    before = {k: v for k, v in tree(out).items() if k.split('/')[0].endswith(('0.001', '0.002', '0.004'))}
    again = run_cli(flags)                                         # everything finished: skipped, report rewritten
    assert again.count('done earlier, skipped') == 6
    assert {k: v for k, v in tree(out).items() if k in before} == before


class Interrupt:
    "Stop the second run at its second log record: after its first checkpoint, as a killed process would."
    def __init__(self): self.ended, self.seen = 0, 0
    def on_end(self, r): self.ended += 1
    def on_step(self, r):
        self.seen += self.ended == 1
        if self.seen == 2: raise RuntimeError('killed')


def test_an_interrupted_comparison_resumes_and_matches_an_uninterrupted_one(split, tmp_path):
    train = short_runs(lr=2e-3, eval_batches=2, cpu_threads=1, progress=False)
    def args(out, **changes): return CompareConfig(split, 'gpt', dim=32, num_layers=2, shapes=dict(num_heads=2),
                                                  budget=12_000, lr_factors=[1, 2], eval_points=3, out=out, **changes,
                                                  train=train)
    quiet = lambda *a: None
    with pytest.raises(RuntimeError, match='killed'):
        compare_models(args(tmp_path/'a'), callbacks=[Interrupt()], log=quiet)
    assert (tmp_path/'a'/'gpt-lr0.002'/'summary.json').is_file()
    assert not (tmp_path/'a'/'gpt-lr0.004'/'summary.json').exists()
    assert list((tmp_path/'a'/'gpt-lr0.004'/'checkpoints').iterdir())
    first = (tmp_path/'a'/'gpt-lr0.002'/'summary.json').read_bytes()
    with pytest.raises(LegalnbError, match='run gpt-lr0.004 was interrupted; continue it with --resume'):
        compare_models(args(tmp_path/'a'), log=quiet)
    lines = []
    resumed = compare_models(args(tmp_path/'a', resume=True), log=lines.append)
    assert lines == ['[1/2] gpt lr 0.002, 46 steps: done earlier, skipped', '[2/2] gpt lr 0.004, 46 steps (resumed)']
    assert (tmp_path/'a'/'gpt-lr0.002'/'summary.json').read_bytes() == first
    whole = compare_models(args(tmp_path/'b'), log=quiet)
    for a, b in zip(resumed['runs'], whole['runs']):   # exact resume: the same held-out losses at the same steps
        assert [(p['step'], p['loss']) for p in a['curve']] == [(p['step'], p['loss']) for p in b['curve']]


def test_flops_and_seconds_budgets_give_each_model_its_own_steps(split):
    s = CompareConfig(split, 'resonance,gpt', 'small', 32, 2, '2e10', 'flops', [1.0], 4,
                      shapes=dict(num_frequencies=8, num_heads=2), train=short_runs(lr=1e-3, eval_batches=2))
    plan = plan_comparison(s)
    for r in plan['runs']:
        assert r['steps'] == int(2e10 // (8 * 32 * plan['facts'][r['model']]['flops_per_token']))
    timed = plan_comparison(replace(s, budget=3.0, budget_kind='seconds'))
    for r in timed['runs']:
        sec = timed['facts'][r['model']]['sec_per_step']
        assert 0 < sec and r['steps'] == int(3.0 // sec)


def test_bits_per_byte_needs_the_tokenizer(split, tmp_path):
    assert 1 < split_bytes_per_token(split, 8, 2, 0) < 8
    assert split_bytes_per_token(make_split(tmp_path), 8, 2, 0) is None   # raw ids, no tokenizer.json


@pytest.mark.parametrize('flags, expect', [
    (['--models', 'resonance,bert'], "--models: unknown model 'bert'; choose from resonance, gpt"),
    (['--budget', 'lots'], "--budget: expected a number such as 2M, 5e15 or 600, got 'lots'"),
    (['--budget', '-5'], '--budget must be more than 0'),
    (['--budget', '10'], '--budget 10 tokens buys no step of resonance'),
    (['--budget-kind', 'watts'], "--budget-kind: invalid choice: 'watts'"),
    (['--lr-factors', '1', '1'], '--lr-factors: expected distinct numbers above 0'),
    (['--models', 'gpt', '--num-frequencies', '8'], '--num-frequencies: none of gpt has a field num_frequencies'),
    (['--size', 'huge'], "unknown size 'huge'"),
])
def test_bad_input_is_one_line_and_writes_nothing(split, tmp_path, flags, expect):
    out = tmp_path/'cmp'
    with pytest.raises(LegalnbError) as e:
        compare_main(['--data', str(split), *TINY[:4], *TINY[6:], '--out', str(out), *flags])
    assert expect in str(e.value) and '\n' not in str(e.value)
    assert not out.exists()


def test_out_must_be_new_or_a_comparison(split, tmp_path):
    with pytest.raises(LegalnbError, match='--data is required'): compare_models(CompareConfig(None, out=tmp_path/'x'))
    (tmp_path/'mine').mkdir(); (tmp_path/'mine'/'notes.txt').write_text('mine')
    with pytest.raises(LegalnbError, match=r'holds files legalnb did not write \(notes.txt\)'):
        compare_models(CompareConfig(split, out=tmp_path/'mine'))
    with pytest.raises(LegalnbError, match='is also an input'): compare_models(CompareConfig(split, out=split))
    assert (tmp_path/'mine'/'notes.txt').read_text() == 'mine' and not (tmp_path/'x').exists()


def test_a_diverging_learning_rate_is_a_result_not_a_crash(split, tmp_path):
    args = CompareConfig(split, 'gpt', dim=32, num_layers=2, shapes=dict(num_heads=2), budget=8000,
                         lr_factors=[1, 1e35], eval_points=2, out=tmp_path/'div',
                         train=short_runs(lr=1e-3, eval_batches=2, cpu_threads=1, progress=False))
    lines = []
    r = compare_models(args, log=lines.append)
    assert [(x['status'], x['loss'] is None) for x in r['runs']] == [('done', False), ('diverged', True)]
    assert lines[-1].startswith('  diverged: loss is nan') and r['models']['gpt']['best'] == 'gpt-lr0.001'
    again = []
    compare_models(args, log=again.append)
    assert again == ['[1/2] gpt lr 0.001, 31 steps: done earlier, skipped',
                     '[2/2] gpt lr 1e+32, 31 steps: diverged earlier, skipped']
