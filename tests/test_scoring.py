"End to end, CLI, failure and memory tests of the scoring stage (`legalnb select`)."
from __future__ import annotations
import json, random, subprocess, sys, tracemalloc
from dataclasses import replace
from datetime import date
from pathlib import Path

import pytest

from legalnb.cli import main
from legalnb.scoring import (ScoringRules, SelectConfig, estimate_tokens, score_document, select_documents, synthetic_documents,
                             tokenizer_counter)
from legalnb.sources import Document, write_jsonl

def write_docs(path: Path, docs) -> Path:
    write_jsonl((d.to_json() for d in docs), path)
    return path

def lines(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text(encoding='utf-8').splitlines()]

def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'legalnb.cli', *map(str, args)], capture_output=True, text=True, timeout=120)

def test_sample_parse_select_end_to_end(tmp_path):
    "The README's main job so far: a Formex sample, parsed, then selected, through the real command line."
    assert run_cli('sample', tmp_path/'sample', '--docs', 60, '--seed', 3).returncode == 0
    r = run_cli('parse', tmp_path/'sample', '--out', tmp_path/'parsed.jsonl')
    assert r.returncode == 0, r.stderr
    parsed = lines(tmp_path/'parsed.jsonl')
    target = sum(estimate_tokens(d['text']) for d in parsed) * 2 // 5
    r = run_cli('select', tmp_path/'parsed.jsonl', '--out', tmp_path/'selected.jsonl', '--target-tokens', target,
                '--report', tmp_path/'report.json')
    assert r.returncode == 0, r.stderr
    selected, report = lines(tmp_path/'selected.jsonl'), json.loads((tmp_path/'report.json').read_text())
    c = report['counters']
    assert 0 < len(selected) == c['documents.selected'] < len(parsed) == c['documents.read']
    assert all(d['score'] >= 70 and d['tokens'] == estimate_tokens(d['text']) for d in selected)
    assert {d['celex'] for d in selected} <= {d['celex'] for d in parsed}
    by_key = {(d['celex'], d['lang']): d for d in parsed}
    for d in selected:   # the selected line is the parsed document plus score and tokens, nothing else changed
        assert {k: v for k, v in d.items() if k not in ('score', 'tokens')} == by_key[d['celex'], d['lang']]
    assert c['documents.unique'] == c['documents.selected'] + c['dropped.below_threshold'] + c['dropped.budget_reached'] + c['dropped.language_quota']
    assert sum(d['tokens'] for d in selected) == c['tokens.selected'] >= target * 0.9
    assert 'language balance' in r.stdout and 'average score' in r.stdout and f'{c["documents.selected"]:,}' in r.stdout

@pytest.mark.parametrize('fraction', [0.1, 0.3, 0.6])
def test_language_shares_stay_within_tolerance(tmp_path, fraction):
    docs = list(synthetic_documents(2_500, seed=11))
    src = write_docs(tmp_path/'in.jsonl', docs)
    total = sum(estimate_tokens(d.text) for d in docs)
    report = select_documents(SelectConfig(src, tmp_path/'out.jsonl', int(total * fraction), num_proc=1))
    assert report['balance']['ok'] and not report['shortfalls']
    for lang, row in report['languages'].items():
        assert abs(row['selected_share'] - row['input_share']) <= 0.02, (lang, row['selected_share'], row['input_share'])
    assert abs(report['target_fill'] - 1) < 0.02

def test_short_language_is_reported_and_the_others_keep_their_proportions(tmp_path):
    def dull(d): return replace(d, date=None, doc_type='recommendation', subjects=['customs'], title='Act')
    docs = [dull(d) if d.lang == 'es' else d for d in synthetic_documents(2_500, seed=12)]
    src = write_docs(tmp_path/'in.jsonl', docs)
    report = select_documents(SelectConfig(src, tmp_path/'out.jsonl', sum(estimate_tokens(d.text) for d in docs) // 4, num_proc=1))
    L = report['languages']
    assert [s['lang'] for s in report['shortfalls']] == ['es'] and L['es']['tokens_selected'] == 0
    assert L['es']['short'] and report['shortfalls'][0]['wanted_tokens'] > report['shortfalls'][0]['eligible_tokens'] == 0
    rest = 1 - L['es']['input_share']
    for lang, row in L.items():
        if lang != 'es': assert abs(row['selected_share'] - row['input_share'] / rest) <= 0.02, lang
    assert abs(report['target_fill'] - 1) < 0.02    # the other languages filled the gap

def test_tie_break_is_deterministic_and_ignores_input_order(tmp_path):
    # 20 documents with the same score and size: the target takes exactly 5, always the 5 lowest CELEX numbers
    # (the same text 20 times: near-duplicate removal is off here, or it would keep one)
    docs = [Document(f'32020R{n:04d}', 'Regulation on data protection', 'x' * 4_000, 'en', date(2020, 1, 1), 'regulation') for n in range(20)]
    assert len({score_document(d).total for d in docs}) == 1
    outs = []
    for seed in range(3):
        shuffled = random.Random(seed).sample(docs, len(docs))
        select_documents(SelectConfig(write_docs(tmp_path/f'in{seed}.jsonl', shuffled), tmp_path/f'out{seed}.jsonl', 5_000, near_dup=0, num_proc=1))
        outs.append(sorted(d['celex'] for d in lines(tmp_path/f'out{seed}.jsonl')))
    assert outs[0] == outs[1] == outs[2] == [f'32020R{n:04d}' for n in range(5)]

def test_duplicates_and_defaults_are_counted(tmp_path):
    docs = list(synthetic_documents(100, seed=13))
    undated = Document('52099PC0001', 'No date', 'y' * 3_000, 'en', None, 'other')
    src = write_docs(tmp_path/'in.jsonl', docs + docs[:7] + [undated])
    c = select_documents(SelectConfig(src, tmp_path/'out.jsonl', 10**9, num_proc=1))['counters']
    assert c['documents.read'] == 108 and c['dropped.duplicate'] == 7 and c['documents.unique'] == 101
    assert c['kept.no_date'] == sum(d.date is None for d in docs) + 1
    assert c['kept.unknown_type'] == sum(d.doc_type == 'other' for d in docs) + 1

def test_rules_file_and_threshold_flag(tmp_path, capsys):
    src = write_docs(tmp_path/'in.jsonl', synthetic_documents(300, seed=14))
    (tmp_path/'rules.yaml').write_text('threshold: 150\npriority_points: 0\n')
    assert main(['select', str(src), '--out', str(tmp_path/'a.jsonl'), '--target-tokens', '1B', '--rules', str(tmp_path/'rules.yaml')]) == 0
    a = lines(tmp_path/'a.jsonl')
    assert a and min(d['score'] for d in a) >= 150
    assert main(['select', str(src), '--out', str(tmp_path/'b.jsonl'), '--target-tokens', '1B', '--rules', str(tmp_path/'rules.yaml'), '--threshold', '0']) == 0
    assert len(lines(tmp_path/'b.jsonl')) == 300
    assert 'with score >= 0' in capsys.readouterr().out

def test_real_tokenizer_counts(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    docs = list(synthetic_documents(60, seed=15))
    tok = Tokenizer(models.BPE(unk_token='[UNK]')); tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator((d.text for d in docs), trainers.BpeTrainer(vocab_size=300, special_tokens=['[UNK]']))
    tok.save(str(tmp_path/'tokenizer.json'))
    src = write_docs(tmp_path/'in.jsonl', docs)
    assert main(['select', str(src), '--out', str(tmp_path/'out.jsonl'), '--target-tokens', '1B', '--tokenizer', str(tmp_path/'tokenizer.json'),
                 '--threshold', '0', '--report', str(tmp_path/'r.json')]) == 0
    out = lines(tmp_path/'out.jsonl')
    assert len(out) == 60 and all(d['tokens'] == len(tok.encode(d['text']).ids) for d in out[:10])
    assert json.loads((tmp_path/'r.json').read_text())['token_counter'].startswith('tokenizer ')
    count = tokenizer_counter(tmp_path/'tokenizer.json')
    assert count('\n'.join([docs[0].text] * 5)) == 5 * len(tok.encode(docs[0].text).ids)
    long = '\n'.join(d.text for d in docs)          # ~500k characters: counted in pieces, count unchanged
    assert len(long) > 100_000 and count(long) == len(tok.encode(long).ids)

@pytest.mark.parametrize('prefix_space', [True, False])
def test_byte_level_counts_do_not_change_when_split(tmp_path, prefix_space):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    docs = list(synthetic_documents(40, seed=18))
    tok = Tokenizer(models.BPE()); tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tok.train_from_iterator((d.text for d in docs), trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path/'tokenizer.json'))
    text = '\n'.join(d.text for d in docs)
    assert len(text) > 100_000 and tokenizer_counter(tmp_path/'tokenizer.json')(text) == len(tok.encode(text).ids)

BAD = {  # name: (file bytes or None for a missing file, extra args, expected words in the one error line)
    'missing':      (None, [], 'no such file'),
    'empty':        (b'\n\n', [], 'no documents (the file is empty)'),
    'not json':     (b'{"celex": "a", "lang": "en", "text": "ok"}\n{oops}\n', ['--strict'], 'line 2: not JSON'),
    'no text':      (b'{"celex": "a", "lang": "en", "text": "ok"}\n{"celex": "b", "lang": "en"}\n', ['--strict'], 'line 2: missing or empty "text"'),
    'numeric text': (b'{"celex": "a", "lang": "en", "text": 42}\n', [], 'line 1: "text" must be a string, got a number (42)'),
    'NaN title':    (b'{"celex": "a", "lang": "en", "text": "ok", "title": NaN}\n', [], 'line 1: "title" must be a string, got NaN'),
    'number title': (b'{"celex": "a", "lang": "en", "text": "ok", "title": 1.5}\n', [], '"title" must be a string, got a number (1.5)'),
    'lang zz':      (b'{"celex": "a", "lang": "zz", "text": "ok"}\n', [], "line 1: \"lang\" 'zz' is not one of the 24 official EU"),
    'year 9999':    (b'{"celex": "a", "lang": "en", "text": "ok", "date": "9999-12-31"}\n', [], "date '9999-12-31' is outside 1950-"),
    'year 1949':    (b'{"celex": "a", "lang": "en", "text": "ok", "date": "1949-01-01"}\n', [], "date '1949-01-01' is outside 1950-"),
    'duplicate key': (b'{"celex": "a", "lang": "en", "text": "ok", "lang": "de"}\n', [], "line 1: duplicate key 'lang'"),
    'not utf-8':    (b'{"celex": "a", "lang": "en", "text": "caf\xe9"}\n', [], 'line 1: byte 42 is not UTF-8'),
    'not object':   (b'[1, 2]\n', [], 'line 1: expected a JSON object'),
    'bad date':     (b'{"celex": "a", "lang": "en", "text": "ok", "date": "someday"}\n', [], 'line 1: date'),
    'zero target':  (b'{"celex": "a", "lang": "en", "text": "ok"}\n', ['--target-tokens', '0'], '--target-tokens: expected at least 1 token'),
    'minus target': (b'{"celex": "a", "lang": "en", "text": "ok"}\n', ['--target-tokens', '-5'], '--target-tokens: expected a count of 0 or more'),
    'inf target':   (b'{"celex": "a", "lang": "en", "text": "ok"}\n', ['--target-tokens', 'inf'], '--target-tokens: expected a finite number'),
    'word target':  (b'{"celex": "a", "lang": "en", "text": "ok"}\n', ['--target-tokens', 'eight'], '--target-tokens: expected a number'),
    'no target':    (b'{"celex": "a", "lang": "en", "text": "ok"}\n', ['--target-tokens'], '--target-tokens: expected one argument'),
    'no tokenizer': (b'{"celex": "a", "lang": "en", "text": "ok"}\n', ['--tokenizer', 'nope.json'], 'no such tokenizer file'),
    'bad rules':    (b'{"celex": "a", "lang": "en", "text": "ok"}\n', ['--rules', 'RULES'], "unknown rule 'treshold'"),
}
NAMES_NO_FILE = ('zero target', 'minus target', 'inf target', 'word target', 'no target', 'no tokenizer', 'bad rules')

@pytest.mark.parametrize('name', BAD)
def test_bad_input_is_one_line_and_leaves_no_output(tmp_path, capsys, name):
    content, extra, expected = BAD[name]
    src = tmp_path/'in.jsonl'
    if content is not None: src.write_bytes(content)
    (tmp_path/'rules.yaml').write_text('treshold: 50\n')
    extra = [str(tmp_path/'rules.yaml') if x == 'RULES' else x for x in extra]
    args = ['select', str(src), '--out', str(tmp_path/'out.jsonl'), '--report', str(tmp_path/'r.json')]
    args += extra if '--target-tokens' in extra else ['--target-tokens', '1000'] + extra
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith('legalnb select: error: ') and expected in err, err
    if name not in NAMES_NO_FILE: assert 'in.jsonl' in err   # names the file
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(['rules.yaml'] + (['in.jsonl'] if content is not None else []))

def test_failure_keeps_an_earlier_output(tmp_path):
    good = write_docs(tmp_path/'good.jsonl', synthetic_documents(50, seed=16))
    assert main(['select', str(good), '--out', str(tmp_path/'out.jsonl'), '--target-tokens', '1M']) == 0
    before = (tmp_path/'out.jsonl').read_bytes()
    bad = tmp_path/'bad.jsonl'
    bad.write_bytes(good.read_bytes() + b'{"celex": "z", "lang": "en"}\n')
    assert main(['select', str(bad), '--out', str(tmp_path/'out.jsonl'), '--target-tokens', '1M', '--strict']) == 2
    assert (tmp_path/'out.jsonl').read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.')]   # no temporary file left behind

def test_selection_does_not_hold_the_texts(tmp_path):
    "Peak Python memory while selecting stays a small fraction of the input (24 MB): texts are never kept."
    src = write_docs(tmp_path/'in.jsonl', synthetic_documents(800, seed=17, chars=(20_000, 40_000)))
    size = src.stat().st_size
    warm = write_docs(tmp_path/'warm.jsonl', synthetic_documents(20, seed=1))   # imports and caches, not traced
    select_documents(SelectConfig(warm, tmp_path/'warm-out.jsonl', 10**6, num_proc=1))
    tracemalloc.start()
    try:
        report = select_documents(SelectConfig(src, tmp_path/'out.jsonl', 10**6, num_proc=1))
        peak = tracemalloc.get_traced_memory()[1]
    finally: tracemalloc.stop()
    assert report['counters']['documents.read'] == 800 and size > 20e6
    assert peak < size / 5, (peak, size)   # ~3 MB of per-document numbers; holding the texts would be > size

BENCH = Path(__file__).resolve().parents[1]/'bench'

def test_bench_selection_prints_its_table(tmp_path):
    "A tiny run of bench/selection.py through a symbolic link: both corpora, the ratios."
    (tmp_path/'bench').symlink_to(BENCH, target_is_directory=True)
    r = subprocess.run([sys.executable, str(tmp_path/'bench'/'selection.py'), '--docs', '300', '--realistic-docs', '6', '--repeat', '1'],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert 'realistic documents: select / read+parse = ' in r.stdout and 'short documents: select / read+parse = ' in r.stdout
    assert 'kB per document' in r.stdout and 'production corpus' in r.stdout


# --- issue 11: outputs that are inputs, failures that leave nothing, targets as people write them ---------------

def test_target_tokens_with_thousands_separators(tmp_path, capsys):
    src = write_docs(tmp_path/'in.jsonl', synthetic_documents(40, seed=20))
    assert main(['select', str(src), '--out', str(tmp_path/'out.jsonl'), '--target-tokens', '2,000,000', '--report', str(tmp_path/'r.json')]) == 0
    assert json.loads((tmp_path/'r.json').read_text())['target_tokens'] == 2_000_000

@pytest.mark.parametrize('flag', ['--out', '--report'])
def test_an_output_that_is_the_input_is_refused(tmp_path, capsys, flag):
    "`select p.jsonl --out p.jsonl` once truncated its own input (100 documents became 5)."
    src = write_docs(tmp_path/'p.jsonl', synthetic_documents(100, seed=21))
    before = src.read_bytes()
    args = ['select', str(src), '--target-tokens', '20K', '--out', str(tmp_path/'s.jsonl')]
    assert main(args + [flag, str(src)]) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and f'{flag} {src} is also an input' in err, err
    assert src.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ['p.jsonl']

def test_rules_and_tokenizer_are_inputs_too(tmp_path, capsys):
    src = write_docs(tmp_path/'p.jsonl', synthetic_documents(20, seed=22))
    (tmp_path/'rules.yaml').write_text('threshold: 10\n')
    assert main(['select', str(src), '--target-tokens', '1M', '--rules', str(tmp_path/'rules.yaml'),
                 '--report', str(tmp_path/'rules.yaml'), '--out', str(tmp_path/'s.jsonl')]) == 2
    assert '--report' in capsys.readouterr().err and (tmp_path/'rules.yaml').read_text() == 'threshold: 10\n'
    assert main(['select', str(src), '--target-tokens', '1M', '--report', str(tmp_path/'s.jsonl'), '--out', str(tmp_path/'s.jsonl')]) == 2
    assert 'is the same file as --out' in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['p.jsonl', 'rules.yaml']

def test_a_report_that_cannot_be_written_keeps_the_earlier_selection(tmp_path, capsys):
    src = write_docs(tmp_path/'p.jsonl', synthetic_documents(50, seed=23))
    assert main(['select', str(src), '--target-tokens', '10K', '--out', str(tmp_path/'s.jsonl')]) == 0
    before = (tmp_path/'s.jsonl').read_bytes()
    (tmp_path/'file').write_text('')
    assert main(['select', str(src), '--target-tokens', '20K', '--out', str(tmp_path/'s.jsonl'), '--report', str(tmp_path/'file'/'r.json')]) == 2
    assert 'file/r.json' in capsys.readouterr().err
    assert (tmp_path/'s.jsonl').read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ['file', 'p.jsonl', 's.jsonl']

def test_a_failed_select_into_a_new_folder_leaves_no_folder(tmp_path, capsys):
    (tmp_path/'bad.jsonl').write_bytes(b'{"celex": "a", "lang": "en", "text": "ok"}\n{"celex": "b", "lang": "en", "text": 7}\n')
    assert main(['select', str(tmp_path/'bad.jsonl'), '--target-tokens', '1M', '--out', str(tmp_path/'new'/'deeper'/'s.jsonl'),
                 '--report', str(tmp_path/'new2'/'r.json'), '--strict']) == 2
    assert 'line 2: "text" must be a string' in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['bad.jsonl']

def test_select_flags_are_kept():
    "Every flag `legalnb select` had before it was declared as a function is still there."
    from legalnb.options import command_parser
    from legalnb.scoring import SelectConfig
    want = set(json.loads((Path(__file__).parent/'fixtures'/'cli_flags.json').read_text())['select'])
    have = {o for a in command_parser(SelectConfig, 'legalnb select')._actions for o in a.option_strings}
    assert want <= have, want - have

# --- issue 12: bad lines skipped and counted, consolidated texts and their base acts ----------------------------------

def test_select_skips_bad_lines_and_counts_them(tmp_path, capsys):
    good = write_docs(tmp_path/'good.jsonl', synthetic_documents(40, seed=21))
    bad = tmp_path/'bad.jsonl'
    bad.write_bytes(good.read_bytes() + b'{"celex": "z", "lang": "en"}\n{cut\n{"celex": "y", "lang": "xx", "text": "ok"}\n')
    assert main(['select', str(bad), '--out', str(tmp_path/'s.jsonl'), '--report', str(tmp_path/'r.json'), '--target-tokens', '1M']) == 0
    report = json.loads((tmp_path/'r.json').read_text())
    assert report['counters']['documents.read'] == 40
    assert {k: v for k, v in report['counters'].items() if k.startswith('skipped.')} == {'skipped.no_text': 1, 'skipped.not_json': 1,
                                                                                        'skipped.bad_language': 1}
    assert [(s['line'], s['reason']) for s in report['skipped']] == [(41, 'no_text'), (42, 'not_json'), (43, 'bad_language')]
    assert 'lines skipped (could not be read): bad_language 1 · no_text 1 · not_json 1' in capsys.readouterr().out
    assert main(['select', str(bad), '--out', str(tmp_path/'t.jsonl'), '--target-tokens', '1M', '--strict']) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'bad.jsonl, line 41: missing or empty "text"' in err and not (tmp_path/'t.jsonl').exists()
    (tmp_path/'all_bad.jsonl').write_bytes(b'{cut\n{"text": 5, "lang": "en"}\n')
    assert main(['select', str(tmp_path/'all_bad.jsonl'), '--out', str(tmp_path/'u.jsonl'), '--target-tokens', '1M']) == 2
    assert 'line 1: not JSON' in capsys.readouterr().err and not (tmp_path/'u.jsonl').exists()


@pytest.mark.parametrize('prefer, kept', [('both', ['02016R0679-20160504', '02016R0679-20180525', '32016R0679', '32019L0001']),
                                          ('consolidated', ['02016R0679-20180525', '32019L0001']),
                                          ('original', ['32016R0679', '32019L0001'])])
def test_prefer_consolidated_or_original(tmp_path, prefer, kept):
    text = 'Article 1 data protection. ' * 600
    docs = [Document('32016R0679', 'GDPR', text, 'en', date(2016, 4, 27), 'regulation', ['data protection']),
            Document('02016R0679-20160504', 'GDPR', text, 'en', date(2016, 5, 4), 'regulation', ['data protection'], base_celex='32016R0679'),
            Document('02016R0679-20180525', 'GDPR', text, 'en', date(2018, 5, 25), 'regulation', ['data protection'], base_celex='32016R0679'),
            Document('32019L0001', 'ECN+', text, 'en', date(2019, 1, 1), 'directive', ['competition'])]
    src = write_docs(tmp_path/'in.jsonl', docs)
    args = ['select', str(src), '--out', str(tmp_path/'s.jsonl'), '--report', str(tmp_path/'r.json'), '--target-tokens', '10M',
            '--near-dup', '0']   # one text four times: near-duplicate removal would keep one whatever the versions
    assert main(args + ['--prefer', prefer]) == 0
    assert sorted(r['celex'] for r in lines(tmp_path/'s.jsonl')) == kept
    report = json.loads((tmp_path/'r.json').read_text())
    assert report['prefer'] == prefer and report['counters']['dropped.other_version'] == 4 - len(kept)
    assert report['counters']['versions.acts'] == 1 and report['counters']['versions.documents'] == 3
    if prefer == 'consolidated':
        assert main(args) == 0 and sorted(r['celex'] for r in lines(tmp_path/'s.jsonl')) == kept, 'the newest consolidated text is the default'


def test_language_balance_over_the_24_languages(tmp_path):
    "Quotas, balance and report tables hold for every official language, not only the big ones."
    from legalnb.sources import EU_LANGUAGES
    rng = random.Random(5)
    docs = [Document(f'3{2015 + i % 9}R{i:04d}', f'Act {i}', 'Article 1 data protection rules apply. ' * rng.randint(60, 400),
                     EU_LANGUAGES[i % 24], date(2015 + i % 9, 1, 1), 'regulation', ['data protection']) for i in range(24 * 30)]
    src = write_docs(tmp_path/'in.jsonl', docs)
    total = sum(estimate_tokens(d.text) for d in docs)
    report = select_documents(SelectConfig(src, tmp_path/'s.jsonl', total // 3, near_dup=0, num_proc=1))   # one sentence repeated: all near-duplicates
    assert sorted(report['languages']) == sorted(EU_LANGUAGES)
    assert report['balance']['ok'], report['balance']
    assert all(abs(r['selected_share'] - r['input_share']) <= 0.02 for r in report['languages'].values())


# --- issue 20: the best N documents (`select --top N`), for the second stage of two-stage training -------------------

def test_select_top_on_the_generated_sample(tmp_path):
    "`legalnb select --top N` alone: exactly N, each language's best by rank, its share of N kept within a document."
    from legalnb.sources import document_from_record
    assert run_cli('sample', tmp_path/'sample', '--docs', 80, '--seed', 4).returncode == 0
    assert run_cli('parse', tmp_path/'sample', '--out', tmp_path/'parsed.jsonl').returncode == 0
    parsed = lines(tmp_path/'parsed.jsonl')
    r = run_cli('select', tmp_path/'parsed.jsonl', '--out', tmp_path/'top.jsonl', '--top', 20, '--report', tmp_path/'r.json')
    assert r.returncode == 0, r.stderr
    top, report = lines(tmp_path/'top.jsonl'), json.loads((tmp_path/'r.json').read_text())
    c, L = report['counters'], report['languages']
    assert len(top) == c['documents.selected'] == 20 and (report['top'], report['target_tokens'], report['share_unit']) == (20, None, 'docs')
    assert c['dropped.top_reached'] > 0 and c['dropped.budget_reached'] == 0
    assert c['documents.unique'] == 20 + c['dropped.below_threshold'] + c['dropped.language_quota'] + c['dropped.top_reached']
    assert 'at most the best 20 (--top 20)' in r.stdout and 'one document of its target share of documents' in r.stdout
    scores = {(d['celex'], d['lang']): score_document(document_from_record(d)).total for d in parsed}
    for lang, row in L.items():   # each language's documents are its best (score, then CELEX), as many as its share
        ranked = sorted((-s, celex) for (celex, l), s in scores.items() if l == lang and s >= 70)
        assert {celex for _, celex in ranked[:row['docs_selected']]} == {d['celex'] for d in top if d['lang'] == lang}, lang
        assert abs(row['wanted_docs'] - 20 * row['input_share']) < 1   # its share of the 20, within a document
        if row['short']: assert row['docs_selected'] == row['eligible_docs'] < row['wanted_docs'], lang
        else: assert row['docs_selected'] >= row['wanted_docs'], lang
    # a short language's missing documents went to the others, one for one
    missing = sum(r['wanted_docs'] - r['docs_selected'] for r in L.values() if r['short'])
    assert sum(r['docs_selected'] - r['wanted_docs'] for r in L.values() if not r['short']) == missing
    if not missing: assert all(abs(r['docs_selected'] - 20 * r['input_share']) < 1 for r in L.values())
    # with --target-tokens too, whichever comes first: 20 documents in a large budget, a small budget before 20 documents
    args = ['select', str(tmp_path/'parsed.jsonl'), '--report', str(tmp_path/'r.json')]
    assert main(args + ['--out', str(tmp_path/'a.jsonl'), '--target-tokens', '1B', '--top', '20']) == 0
    a = json.loads((tmp_path/'r.json').read_text())['counters']
    assert len(lines(tmp_path/'a.jsonl')) == a['documents.selected'] == 20 and a['dropped.top_reached'] > 0 == a['dropped.budget_reached']
    assert main(args + ['--out', str(tmp_path/'b.jsonl'), '--target-tokens', '5K', '--top', '20']) == 0
    b = json.loads((tmp_path/'r.json').read_text())['counters']
    assert 0 < b['documents.selected'] < 20 and b['dropped.budget_reached'] > 0 == b['dropped.top_reached']
    assert main(args + ['--out', str(tmp_path/'c.jsonl'), '--target-tokens', '5K']) == 0
    assert (tmp_path/'b.jsonl').read_bytes() == (tmp_path/'c.jsonl').read_bytes()

def test_top_ignores_input_order_and_ties_go_to_the_lower_celex(tmp_path):
    docs = [Document(f'32020R{n:04d}', 'Regulation on data protection', 'x' * 4_000, 'en', date(2020, 1, 1), 'regulation') for n in range(20)]
    outs = []
    for seed in range(3):
        shuffled = random.Random(seed).sample(docs, len(docs))
        select_documents(SelectConfig(write_docs(tmp_path/f'in{seed}.jsonl', shuffled), tmp_path/f'out{seed}.jsonl', None, top=5, near_dup=0, num_proc=1))
        outs.append(sorted(d['celex'] for d in lines(tmp_path/f'out{seed}.jsonl')))
    assert outs[0] == outs[1] == outs[2] == [f'32020R{n:04d}' for n in range(5)]

@pytest.mark.parametrize('argv, expected', [
    (['--top', '0'], "--top: expected a whole number of documents of at least 1, such as 10000 or 10K, got '0'"),
    (['--top', '-3'], "--top: expected a whole number of documents of at least 1, such as 10000 or 10K, got '-3'"),
    (['--top', 'x', '--target-tokens', '1M'], "--top: expected a number such as"),
    ([], '--target-tokens or --top is required: a token budget such as 2M, or a number of documents such as 10K'),
])
def test_bad_top_is_one_line(tmp_path, capsys, argv, expected):
    src = write_docs(tmp_path/'in.jsonl', synthetic_documents(20, seed=24))
    assert main(['select', str(src), '--out', str(tmp_path/'out.jsonl'), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith('legalnb select: error: ') and expected in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['in.jsonl']


# --- issue 38: choosing what goes in ----------------------------------------------------------------------------

def test_select_keeps_only_the_languages_types_and_dates_asked(tmp_path, capsys):
    "--languages en,de --types ... --since --until: only those documents, each filter counted, the mix over en and de."
    docs = list(synthetic_documents(400, seed=31))
    src = write_docs(tmp_path/'in.jsonl', docs)
    assert main(['select', str(src), '--out', str(tmp_path/'out.jsonl'), '--top', '100000', '--near-dup', '0',
                 '--languages', 'en,de', '--types', 'regulation,directive', '--since', '2000-01-01',
                 '--until', '2019-12-31', '--report', str(tmp_path/'r.json')]) == 0
    kept = [d for d in docs if d.lang in ('en', 'de') and d.doc_type in ('regulation', 'directive')
            and d.date and date(2000, 1, 1) <= d.date <= date(2019, 12, 31)]
    r, out = json.loads((tmp_path/'r.json').read_text()), capsys.readouterr().out
    c, chosen = r['counters'], lines(tmp_path/'out.jsonl')
    assert {(d['lang'], d['doc_type']) for d in chosen} <= {(l, t) for l in ('en', 'de') for t in ('regulation', 'directive')}
    assert all('2000-01-01' <= d['date'] <= '2019-12-31' for d in chosen) and set(r['languages']) == {'en', 'de'}
    assert c['dropped.language'] == sum(d.lang not in ('en', 'de') for d in docs)
    assert c['documents.read'] == len(docs) == (c['documents.unique'] + c['dropped.duplicate'] + c['dropped.language']
                                                + c['dropped.type'] + c['dropped.undated'] + c['dropped.before_since']
                                                + c['dropped.after_until'])
    assert c['documents.unique'] == len(kept) and r['filters']['since'] == '2000-01-01'
    assert 'kept only --languages en,de --types regulation,directive --since 2000-01-01 --until 2019-12-31' in out

@pytest.mark.parametrize('argv, expected', [
    (['--languages', 'xx'], "--languages: 'xx' is not the ISO 639-1 code of an official EU language; expected some of bg,"),
    (['--languages', 'sv'], "in.jsonl: --languages sv: no document of the input has it; its documents are en ("),
    (['--types', 'law'], "--types: 'law' is not a document type; expected some of regulation, directive, decision"),
    (['--since', '2015-02-30'], "--since: expected a date as yyyy-mm-dd, such as 2015-01-01, got '2015-02-30'"),
    (['--until', 'yesterday'], "--until: expected a date as yyyy-mm-dd, such as 2015-01-01, got 'yesterday'"),
    (['--since', '2020-01-01', '--until', '2010-01-01'], '--since 2020-01-01 is after --until 2010-01-01'),
    (['--since', '2099-01-01'], 'in.jsonl: --since 2099-01-01 keeps none of its 20 documents (dropped: before_since'),
])
def test_bad_filters_are_one_line_and_write_nothing(tmp_path, capsys, argv, expected):
    src = write_docs(tmp_path/'in.jsonl', synthetic_documents(20, seed=24))
    assert main(['select', str(src), '--out', str(tmp_path/'out.jsonl'), '--target-tokens', '10K', *argv]) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith('legalnb select: error: ') and expected in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['in.jsonl']


# --- issue 27: versions, near-duplicates, processes --------------------------------------------------------------

def test_two_processes_select_what_one_selects(tmp_path):
    "The first pass split over processes (byte ranges of the file): the same selection, counters and skipped line numbers."
    docs = [d.to_json() for d in synthetic_documents(400, seed=21, chars=(8_000, 30_000))]
    raw = b''.join(json.dumps(d, ensure_ascii=False).encode() + b'\n' for d in docs)
    bad = b'{"celex": "cut", \n'
    lines_ = raw.splitlines(keepends=True)
    src = tmp_path/'in.jsonl'
    src.write_bytes(b''.join(lines_[:150]) + bad + b''.join(lines_[150:300]) + bad + b''.join(lines_[300:]))
    assert src.stat().st_size > 4 << 20, 'large enough for several ranges'
    reports = [select_documents(SelectConfig(src, tmp_path/f'out{n}.jsonl', 2_000_000, num_proc=n)) for n in (1, 2)]
    assert (tmp_path/'out1.jsonl').read_bytes() == (tmp_path/'out2.jsonl').read_bytes()
    one, two = ({k: v for k, v in r.items() if k not in ('seconds', 'output', 'near_duplicates')} for r in reports)
    assert one == two and [s['line'] for s in reports[1]['skipped']] == [151, 302]
    assert reports[0]['near_duplicates']['compared'] == reports[1]['near_duplicates']['compared'] > 0
