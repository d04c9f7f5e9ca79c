"""The README's continued-pretraining commands (issue 52.7), run as written on the repository's real Official Journal
fixtures: the English and French acts of a few real publications, long acts beside short ones. Only what a CPU and a
tiny model need is changed: the model folder and the general text are the test's, `finetune` runs two steps on this
one process. Shards, held-out share, evaluation size: the defaults."""
import contextlib, io, json, os, re, shlex
from pathlib import Path

import pytest

from legalnb.cli import main
from legalnb.hf import build_tiny_model
from legalnb.sample import sample_general

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = [ROOT/'tests'/'fixtures'/'formex', ROOT/'tests'/'fixtures'/'xhtml', ROOT.parent/'shared'/'fixtures'/'formex']


def readme_commands() -> list[list[str]]:
    "The commands of the README's block that steers and measures continued pretraining, as words."
    text = (ROOT/'README.md').read_text(encoding='utf-8')
    block = text.split('Continued pretraining forgets', 1)[1].split('```sh\n', 1)[1].split('```', 1)[0]
    return [shlex.split(line) for line in block.splitlines() if line.startswith('legalnb ')]


def as_here(words: list[str], d: Path) -> list[str]:
    "A README command with this test's paths: the model folder, the general text, files in `d`."
    swap = {'/models/my-7b': str(d/'model'), '/data/fineweb-2': str(d/'general.jsonl')}
    out = []
    for w in words[1:]:
        for a, b in swap.items(): w = w.replace(a, b)
        out.append(str(d/w) if w in ('parsed.jsonl', 'selected.jsonl', 'corpus', 'cpt-run') else w)
    return out


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    "parse, then the README's select, build-corpus, finetune and evaluate; each command's exit code and output."
    d = tmp_path_factory.mktemp('first-real-run')
    build_tiny_model(d/'model')
    (d/'general.jsonl').write_text(''.join(json.dumps(dict(text=t, lang=l, id=f'g{i}')) + '\n'
                                           for i, (t, l) in enumerate(sample_general(2000))), encoding='utf-8')
    said = {}
    def call(name, argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try: rc = main(argv)
            except SystemExit as e: rc = e.code
        said[name] = (rc, out.getvalue() + err.getvalue())
        return rc
    here = os.getcwd(); os.chdir(d)   # evaluate writes eval/ where it runs, as for a user
    try: _run_all(call, d)
    finally: os.chdir(here)
    return d, said


def _run_all(call, d: Path):
    assert call('parse', ['parse', *map(str, (f for f in FIXTURES if f.exists())), '--out', str(d/'parsed.jsonl')]) == 0
    for words in readme_commands():
        argv = as_here(words, d)
        if argv[0] == 'finetune': argv += ['--force-single', '--max-steps', '2', '--save-steps', '2']  # a CPU, a tiny model
        if call(argv[0], argv): break


def test_the_readme_has_the_four_steering_commands():
    assert [w[1] for w in readme_commands()] == ['select', 'build-corpus', 'finetune', 'evaluate']


def test_select_keeps_english_and_french_acts_of_the_asked_types(run):
    d, out = run
    rc, text = out['select']
    assert rc == 0, text[-3000:]
    docs = [json.loads(l) for l in (d/'selected.jsonl').read_text(encoding='utf-8').splitlines()]
    assert {x['lang'] for x in docs} == {'en', 'fr'} and {x['doc_type'] for x in docs} <= {'regulation', 'directive'}


def test_build_corpus_with_default_shards_holds_out_a_small_share_without_a_refusal(run):
    "The fixtures give ~23 rows of 3,073 tokens, one act most of them: fewer shards than the default 16, each with "
    "rows; the held-out acts are the smallest (a notice says why the floor is lowered), under one row: said."
    d, out = run
    rc, text = out['build-corpus']
    assert rc == 0, text[-3000:]
    m = json.loads((d/'corpus'/'manifest.json').read_text())
    n = len(m['shards'])
    assert 1 <= n < 16 and all(s['rows'] > 0 for s in m['shards']), m['shards']
    assert f'build-corpus: {n} shards, not up to 16: the selection gives' in text, text
    share = re.search(r'share held out: [\d.]+% of the tokens, ([\d.]+)% of the characters; asked 1%', text)
    assert share and 0 < float(share[1]) < 10, text   # long acts sit in the selection: the smallest are held out
    assert m['heldout_celex'] and (d/'corpus'/'heldout.jsonl').stat().st_size > 0
    if not m['val_shards']: assert 'the held-out acts give less than one row of 3073 tokens' in text, text
    mixed = m['mix'][0]
    assert mixed['rows'] > 0 and set(mixed['heldout']['languages']) == {'en', 'fr'}, mixed['heldout']


def test_finetune_trains_and_watches_every_source_from_step_0(run):
    d, out = run
    rc, text = out['finetune']
    assert rc == 0, text[-3000:]
    s = json.loads((d/'cpt-run'/'finetune.json').read_text())
    assert s['steps'] == 2
    evals = [json.loads(l) for l in (d/'cpt-run'/'metrics.jsonl').read_text().splitlines()]
    evals = [r for r in evals if r.get('event') == 'eval' and 'legal/bpb' in r]
    assert evals and evals[0]['step'] == 0 and 'general/bpb' in evals[0], evals[:1]


def test_evaluate_against_the_base_reports_law_and_forgetting_per_language(run):
    d, out = run
    rc, text = out['evaluate']
    assert rc == 0, text[-3000:]
    assert 'capped sample:' in text and 'general text' in text
    report = (d/'eval'/'against.md').read_text()
    for row in ('bits per byte: overall', 'bits per byte: general text lang en (forgetting)',
                'bits per byte: general text lang fr (forgetting)'):
        assert row in report, report
