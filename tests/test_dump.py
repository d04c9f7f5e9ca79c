"""Issue 27's done-when on a realistic CELLAR-style folder: the real XHTML, HTML and Formex fixtures beside a generated
dump (OJ XHTML originals saved as .xml and .html, consolidated versions, acts published again with small edits), through
`legalnb parse`, `select` and `build-corpus` as a user runs them."""
import json, shutil, subprocess, sys
from collections import Counter
from pathlib import Path

import pytest

from legalnb.scoring import near_duplicate_share
from legalnb.sources import file_kind
from legalnb.sample import write_sample

FIXTURES = Path(__file__).resolve().parent/'fixtures'


def legalnb(*args) -> subprocess.CompletedProcess:
    "Run the `legalnb` command in a fresh interpreter, as a user would."
    r = subprocess.run([sys.executable, '-m', 'legalnb.cli', *map(str, args)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope='module')
def dump(tmp_path_factory) -> Path:
    "The mixed folder, parsed: (work folder)."
    work = tmp_path_factory.mktemp('dump')
    shutil.copytree(FIXTURES/'xhtml', work/'dump'/'real'); shutil.copytree(FIXTURES/'formex', work/'dump'/'formex')
    write_sample(work/'dump'/'generated', docs=400, seed=27, xhtml=0.5, versions=0.4, copies=0.1)
    legalnb('parse', work/'dump', '--out', work/'parsed.jsonl', '--num-proc', 2, '--batch-files', 64)
    return work


def test_parse_reads_formex_and_xhtml_and_names_every_file_it_skips(dump):
    report = json.loads((dump/'parse_report.json').read_text(encoding='utf-8'))
    c = report['counters']
    files = [p for p in (dump/'dump').rglob('*') if p.is_file()]
    assert sum(v for k, v in c.items() if k.startswith('files.')) == len(files), 'every file is read, used or skipped'
    docs = [json.loads(l) for l in (dump/'parsed.jsonl').read_text(encoding='utf-8').splitlines()]
    formats = Counter(file_kind(Path(d['source']))[0] for d in docs)   # what each document was read from, by content
    assert set(formats) == {'html', 'formex'} and min(formats.values()) > 200 and c['files.html'] > 200
    what = {'image': 'a TIFF image', 'text_file': 'a text file', 'notice_page': 'an EUR-Lex page without the text'}
    for item in report['skipped_items']:   # the reason names what the file is, and so does the message
        assert item['error'].split(': ', 1)[1].startswith(what[item['reason']]), item
    assert {x['reason'] for x in report['skipped_items']} == set(what)
    assert c['versions.acts'] > 100 and c['consolidated'] > 250


def test_the_default_selection_holds_few_near_duplicates(dump):
    "One version of each act and near-duplicate removal: at most 2% near-duplicates (exact Jaccard >= 0.8); without: many."
    legalnb('select', dump/'parsed.jsonl', '--out', dump/'selected.jsonl', '--target-tokens', '1M', '--report', dump/'select.json')
    legalnb('select', dump/'parsed.jsonl', '--out', dump/'all-versions.jsonl', '--target-tokens', '1M', '--prefer', 'both',
            '--near-dup', '0')
    now, before = near_duplicate_share(dump/'selected.jsonl'), near_duplicate_share(dump/'all-versions.jsonl')
    print(f"near-duplicates in the selection: {now['near_duplicates']} of {now['documents']}; with every version and no "
          f"removal: {before['near_duplicates']} of {before['documents']}")
    assert now['share'] <= 0.02 and before['share'] > 0.1
    c = json.loads((dump/'select.json').read_text())['counters']
    assert c['dropped.other_version'] > 200 and c['dropped.near_duplicate'] > 10 and c['versions.acts'] > 100


def test_the_heldout_set_holds_at_least_20_acts(dump):
    if not (dump/'selected.jsonl').exists():
        legalnb('select', dump/'parsed.jsonl', '--out', dump/'selected.jsonl', '--target-tokens', '1M')
    r = legalnb('build-corpus', dump/'selected.jsonl', '--out', dump/'corpus', '--train-tokenizer', 300, '--seq-len', 64,
                '--shards', 2, '--val-docs', '0.02', '--no-progress')
    m = json.loads((dump/'corpus'/'manifest.json').read_text())
    assert len(m['heldout_celex']) == m['heldout']['acts'] >= 20 and 'held-out acts: ' in r.stdout
    held = [json.loads(l) for l in (dump/'corpus'/'heldout.jsonl').read_text(encoding='utf-8').splitlines()]
    assert len({d['lang'] for d in held}) > 1 and len(held) >= 20


def test_bench_scale_prints_its_table(tmp_path):
    "A tiny run of bench/scale.py through a symbolic link: two sizes, the three stages, the verdicts, the projection, a resume."
    (tmp_path/'bench').symlink_to(Path(__file__).resolve().parents[1]/'bench', target_is_directory=True)
    r = subprocess.run([sys.executable, str(tmp_path/'bench'/'scale.py'), '--sizes', '0.004', '0.008', '--num-proc', '2',
                        '--work', str(tmp_path/'work')], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for stage in ('parse', 'select', 'build-corpus'): assert f'| 0.008 GB | {stage}' in r.stdout
    assert 'time per GB at most' in r.stdout and 'h on 16 cores' in r.stdout and 'h on 64' in r.stdout
    assert 'x anonymous' in r.stdout and 'peak MB worker (anon)' in r.stdout   # memory the stages need, beside RSS
    assert 'output byte-identical to an uninterrupted run: True' in r.stdout, r.stdout
