"""Sources mixed by weight, end to end: `legalnb build-corpus --mix` from a JSONL file and a `save_to_disk` folder, a
tiny native model trained on the mixed corpus (its batches take each source's share, its resume is exact), the
Hugging Face path on a mixed corpus, a `mix:` plan section, and bad sources refused in one line."""
import io, json, os, time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch

from legalnb.cli import main
from legalnb.data import PretokenizedDataset, source_groups
from legalnb.sample import sample_general, write_sample
from legalnb.sources import parse_documents

SHARES = {'general': 0.1, 'disk': 0.05}


def cli(*argv) -> tuple[int, str, str]:
    "`legalnb ARGV` in this process: exit code, stdout, stderr."
    with redirect_stdout(out := io.StringIO()), redirect_stderr(err := io.StringIO()):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def corpus_args(d: Path, out: Path, *extra) -> list:
    return ['build-corpus', d/'sample.jsonl', '--out', out, '--seq-len', 31, '--shards', 2, '--val-docs', 0.2,
            '--val-min-acts', 3, '--no-progress', '--mix', f'general={d/"general.jsonl"}:0.1',
            '--mix', f'disk={d/"disk"}:0.05', '--mix-heldout', 200, *extra]


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    "The Formex sample as a selection, general text as JSONL and as a save_to_disk folder, a mixed corpus and its split."
    import datasets
    d = tmp_path_factory.mktemp('mix')
    write_sample(d/'formex', docs=40); parse_documents([d/'formex'], d/'sample.jsonl', progress=False)
    texts = sample_general(400, seed=3)
    (d/'general.jsonl').write_text(''.join(json.dumps(dict(text=t, lang=l, id=f'g{i}')) + '\n'
                                           for i, (t, l) in enumerate(texts)))
    datasets.Dataset.from_dict(dict(text=[t for t, _ in texts[::-1]])).save_to_disk(str(d/'disk'))
    code, out, err = cli(*corpus_args(d, d/'corpus', '--train-tokenizer', 300))
    assert code == 0, err
    assert cli('split', d/'corpus', '--out', d/'split')[0] == 0
    return d, out


def test_build_corpus_mix_manifest_heldout_and_summary(work):
    d, out = work
    m = json.loads((d/'corpus'/'manifest.json').read_text())
    legal, total = m['rows'], m['rows'] + sum(x['rows'] for x in m['mix'])
    assert [x['name'] for x in m['mix']] == ['general', 'disk']
    for x in m['mix']:
        assert abs(x['realised_share'] - SHARES[x['name']]) < 0.01 and x['asked_share'] == SHARES[x['name']]
        assert x['tokens'] == x['rows'] * 32 and x['realised_share'] == round(x['rows'] / total, 6)
        assert x['origin'] == str(d/('general.jsonl' if x['name'] == 'general' else 'disk'))
        assert sum(s['rows'] for s in x['shards']) == x['rows'] and all((d/'corpus'/s['file']).is_file() for s in x['shards'])
        h = x['heldout']
        assert h['file'] == f"mix/{x['name']}/heldout.jsonl" and h['tokens'] >= 200 and h['documents'] >= 1
        lines = [json.loads(l) for l in (d/'corpus'/h['file']).read_text().splitlines()]
        assert len(lines) == h['documents'] and all(set(r) == {'text', 'lang', 'id'} for r in lines)
        assert f"mix {x['name']}: {x['origin']}: {x['tokens']:,} tokens" in out
        assert f"asked {x['asked_share']:.1%} of the training tokens, realised {x['realised_share']:.2%}" in out
    general = [json.loads(l) for l in (d/'general.jsonl').read_text().splitlines()]
    held = [json.loads(l) for l in (d/'corpus'/'mix'/'general'/'heldout.jsonl').read_text().splitlines()]
    assert held == [dict(text=general[i]['text'], lang=general[i]['lang'], id=general[i]['id'])
                    for i in m['mix'][0]['heldout']['held_records']], 'a seeded sample of the source, in its order'
    code, again, _ = cli(*corpus_args(d, d/'corpus', '--train-tokenizer', 300))
    assert code == 0 and again.startswith(f"{d/'corpus'} is up to date"), again
    code, vout, _ = cli('validate', d/'corpus')
    assert code == 0 and f'sequences        {total:,}' in vout, 'validate reads the mixed shards too'


def test_realised_shares_of_a_native_run_and_exact_resume(work, tmp_path):
    "A tiny model trains on the mixed split; the rows its batches take hold each share within 1pp; resume is exact."
    from legalnb.train import Dist, config_from_args, train, train_loader
    d, _ = work
    args = ['--data', d/'split', '--model', 'gpt', '--dim', 16, '--num-layers', 1, '--model-overrides', 'num_heads=2',
            '--batch-size', 8, '--grad-accum', 2, '--max-steps', 12, '--warmup-steps', 2, '--lr', 3e-3, '--save-every', 6,
            '--eval-every', 6, '--eval-batches', 1, '--num-workers', 0, '--seed', 5, '--device', 'cpu', '--no-progress']
    cfg = config_from_args([str(a) for a in args + ['--out', tmp_path/'straight']])
    train(cfg)
    ds = PretokenizedDataset(d/'split'/'train', doc_starts=True)
    assert list(ds.sources) == ['legal', 'general', 'disk'] and source_groups(ds) == list(ds.sources.values())
    sampler = train_loader(ds, cfg, Dist(0, 1, 0, torch.device('cpu'))).sampler
    assert sampler.groups == source_groups(ds), 'the trainer interleaves the sources by weight'
    rows = np.concatenate(list(sampler.batches(0, 12 * 2)))   # every micro-batch of the run's 12 steps
    which = np.searchsorted(np.cumsum(source_groups(ds))[:-1], rows, side='right')
    for k, name in ((1, 'general'), (2, 'disk')):
        assert abs((which == k).mean() - SHARES[name]) < 0.01, (name, (which == k).mean())

    class StopAt6:
        def should_stop(self, r): return 'budget' if r['step'] >= 6 else None
    stopped = config_from_args([str(a) for a in args + ['--out', tmp_path/'resumed', '--log-every', 6]])
    assert train(stopped, callbacks=[StopAt6()])['stopped'] == 'budget'
    train(config_from_args([str(a) for a in args + ['--out', tmp_path/'resumed', '--log-every', 6, '--resume']]))
    a = torch.load(tmp_path/'straight'/'checkpoints'/'step-00000012'/'model.pt')
    b = torch.load(tmp_path/'resumed'/'checkpoints'/'step-00000012'/'model.pt')
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), 'resumed = uninterrupted, bit for bit'


def test_killed_build_resumes_to_the_same_bytes(work, tmp_path):
    "A build with --mix stopped after its general source's first shard finishes with the uninterrupted build's bytes."
    from legalnb.corpus import CorpusConfig, build_corpus
    d, _ = work
    kw = dict(seq_len=31, shards=2, val_docs=0.2, val_min_acts=3, progress=False, tokenizer=d/'corpus'/'tokenizer.json',
              mix=[f'general={d/"general.jsonl"}:0.1', f'disk={d/"disk"}:0.05'], mix_heldout=200)
    full = build_corpus(CorpusConfig(d/'sample.jsonl', tmp_path/'full', **kw))
    def stop(rec):
        if rec['file'].startswith('mix/general/'): raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt): build_corpus(CorpusConfig(d/'sample.jsonl', tmp_path/'cut', **kw), on_shard=stop)
    assert (tmp_path/'cut'/'manifest.partial.json').is_file() and not (tmp_path/'cut'/'manifest.json').exists()
    for half in ('mix/general/.general_00001.npy.x1.tmp', 'mix/general/doc_starts/.general_00001.npy.x2.tmp',
                 'mix/disk/.heldout.jsonl.x3.tmp'):   # what a SIGKILL leaves mid-write
        (tmp_path/'cut'/half).parent.mkdir(parents=True, exist_ok=True); (tmp_path/'cut'/half).write_bytes(b'half')
    assert build_corpus(CorpusConfig(d/'sample.jsonl', tmp_path/'cut', **kw)) == full
    files = lambda p: {q.relative_to(p): q.read_bytes() for q in sorted(p.rglob('*')) if q.is_file()}
    assert files(tmp_path/'cut') == files(tmp_path/'full')


@pytest.mark.parametrize('mix, expect', [
    ('general=nothing.jsonl:0.1', '--mix general: nothing.jsonl: no such file or folder'),
    ('general=general.jsonl:1.2', '--mix general=general.jsonl:1.2: the share must be between 0 and 1'),
    ('general=general.jsonl', 'expected NAME=PATH:SHARE'),
    ('general=notes.txt:0.1', '--mix general: notes.txt has an unknown format (.txt)'),
    ('general=body.jsonl:0.1', '--mix general: body.jsonl has no "text" column (it has body)'),
])
def test_bad_sources_are_one_line_and_write_nothing(work, tmp_path, monkeypatch, mix, expect):
    d, _ = work
    monkeypatch.chdir(d)
    (d/'notes.txt').write_text('hello\n'); (d/'body.jsonl').write_text('{"body": "x"}\n')
    code, out, err = cli('build-corpus', 'sample.jsonl', '--out', tmp_path/'c', '--train-tokenizer', 300, '--mix', mix,
                         '--no-progress')
    assert code == 2 and len(err.splitlines()) == 1 and expect in err, err
    assert not (tmp_path/'c').exists()


def test_duplicate_names_and_shares_summing_to_one_are_refused(work, tmp_path):
    d, _ = work
    g = f'general={d/"general.jsonl"}'
    for mix, expect in ([f'{g}:0.1', f'{g}:0.2'], '--mix general: two sources have this name'), \
                       ([f'{g}:0.6', f'disk={d/"disk"}:0.4'], 'the shares sum to 1'):
        code, _, err = cli('build-corpus', d/'sample.jsonl', '--out', tmp_path/'c', '--train-tokenizer', 300,
                           '--mix', *mix, '--no-progress')
        assert code == 2 and expect in err and len(err.splitlines()) == 1


def test_finetune_trains_on_a_mixed_corpus_in_weighted_order(work, tmp_path):
    "The Hugging Face path: a tiny Llama continues pretraining on a mixed corpus built with its tokenizer."
    from torch.utils.data import Subset
    from legalnb.hf import CausalLMShards, build_tiny_model, training_rows
    d, _ = work
    model = build_tiny_model(tmp_path/'model', 'llama')
    assert cli(*corpus_args(d, tmp_path/'corpus', '--tokenizer', model, '--seq-len', 63))[0] == 0
    shards = CausalLMShards(tmp_path/'corpus')
    train, evald, where = training_rows(tmp_path/'corpus', shards, 0.05)
    legal = shards.rows.sources['legal']
    assert isinstance(train, Subset) and sorted(train.indices) == list(range(len(shards))) and 'val/' in where
    first = np.array(train.indices[:40])
    assert abs((first >= legal).mean() - 0.15) <= 0.03, 'every stretch holds the sources\' shares'
    code, out, err = cli('finetune', '--model', model, '--data', tmp_path/'corpus', '--out', tmp_path/'run',
                         '--max-steps', 2, '--batch-size', 2, '--grad-accum', 1, '--workers', 0, '--force-single')
    assert code == 0, err
    s = json.loads((tmp_path/'run'/'finetune.json').read_text())
    assert s['rows'] == len(shards) and s['steps'] == 2 and s['eval'].endswith('rows of val/ (held-out acts)')


def test_a_plan_mix_section_becomes_build_corpus_flags(tmp_path):
    from legalnb.run import build_stages, read_plan, write_plan
    plan = tmp_path/'plan.yaml'
    plan.write_text('input: [formex]\nout: work\nmix:\n  general: {path: gen.jsonl, share: 0.05}\n  web: web/:0.02\n')
    stages, _ = build_stages(read_plan(plan))
    b = next(s for s in stages if s.name == 'build-corpus')
    assert b.settings['mix'] == [f'general={tmp_path/"gen.jsonl"}:0.05', f'web={tmp_path/"web"}:0.02']
    assert '# mix:' in write_plan() and 'build-corpus.mix_languages: match' in write_plan()
    plan.write_text('input: [formex]\nout: work\nbuild-corpus: {mix_languages: match}\nmix:\n  general: g.jsonl:0.05\n')
    stages, _ = build_stages(read_plan(plan))
    assert next(s for s in stages if s.name == 'build-corpus').config.mix_languages == 'match'
    for text, expect in (('mix:\n  general: {path: g.jsonl, weight: 0.05}\n', 'mix.general.weight: unknown'),
                         ('mix:\n  general: {path: g.jsonl}\n', 'mix.general: no share:'),
                         ('mix:\n  general: g.jsonl:2\n', 'mix.general: --mix general=')):
        plan.write_text('input: [formex]\nout: work\n' + text)
        with pytest.raises(Exception, match=expect.replace('.', r'\.')): build_stages(read_plan(plan))


def test_split_by_rows_keeps_the_mixed_rows_on_the_training_side(work, tmp_path):
    "Without its held-out acts, a mixed corpus's val/ is cut from the legal rows only; train/ keeps every mixed row."
    from legalnb.data import split
    d, _ = work
    corpus = PretokenizedDataset(d/'corpus')
    info = split(d/'corpus', tmp_path/'rows', val_ratio=0.1, by='rows')
    train, val = PretokenizedDataset(tmp_path/'rows'/'train'), PretokenizedDataset(tmp_path/'rows'/'val')
    assert list(val.sources) == ['legal'] and info['mix'] == {'general': corpus.sources['general'],
                                                              'disk': corpus.sources['disk']}
    assert train.sources == dict(corpus.sources, legal=corpus.sources['legal'] - len(val))


def test_a_language_sorted_source_gives_every_language_its_share(work, tmp_path):
    """Replay drawn from the whole source: sorted by language, every language gets its share in training and held out;
    with --mix-languages match each legal language gets general text in its own language, within a point of asked."""
    d, _ = work
    recs = sorted((json.loads(l) for l in (d/'general.jsonl').read_text().splitlines()), key=lambda r: r['lang'])
    src = tmp_path/'sorted.jsonl'
    src.write_text(''.join(json.dumps(r) + '\n' for r in recs))
    chars = {l: sum(len(r['text']) for r in recs if r['lang'] == l) for l in ('en', 'fr')}
    base = ['build-corpus', d/'sample.jsonl', '--tokenizer', d/'corpus'/'tokenizer.json', '--seq-len', 31, '--shards', 1,
            '--no-progress', '--mix', f'general={src}:0.1', '--mix-heldout', 1500]
    code, out, err = cli(*base, '--out', tmp_path/'c')
    assert code == 0, err
    x = json.loads((tmp_path/'c'/'manifest.json').read_text())['mix'][0]
    for lang in ('en', 'fr'):   # the source's own proportions (by characters: within a few points)
        assert abs(x['tokens_per_lang'][lang] / x['tokens'] - chars[lang] / sum(chars.values())) < 0.05, x['tokens_per_lang']
        assert abs(x['languages'][lang]['realised_share'] - x['languages'][lang]['asked_share']) < 0.01
    assert set(x['heldout']['languages']) == {'en', 'fr'}, 'the held-out slice is a sample of the whole source'
    assert 'languages (source), asked -> realised: ' in out and '; held out: en ' in out
    code, out, err = cli(*base, '--out', tmp_path/'m', '--mix-languages', 'match')
    assert code == 0, err
    m = json.loads((tmp_path/'m'/'manifest.json').read_text())
    x, lacking = m['mix'][0], sorted(set(m['tokens_per_lang']) - {'en', 'fr'})
    assert x['languages_from'] == 'match' and set(x['languages']) == set(m['tokens_per_lang'])
    for lang, v in x['languages'].items():
        assert v['asked_share'] == round(0.1 * m['tokens_per_lang'][lang] / m['tokens'], 6), lang
        assert abs(v['realised_share'] - v['asked_share']) < 0.01 if lang in ('en', 'fr') else v['realised_share'] == 0
    assert err.splitlines() == [f'--mix general: {src} has no text in {", ".join(lacking)} '
                                f'({sum(x["languages"][l]["asked_share"] for l in lacking):.2%} of the training tokens '
                                'asked); those languages get no general text'], err


def test_unbounded_mixes_and_odd_sources_are_refused_in_one_line(work, tmp_path, capfd):
    """Shares summing to 0.999999999, a source read hundreds of times over, / as a source, a FIFO, a broken JSONL line:
    each one line (none from datasets), exit 2, nothing written; a record of any size is cut in the held-out slice."""
    d, _ = work
    g, tok = d/'general.jsonl', ['--tokenizer', d/'corpus'/'tokenizer.json']
    (tmp_path/'tiny.jsonl').write_text('{"text": "one short line"}\n{"text": "and another"}\n')
    os.mkfifo(tmp_path/'pipe.jsonl')
    (tmp_path/'broken.jsonl').write_text('{"text": "a"}\n{"text": "b"\n')
    for mix, expect in (([f'broken={tmp_path/"broken.jsonl"}:0.1'], 'cannot be read at record'),
                        ([f'pipe={tmp_path/"pipe.jsonl"}:0.1'], 'pipe.jsonl is a FIFO (named pipe)'),
                        # below: where these are not refused they run for hours (the cases above fail first)
                        ([f'tiny={tmp_path/"tiny.jsonl"}:0.5'], 'is too small for its share'),
                        (['root=/:0.1'], '--mix root: / holds'),
                        ([f'a={g}:0.5', f'b={g}:0.499999999'], 'the shares sum to 1; they may sum to 0.9 at most')):
        t0 = time.perf_counter()
        code, _, err = cli('build-corpus', d/'sample.jsonl', '--out', tmp_path/'c', *tok, '--seq-len', 31, '--shards', 1,
                           '--mix-heldout', 0, '--no-progress', '--mix', *mix)
        err += capfd.readouterr().err   # what a library writes to the process's stderr itself
        assert code == 2 and len(err.splitlines()) == 1 and expect in err, (mix, err)
        assert not (tmp_path/'c').exists() and time.perf_counter() - t0 < 60, mix
    (tmp_path/'big.jsonl').write_text(''.join(json.dumps(dict(text=f'record {i} ' + 'word ' * 20_000)) + '\n'
                                              for i in range(6)))
    code, _, err = cli('build-corpus', d/'sample.jsonl', '--out', tmp_path/'big', *tok, '--seq-len', 31, '--shards', 1,
                       '--max-chars', 1000, '--mix-heldout', 500, '--no-progress', '--mix', f'big={tmp_path/"big.jsonl"}:0.05')
    assert code == 0, err
    held = [json.loads(l) for l in (tmp_path/'big'/'mix'/'big'/'heldout.jsonl').read_text().splitlines()]
    assert held and all(len(r['text']) <= 1000 for r in held), 'a held-out record is cut as the legal text is'
