"End-to-end tests of the sources stage: real Formex fixtures, the sample generator, `legalnb sample` / `legalnb parse`, bad input."
import hashlib, json, re, shutil, subprocess, sys
from datetime import date
from pathlib import Path

import pytest

from legalnb.cli import main
from legalnb.sources import (read_documents, read_formex)
from legalnb.sample import SAMPLE_LANGUAGES, write_sample, _Writer, sample_publications

FIXTURES = Path(__file__).resolve().parents[2]/'shared'/'fixtures'/'formex'
needs_fixtures = pytest.mark.skipif(not FIXTURES.exists(), reason=f'real Formex fixtures not found at {FIXTURES} (../shared beside the repo)')
OJ_REF = re.compile(r'\b(OJ|ABl\.|JO|DO|GU) [CL] \d+')


def legalnb(*args) -> subprocess.CompletedProcess:
    "Run the `legalnb` command in a fresh interpreter, as a user would."
    return subprocess.run([sys.executable, '-m', 'legalnb.cli', *map(str, args)], capture_output=True, text=True, timeout=120)


def tree_digest(folder: Path) -> str:
    "One hash over the names and bytes of every file under `folder` (legalnb's record of what it wrote left out)."
    from legalnb.locks import bookkeeping
    h = hashlib.sha256()
    for p in sorted(folder.rglob('*')):
        if p.is_file() and not bookkeeping(p.name): h.update(str(p.relative_to(folder)).encode() + b'\0' + p.read_bytes())
    return h.hexdigest()


# --- real Formex ------------------------------------------------------------------------------------------

@needs_fixtures
def test_real_formex_metadata():
    docs = {d.celex: d for d in read_formex(FIXTURES)}
    assert sorted(docs) == ['32008R1137', '32024R0903']          # built from NO.DOC: the files carry no CELEX
    new, old = docs['32024R0903'], docs['32008R1137']
    assert (new.doc_type, new.lang, new.date) == ('regulation', 'en', date(2024, 3, 13))
    assert (old.doc_type, old.lang, old.date) == ('regulation', 'en', date(2008, 10, 22))   # the act's date, not the OJ issue's (21.11.2008)
    assert new.title == ('Regulation (EU) 2024/903 of the European Parliament and of the Council of 13 March 2024 laying down measures '
                         'for a high level of public sector interoperability across the Union (Interoperable Europe Act)')
    assert old.title.startswith('Regulation (EC) No 1137/2008 of the European Parliament and of the Council of 22 October 2008 adapting')


@needs_fixtures
def test_real_formex_text_is_clean():
    docs = {d.celex: d for d in read_formex(FIXTURES)}
    new, old = docs['32024R0903'].text, docs['32008R1137'].text
    for text in (new, old):
        assert not OJ_REF.search(text), 'footnote references must not leak into the text'
        assert not re.search(r'\(\d+\)[A-Za-z]', text), 'recital numbers are separated from their text'
        assert not re.search(r'^\d+\.$', text, re.M), 'a paragraph number stays on the line of its paragraph'
    # the footnote sat between "Committee" and ","; the sentence must read on
    assert 'Having regard to the opinion of the European Economic and Social Committee,\n' in new
    assert '(3) The Union and Member States have been working for more than two decades' in new
    assert 'entitled ‘2030 Digital Compass: the European way for the Digital Decade’, the Commission' in new
    assert '\n1. This Regulation lays down measures that promote the cross-border interoperability' in new
    assert new.index('HAVE ADOPTED THIS REGULATION:') < new.index('\nArticle 1\n') < new.index('Done at Strasbourg, 13 March 2024.') < new.index('\nANNEX\n')
    # Formex 4: preamble, articles, final part, then both annexes in order; a closing quote inside a footnote is kept
    assert old.startswith('THE EUROPEAN PARLIAMENT AND THE COUNCIL OF THE EUROPEAN UNION,\nHaving regard to the Treaty establishing')
    # issue 12: the closing quote sits in the footnote of paragraph 1, but the quoted Article 5 goes on with paragraph 2
    assert 'set up by Article 58 of Regulation (EC) No 178/2002 of the European Parliament and of the Council\n2. Where' in old
    assert 'shall apply, having regard to the provisions of Article 8 thereof.’\n' in old
    assert old.index('Done at Strasbourg, 22 October 2008.') < old.index('\nANNEX\n') < old.index('\nChronological Index\n')
    assert '<' not in new + old and '  ' not in new + old


@needs_fixtures
def test_real_formex_through_cli(tmp_path):
    r = legalnb('parse', FIXTURES, '--out', tmp_path/'parsed.jsonl')
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in (tmp_path/'parsed.jsonl').read_text(encoding='utf-8').splitlines()]
    assert sorted((x['celex'], x['doc_type'], x['date'], x['lang']) for x in recs) == [
        ('32008R1137', 'regulation', '2008-10-22', 'en'), ('32024R0903', 'regulation', '2024-03-13', 'en')]
    assert 'parsed 2 documents' in r.stdout


# --- the sample generator ------------------------------------------------------------------------------------

def test_sample_is_deterministic(tmp_path):
    write_sample(tmp_path/'a', docs=40, seed=3); write_sample(tmp_path/'b', docs=40, seed=3); write_sample(tmp_path/'c', docs=40, seed=4)
    assert tree_digest(tmp_path/'a') == tree_digest(tmp_path/'b') != tree_digest(tmp_path/'c')
    assert (tmp_path/'a'/'sample.json').read_bytes() == (tmp_path/'b'/'sample.json').read_bytes()


def test_sample_shapes(tmp_path):
    manifest = write_sample(tmp_path/'s', docs=200, seed=0)
    docs = list(read_documents(tmp_path/'s'))
    assert len(docs) == 200
    assert {d.lang for d in docs} >= {'en', 'de', 'fr', 'es', 'pt', 'it'}
    assert {d.doc_type for d in docs} == {'regulation', 'directive', 'decision', 'recommendation'}
    years = [d.date.year for d in docs]
    assert min(years) >= 1990 and max(years) <= 2025 and max(years) - min(years) >= 30
    lengths = sorted(len(d.text) for d in docs)
    assert lengths[0] < 1_000 and lengths[-1] > 20_000
    priority = {'data protection', 'GDPR', 'privacy', 'consumer rights', 'environment', 'climate', 'digital', 'cyber', 'competition', 'financial', 'health', 'employment'}
    assert 40 < sum(bool(priority & set(d.subjects)) for d in docs) < 160, 'both priority and non-priority subjects'
    # every document matches what the manifest says was written
    want = {(p['celex'], p['lang']): p for p in manifest['publications']}
    for d in docs:
        p = want[(d.celex, d.lang)]
        assert (d.doc_type, d.date.isoformat(), d.subjects) == (p['doc_type'], p['date'], p['subjects'])
        assert not OJ_REF.search(d.text) and '<' not in d.text
    assert {p['formex'] for p in manifest['publications']} == {4, 6}
    assert any('Whereas:' in d.text for d in docs) and any(' | ' in d.text for d in docs), 'recitals and tables'


def test_sample_replaces_only_a_sample(tmp_path):
    write_sample(tmp_path/'s', docs=5, seed=0); write_sample(tmp_path/'s', docs=7, seed=1)
    assert len(json.loads((tmp_path/'s'/'sample.json').read_text())['publications']) == 7
    (tmp_path/'mine').mkdir(); (tmp_path/'mine'/'thesis.txt').write_text('keep')
    assert main(['sample', str(tmp_path/'mine'), '--docs', '3']) == 2
    assert [p.name for p in (tmp_path/'mine').iterdir()] == ['thesis.txt']
    assert sorted(p.name for p in tmp_path.iterdir()) == ['mine', 's'], 'no temporary folder left behind'


def test_several_publications_in_one_folder(tmp_path):
    "Acts and annexes in one flat folder are matched to their wrapper by DOCUMENT.REF/@FILE."
    pubs = [p for p in sample_publications(60, seed=5) if p[2] == 6 and p[0].annex][:3]
    assert len(pubs) == 3
    for act, lang, fmx, uid in pubs:
        for rel, xml in _Writer(act, lang, fmx).publication(uid): (tmp_path/Path(rel).name).write_text(xml, encoding='utf-8')
    docs = sorted(read_formex(tmp_path), key=lambda d: d.celex)
    assert [(d.celex, d.lang) for d in docs] == sorted((a.celex, l) for a, l, _, _ in pubs)
    assert all(d.text.count(f'\n{SAMPLE_LANGUAGES[d.lang]["annex"]}\n') == 1 for d in docs), 'each act gets its own annex, once'


# --- legalnb sample -> legalnb parse ----------------------------------------------------------------------------

def test_sample_parse_round_trip(tmp_path):
    r = legalnb('sample', tmp_path/'corpus', '--docs', 60, '--seed', 12)   # seed 12: two publications delivered twice
    assert r.returncode == 0 and 'wrote 60 Formex publications' in r.stdout, r.stderr
    (tmp_path/'extra.jsonl').write_text(json.dumps({'text': 'Artículo 1. Texto.', 'lang': 'es', 'celex': '32020R0001'}) + '\n'
                                        + json.dumps({'text': 'Article 1', 'lang': 'en', 'date': None}) + '\n', encoding='utf-8')
    r = legalnb('parse', tmp_path/'corpus', tmp_path/'extra.jsonl', '--out', tmp_path/'parsed.jsonl')
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in (tmp_path/'parsed.jsonl').read_text(encoding='utf-8').splitlines()]
    manifest = json.loads((tmp_path/'corpus'/'sample.json').read_text())
    unique = {(p['celex'], p['lang']) for p in manifest['publications']}
    dups = len(manifest['publications']) - len(unique)
    assert dups == 2
    assert len(recs) == len(unique) + 2 and len({(x['celex'], x['lang']) for x in recs if x['celex']}) == len(unique) + 1
    assert all(set(x) == {'celex', 'title', 'text', 'lang', 'date', 'doc_type', 'subjects', 'source', 'base_celex'} for x in recs)
    assert f'dropped {dups} duplicates' in r.stdout and '2 without a date, 1 of unknown type' in r.stdout
    # parsing the parsed file again changes nothing: the JSONL contract round-trips
    r = legalnb('parse', tmp_path/'parsed.jsonl', '--out', tmp_path/'again.jsonl')
    assert r.returncode == 0 and (tmp_path/'again.jsonl').read_text(encoding='utf-8') == (tmp_path/'parsed.jsonl').read_text(encoding='utf-8')


def test_parse_skips_its_own_output(tmp_path):
    write_sample(tmp_path/'corpus', docs=10, seed=2)
    assert main(['parse', str(tmp_path/'corpus'), '--out', str(tmp_path/'corpus'/'parsed.jsonl')]) == 0
    first = (tmp_path/'corpus'/'parsed.jsonl').read_text(encoding='utf-8')
    assert main(['parse', str(tmp_path/'corpus'), '--out', str(tmp_path/'corpus'/'parsed.jsonl')]) == 0
    assert (tmp_path/'corpus'/'parsed.jsonl').read_text(encoding='utf-8') == first


# --- bad input: exit 2, one line on stderr naming the file and the position, no output file ----------------------

def bad_parse(tmp_path, *inputs) -> str:
    r = legalnb('parse', *inputs, '--out', tmp_path/'out.jsonl', '--strict')
    assert r.returncode == 2 and r.stdout == ''
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and 'Traceback' not in r.stderr, r.stderr
    assert not (tmp_path/'out.jsonl').exists() and not list(tmp_path.glob('.out.jsonl*'))
    return lines[0]


def test_malformed_xml(tmp_path):
    write_sample(tmp_path/'corpus', docs=3, seed=0)
    act = sorted((tmp_path/'corpus').rglob('*.xml'))[1]
    lines = act.read_text(encoding='utf-8').splitlines()
    lines[1] = lines[1].replace('</TITLE>', '</TITEL>', 1)
    act.write_text('\n'.join(lines), encoding='utf-8')
    msg = bad_parse(tmp_path, tmp_path/'corpus')
    assert str(act) in msg and 'line 2, column' in msg and 'malformed XML: mismatched tag' in msg


@pytest.mark.parametrize('content, want', [
    (b'{"text": "ok", "lang": "en"}\n{"text": "cut', 'line 2: not JSON'),
    (b'{"text": "ok", "lang": "en"}\n\n{"lang": "en", "title": "no text"}\n', 'line 3: missing or empty "text"'),
    (b'{"text": "caf\xe9", "lang": "fr"}\n', 'line 1: byte 14 is not UTF-8'),
    (b'{"text": "ok", "lang": "en", "date": "31/12/2020"}\n', "line 1: date '31/12/2020' is not a valid yyyy-mm-dd date"),
    # issue 11: numeric text is not "missing", and what used to be silently accepted
    (b'{"text": 42, "lang": "en"}\n', 'line 1: "text" must be a string, got a number (42); put the document text in quotes'),
    (b'{"text": "ok", "lang": "en", "title": NaN}\n', 'line 1: "title" must be a string, got NaN'),
    (b'{"text": "ok", "lang": "en", "title": 1.5}\n', 'line 1: "title" must be a string, got a number (1.5)'),
    (b'{"text": "ok", "lang": "zz"}\n', "line 1: \"lang\" 'zz' is not one of the 24 official EU languages; write its ISO 639-1 code: bg, cs"),
    (b'{"text": "ok", "lang": "eng"}\n', "line 1: \"lang\" 'eng' is not one of the 24 official EU languages"),
    (b'{"text": "ok", "lang": "en", "date": "9999-12-31"}\n', "line 1: date '9999-12-31' is outside 1950-"),
    (b'{"text": "ok", "lang": "en", "date": "19491231"}\n', "line 1: date '19491231' is outside 1950-"),
    (b'{"text": "ok", "lang": "en", "text": "twice"}\n', "line 1: duplicate key 'text'; a record names each field once"),
    (b'{"text": "ok", "lang": "en", "subjects": 3}\n', 'line 1: "subjects" must be a list of strings'),
])
def test_bad_jsonl(tmp_path, content, want):
    (tmp_path/'in.jsonl').write_bytes(content)
    msg = bad_parse(tmp_path, tmp_path/'in.jsonl')
    assert f'{tmp_path/"in.jsonl"}, {want}' in msg


def test_empty_and_missing_input(tmp_path):
    (tmp_path/'empty').mkdir(); (tmp_path/'blank.jsonl').write_text('\n\n')
    assert 'no documents found' in bad_parse(tmp_path, tmp_path/'empty')
    assert 'no documents found' in bad_parse(tmp_path, tmp_path/'blank.jsonl')
    assert f'{tmp_path/"nope"}: no such file or folder' in bad_parse(tmp_path, tmp_path/'empty', tmp_path/'nope')


@pytest.mark.parametrize('docs, want', [('0', '--docs must be at least 1, got 0'), ('-3', '--docs must be at least 1, got -3'),
                                         ('many', "--docs: expected a whole number, got 'many'; see legalnb sample --help"),
                                         ('1e400', "--docs: expected a whole number, got '1e400'")])
def test_bad_sample_arguments(tmp_path, docs, want):
    r = legalnb('sample', tmp_path/'new'/'s', '--docs', docs)
    assert r.returncode == 2 and r.stderr.strip().startswith(f'legalnb sample: error: {want}'), r.stderr
    assert list(tmp_path.iterdir()) == []


# --- several processes at once -------------------------------------------------------------------------------

def test_concurrent_writers(tmp_path):
    "Two `legalnb sample` and two `legalnb parse` writing the same paths at once: complete results, no leftovers."
    reference = tmp_path/'ref'; write_sample(reference, docs=25, seed=9)
    cmd = lambda *a: subprocess.Popen([sys.executable, '-m', 'legalnb.cli', *map(str, a)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [cmd('sample', tmp_path/'s', '--docs', 25, '--seed', 9) for _ in range(2)]
    codes, errs = [p.wait(timeout=120) for p in procs], [p.stderr.read() for p in procs]
    assert sorted(codes) in ([0, 0], [0, 2]), errs   # one at a time: a second writer is refused while the first writes
    assert all(f'{tmp_path/"s"} is being written by pid ' in e for c, e in zip(codes, errs) if c), errs
    assert tree_digest(tmp_path/'s') == tree_digest(reference)
    procs = [cmd('parse', tmp_path/'s', '--out', tmp_path/'parsed.jsonl') for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0], [p.stderr.read() for p in procs]
    assert len((tmp_path/'parsed.jsonl').read_text(encoding='utf-8').splitlines()) == len({(d.celex, d.lang) for d in read_documents(reference)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ['parse_report.json', 'parsed.jsonl', 'ref', 's'], 'no temporary files or folders left'


def test_renamed_publications_in_one_folder(tmp_path):
    "Formex 4 files renamed after download (their DOCUMENT.REF no longer names the wrapper): matched by number and language."
    pubs = [p for p in sample_publications(80, seed=5) if p[2] == 4 and p[0].annex][:3]
    assert len(pubs) == 3
    for i, (act, lang, fmx, uid) in enumerate(pubs):
        for rel, xml in _Writer(act, lang, fmx).publication(uid): (tmp_path/f'{i}_{Path(rel).name}').write_text(xml, encoding='utf-8')
    docs = list(read_formex(tmp_path))
    assert sorted((d.celex, d.lang, d.date, tuple(d.subjects)) for d in docs) == sorted((a.celex, l, a.day, tuple(a.subjects)) for a, l, _, _ in pubs)
    assert all(d.text.count('\n\n') == 1 for d in docs), 'each act with exactly its own annex'


def test_non_utf8_xml(tmp_path):
    write_sample(tmp_path/'corpus', docs=2, seed=0)
    act = sorted((tmp_path/'corpus').rglob('*.xml'))[1]
    data = act.read_bytes().split(b'\n')
    data[1] = data[1].replace('é'.encode(), b'\xe9', 1).replace(b'<TITLE>', b'<TITLE>\xff', 1)
    act.write_bytes(b'\n'.join(data))
    msg = bad_parse(tmp_path, tmp_path/'corpus')
    assert f'{act}, line 2, column' in msg and 'malformed XML: not well-formed (invalid token)' in msg


# --- issue 11: outputs that are inputs, deep XML, failures that leave nothing new ----------------------------------

def test_parse_refuses_an_output_that_is_an_input(tmp_path):
    (tmp_path/'in.jsonl').write_text('{"text": "ok", "lang": "en"}\n')
    r = legalnb('parse', tmp_path/'in.jsonl', '--out', tmp_path/'in.jsonl')
    assert r.returncode == 2 and f'--out {tmp_path/"in.jsonl"} is also an input' in r.stderr and len(r.stderr.splitlines()) == 1
    assert (tmp_path/'in.jsonl').read_text() == '{"text": "ok", "lang": "en"}\n' and len(list(tmp_path.iterdir())) == 1


def test_parse_refuses_an_output_that_is_a_formex_file_it_reads(tmp_path):
    write_sample(tmp_path/'corpus', docs=2, seed=0)
    act = sorted((tmp_path/'corpus').rglob('*.xml'))[1]
    before = tree_digest(tmp_path/'corpus')
    r = legalnb('parse', tmp_path/'corpus', '--out', act)
    assert r.returncode == 2 and f'--out {act} is a Formex file of an input folder' in r.stderr, r.stderr
    assert tree_digest(tmp_path/'corpus') == before


def test_deeply_nested_xml_is_one_line(tmp_path):
    "XML nested ~1000 levels deep once ended in a RecursionError traceback."
    act = tmp_path/'act.xml'
    act.write_text('<ACT><BIB.INSTANCE><LG.DOC>EN</LG.DOC></BIB.INSTANCE><ENACTING.TERMS>' + '<P>' * 1000 + 'x' + '</P>' * 1000
                   + '</ENACTING.TERMS></ACT>')
    msg = bad_parse(tmp_path, act)
    assert msg.startswith(f'legalnb parse: error: {act}: elements nested too deeply'), msg


def test_formex_language_must_be_an_eu_one(tmp_path):
    write_sample(tmp_path/'corpus', docs=1, seed=0)
    for p in (tmp_path/'corpus').rglob('*.xml'):
        p.write_text(p.read_text(encoding='utf-8').replace('<LG.DOC>', '<LG.DOC>X').replace('<LG.OJ>', '<LG.OJ>X'), encoding='utf-8')
    assert "is not one of the 24 official EU languages" in bad_parse(tmp_path, tmp_path/'corpus')


def test_failed_parse_into_a_new_folder_leaves_no_folder(tmp_path):
    (tmp_path/'in.jsonl').write_text('{"text": "ok", "lang": "en"}\n{"text": 42, "lang": "en"}\n')
    r = legalnb('parse', tmp_path/'in.jsonl', '--out', tmp_path/'new'/'deeper'/'parsed.jsonl', '--strict')
    assert r.returncode == 2 and 'line 2: "text" must be a string' in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ['in.jsonl']


def test_failed_sample_into_a_new_folder_leaves_nothing(tmp_path):
    "A sample that fails halfway (here: a file-size limit, as a full disk would) leaves no folder, temporary or made for it."
    import resource, signal
    def small_files():   # in the child: files may not grow past 20 kB, and going past is an error, not a signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN); resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
    r = subprocess.run([sys.executable, '-m', 'legalnb.cli', 'sample', str(tmp_path/'new'/'deeper'/'s'), '--docs', '50'],
                       capture_output=True, text=True, timeout=120, preexec_fn=small_files)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and 'Traceback' not in r.stderr, r.stderr
    assert f'{tmp_path/"new"/"deeper"/"s"}: could not be written (File too large)' in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_failed_sample_keeps_the_earlier_sample(tmp_path):
    import resource, signal
    write_sample(tmp_path/'s', docs=5, seed=0)
    before = tree_digest(tmp_path/'s')
    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN); resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
    r = subprocess.run([sys.executable, '-m', 'legalnb.cli', 'sample', str(tmp_path/'s'), '--docs', '50'],
                       capture_output=True, text=True, timeout=120, preexec_fn=small_files)
    assert r.returncode == 2 and tree_digest(tmp_path/'s') == before and sorted(p.name for p in tmp_path.iterdir()) == ['s']


def test_sample_folder_mode_follows_the_umask(tmp_path):
    import os, stat
    write_sample(tmp_path/'s', docs=2, seed=0)
    umask = os.umask(0o22); os.umask(umask)
    assert stat.S_IMODE((tmp_path/'s').stat().st_mode) == 0o777 & ~umask


def test_sample_and_parse_flags_are_kept():
    "Every flag the commands had before they were declared as functions is still there."
    from legalnb.options import command_parser
    from legalnb.sources import ParseConfig
    from legalnb.sample import SampleConfig
    want = json.loads((Path(__file__).parent/'fixtures'/'cli_flags.json').read_text())
    for name, func in (('sample', SampleConfig), ('parse', ParseConfig)):
        have = {o for a in command_parser(func, f'legalnb {name}')._actions for o in a.option_strings}
        assert set(want[name]) <= have, (name, set(want[name]) - have)


# --- issue 12: real EUR-Lex -----------------------------------------------------------------------------------------
OURS = Path(__file__).resolve().parent/'fixtures'/'formex'   # real publications kept in the repo (README there)

def article_headings(text: str) -> int:
    "Article headings of the enacting terms: lines 'Article 5', 'Artikel 12a', before the first annex."
    return len(re.findall(r'^(?:Article|Artikel) \d+[a-z]?$', text.split('\nANNEX\n')[0], re.M))

REAL = {  # CELEX: (folder, type, date, language, title start, articles, a sentence of an article, one of an annex)
    '02009R0810-20200202': (OURS/'02009R0810-20200202-de', 'regulation', '2020-02-02', 'de',
                            'Verordnung (EG) Nr. 810/2009 des Europäischen Parlaments und des Rates vom 13. Juli 2009 über einen Visakodex', 69,
                            'Mit dieser Verordnung werden die Verfahren und Voraussetzungen und für die Erteilung von Visa für geplante Aufenthalte',
                            'Besondere Regelung zur Erleichterung der Erteilung von Visa für die Mitglieder der olympischen Familie'),
    '02014L0065-20200326': (OURS/'02014L0065-20200326-de', 'directive', '2020-03-26', 'de', 'Richtlinie', 20,
                            'Diese Richtlinie gilt für Wertpapierfirmen, Marktbetreiber, Datenbereitstellungsdienste und Drittlandfirmen',
                            'Artikel 62a Absatz 1 | Artikel 87 Absatz 1'),
    '32011R1319': (OURS/'32011R1319-en', 'regulation', '2011-12-15', 'en',
                   'Commission Implementing Regulation (EU) No 1319/2011 of 15 December 2011 fixing representative prices in the poultrymeat', 2,
                   'This Regulation shall enter into force on the day of its publication in the Official Journal of the European Union.',
                   '35021190 | Egg albumin, dried | 498,7 | 0 | AR’'),
    '32016R0679': (OURS/'32016R0679-en-act-only', 'regulation', '2016-04-27', 'en',
                   'Regulation (EU) 2016/679 of the European Parliament and of the Council of 27 April 2016 on the protection of natural persons', 6,
                   'In addition to the information referred to in paragraph 1, the controller shall provide the data.', None),
    '32024R0903': (FIXTURES/'c008bcb6-e7ec-11ee-9ea8-01aa75ed71a1.0006.02', 'regulation', '2024-03-13', 'en',
                   'Regulation (EU) 2024/903 of the European Parliament and of the Council of 13 March 2024 laying down measures', 23,
                   'This Regulation lays down measures that promote the cross-border interoperability', 'COMMON CHECKLIST FOR INTEROPERABILITY ASSESSMENT REPORTS'),
    '32008R1137': (FIXTURES/'e115172d-3ab3-4b14-b0a4-dfdcc9871793.0006.04', 'regulation', '2008-10-22', 'en',
                   'Regulation (EC) No 1137/2008 of the European Parliament and of the Council of 22 October 2008 adapting', 3,
                   'The instruments listed in the Annex are hereby adapted, in accordance with that Annex, to Decision 1999/468/EC', 'Chronological Index'),
}

@needs_fixtures
@pytest.mark.parametrize('celex', REAL)
def test_real_publication(celex):
    "Each real publication, read from its folder: CELEX, type, date, language, title, articles, a sentence of an article and of an annex."
    folder, doc_type, day, lang, title, n_articles, in_article, in_annex = REAL[celex]
    [doc] = read_formex(folder)
    assert (doc.celex, doc.doc_type, str(doc.date), doc.lang) == (celex, doc_type, day, lang)
    assert doc.title.startswith(title) and doc.title not in doc.text[:len(doc.title) + 50], 'the title once, not at the start of the text'
    assert article_headings(doc.text) == n_articles
    assert in_article in doc.text
    if in_annex: assert in_annex in doc.text and doc.text.index(in_annex) > doc.text.index(in_article)
    assert doc.base_celex == ('3' + celex[1:10] if celex.startswith('0') else '')
    assert not re.search(r'</?[A-Z]', doc.text) and '  ' not in doc.text and not re.search(r'^[;:,.]$', doc.text, re.M)


def test_real_publication_fixtures_are_small_and_documented():
    files = [p for p in OURS.rglob('*') if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 2e6
    readme = (OURS/'README.md').read_text(encoding='utf-8')
    assert '2011/833/EU' in readme and all(p.parent.name in readme for p in files if p.suffix == '.xml')


def test_consolidated_text_never_takes_a_component_celex(tmp_path):
    "FAM.COMP lists the component acts with their NO.CELEX, some in the old 8-character form: none of them is the text's CELEX."
    src = (OURS/'02009R0810-20200202-de').glob('*.xml').__next__().read_text(encoding='utf-8')
    assert src.count('<NO.CELEX>32009R0810</NO.CELEX>') == 1
    (tmp_path/'cons').mkdir()
    (tmp_path/'cons'/'act.xml').write_text(src.replace('<NO.CELEX>32009R0810</NO.CELEX>', '<NO.CELEX>302L0058</NO.CELEX>'), encoding='utf-8')
    [doc] = read_formex(tmp_path/'cons')
    assert (doc.celex, doc.base_celex, doc.date) == ('02009R0810-20200202', '32009R0810', date(2020, 2, 2))


def test_consolidated_and_base_act_are_both_kept(tmp_path):
    "A consolidated text is not a duplicate of its base act: parse keeps both, counted."
    base = {'celex': '32009R0810', 'text': 'Artikel 1', 'lang': 'de', 'doc_type': 'regulation'}
    (tmp_path/'base.jsonl').write_text(json.dumps(base) + '\n', encoding='utf-8')
    assert main(['parse', str(OURS/'02009R0810-20200202-de'), str(tmp_path/'base.jsonl'), '--out', str(tmp_path/'p.jsonl')]) == 0
    recs = {r['celex']: r for r in map(json.loads, (tmp_path/'p.jsonl').read_text(encoding='utf-8').splitlines())}
    assert sorted(recs) == ['02009R0810-20200202', '32009R0810'] and recs['02009R0810-20200202']['base_celex'] == '32009R0810'
    assert json.loads((tmp_path/'parse_report.json').read_text())['counters']['consolidated'] == 1


def test_batch_survives_bad_publications(tmp_path):
    "Good, consolidated, wrapper-less, foreign-language and broken publications and a bad JSONL line: every readable one is read."
    pubs = tmp_path/'pubs'
    shutil.copytree(OURS, pubs)
    write_sample(tmp_path/'sample', docs=12, seed=1); shutil.copytree(tmp_path/'sample', pubs/'sample')
    (pubs/'truncated').mkdir(); (pubs/'truncated'/'act.xml').write_text('<ACT><PREAMBLE><P>The European')
    (pubs/'ca').mkdir(); (pubs/'ca'/'act.xml').write_text('<ACT><BIB.INSTANCE><LG.DOC>CA</LG.DOC></BIB.INSTANCE><FINAL><P>Fet.</P></FINAL></ACT>')
    (pubs/'wrapper-only').mkdir(); shutil.copy(OURS/'32011R1319-en'/'DOC_1.xml', pubs/'wrapper-only'/'DOC_1.xml')
    (pubs/'pl').mkdir()
    (pubs/'pl'/'act.xml').write_text('<ACT><BIB.INSTANCE><LG.DOC>PL</LG.DOC><NO.DOC><NO.CURRENT>947</NO.CURRENT><YEAR>2019</YEAR></NO.DOC>'
                                     '</BIB.INSTANCE><TITLE><TI><P>Rozporządzenie wykonawcze Komisji (UE) 2019/947</P></TI></TITLE>'
                                     '<ENACTING.TERMS><ARTICLE><TI.ART>Artykuł 1</TI.ART><ALINEA>Przedmiot</ALINEA></ARTICLE></ENACTING.TERMS></ACT>',
                                     encoding='utf-8')
    (tmp_path/'more.jsonl').write_text('{"text": "ok", "lang": "sv"}\n{"text": "cut\n')
    r = legalnb('parse', pubs, tmp_path/'more.jsonl', '--out', tmp_path/'out'/'parsed.jsonl')
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in (tmp_path/'out'/'parsed.jsonl').read_text(encoding='utf-8').splitlines()]
    report = json.loads((tmp_path/'out'/'parse_report.json').read_text(encoding='utf-8'))
    assert len(recs) == 4 + 12 + 1 + 1 == report['documents']
    pl = next(x for x in recs if x['lang'] == 'pl')
    assert (pl['celex'], pl['doc_type']) == ('32019R0947', 'regulation'), 'no wrapper, Polish title: the type and CELEX are known'
    assert sorted((Path(x['source']).name, x['reason']) for x in report['skipped_items']) == [
        ('DOC_1.xml', 'no_act'), ('README.md', 'text_file'), ('act.xml', 'bad_language'), ('more.jsonl, line 2', 'not_json'),
        ('truncated', 'malformed_xml')]
    assert 'skipped 4 publications or lines that could not be read: bad_language 1, malformed_xml 1, no_act 1, not_json 1' in r.stdout
    assert '1 are not documents: text_file 1' in r.stdout, "the fixtures' README is named for what it is, not read"
    # --strict: the first one stops the run, nothing is written
    r = legalnb('parse', pubs, '--out', tmp_path/'strict'/'parsed.jsonl', '--strict')
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and 'without --strict it would be skipped' in r.stderr
    assert not (tmp_path/'strict').exists()


def test_language_codes_and_type_words_of_the_24_languages(tmp_path):
    from legalnb.sources import EU_LANGUAGES, TITLE_WORDS, doc_type_from_title, formex_document
    import xml.etree.ElementTree as ET
    assert len(EU_LANGUAGES) == 24
    for lang in EU_LANGUAGES:   # LG.DOC holds the upper-case ISO 639-1 code (the Formex schema's t_language)
        act = ET.fromstring(f'<ACT><BIB.INSTANCE><LG.DOC>{lang.upper()}</LG.DOC></BIB.INSTANCE><FINAL><P>x</P></FINAL></ACT>')
        assert formex_document(Path('a.xml'), act).lang == lang
    for doc_type, words in TITLE_WORDS.items():   # a word for every type in every language (some have two)
        assert len(words.split()) >= 24
        for w in words.split(): assert doc_type_from_title(f'{w.upper()} (EU) 2019/1') == doc_type, (w, doc_type)
    assert doc_type_from_title('Rozporządzenie delegowane Komisji (UE) 2019/945') == 'regulation'
    assert doc_type_from_title('Nařízení Komise (EU) 2019/947') == 'regulation'
    assert doc_type_from_title('Komission delegoitu asetus (EU) 2019/945') == 'regulation'
    assert doc_type_from_title('Europaparlamentets och rådets direktiv (EU) 2019/1024') == 'directive'


def test_sample_has_ten_languages_and_each_reads_back(tmp_path):
    manifest = write_sample(tmp_path/'s', docs=300, seed=0)
    langs = {p['lang'] for p in manifest['publications']}
    assert len(langs) >= 10 and set(SAMPLE_LANGUAGES) == langs
    docs = list(read_documents(tmp_path/'s'))
    assert {d.lang for d in docs} == langs and all(d.doc_type != 'other' for d in docs)


def test_quotes_footnotes_and_punctuation(tmp_path):
    "An amendment quoted as the AI Act quotes them: the closing mark in the footnote goes to the end of the quotation."
    from legalnb.sources import formex_text
    import xml.etree.ElementTree as ET
    el = ET.fromstring('<ALINEA><P>the following point is added:</P><QUOT.S><P><QUOT.START CODE="2018" ID="QS1" REF.END="QE1"/>'
                       '(c) Regulation (EU) 2018/858 of the European Parliament and of the Council<NOTE NOTE.ID="E1"><P>OJ L 151, '
                       '14.6.2018, p. 1.<QUOT.END CODE="2019" ID="QE1" REF.START="QS1"/></P></NOTE>, the requirements set out in '
                       'Chapter III</P></QUOT.S>;</ALINEA>')
    text = formex_text(el)
    assert text.split('\n')[1] == '‘(c) Regulation (EU) 2018/858 of the European Parliament and of the Council, the requirements set out in Chapter III’;'
    assert 'Council’' not in text and not re.search(r'^;$', text, re.M)
    # --notes keeps footnote text after the document, counted; without it, dropped and counted
    assert main(['parse', str(OURS/'32011R1319-en'), '--out', str(tmp_path/'a.jsonl')]) == 0
    dropped = json.loads((tmp_path/'parse_report.json').read_text())['counters']
    assert main(['parse', str(OURS/'32011R1319-en'), '--out', str(tmp_path/'b.jsonl'), '--notes']) == 0
    kept = json.loads((tmp_path/'parse_report.json').read_text())['counters']
    assert dropped["notes.dropped"] == kept["notes.kept"] == 5
    a, b = (json.loads((tmp_path/f).read_text())['text'] for f in ('a.jsonl', 'b.jsonl'))
    assert b.startswith(a) and 'OJ L 299, 16.11.2007, p. 1.' in b[len(a):] and 'OJ L 299' not in a


def test_parallel_parse_writes_the_same_bytes(tmp_path):
    write_sample(tmp_path/'s', docs=100, seed=6)
    assert main(['parse', str(tmp_path/'s'), '--out', str(tmp_path/'one.jsonl'), '--num-proc', '1']) == 0
    assert main(['parse', str(tmp_path/'s'), '--out', str(tmp_path/'two.jsonl'), '--num-proc', '2']) == 0
    assert (tmp_path/'one.jsonl').read_bytes() == (tmp_path/'two.jsonl').read_bytes()


def test_bench_parse_prints_its_table(tmp_path):
    bench = Path(__file__).resolve().parents[1]/'bench'
    (tmp_path/'bench').symlink_to(bench, target_is_directory=True)
    r = subprocess.run([sys.executable, str(tmp_path/'bench'/'parse.py'), '--docs', '150', '--num-proc', '2'],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert '| etree (floor)' in r.stdout and '| parse, 1 proc' in r.stdout and '| parse, 2 procs' in r.stdout
    assert 'output byte-identical: True' in r.stdout and r.stdout.startswith('# bench/parse.py  20')


# --- issue 27: XHTML and HTML beside Formex, batches that resume -----------------------------------------------
XHTML = Path(__file__).resolve().parent/'fixtures'/'xhtml'   # real OJ XHTML, consolidated HTML, EUR-Lex pages (NOTICE.md there)


@needs_fixtures
def test_the_same_act_in_formex_and_xhtml():
    "Regulation (EU) 2024/903 as the OJ published it in XHTML and in Formex 6: the same text up to layout (small capitals)."
    from legalnb.sources import html_document
    pub = FIXTURES/'c008bcb6-e7ec-11ee-9ea8-01aa75ed71a1.0006.02'
    for notes in (False, True):
        (fmx,) = read_formex(pub, notes=notes)
        oj = html_document(XHTML/'32024R0903-en'/'DOC_1.html', notes=notes)
        assert (oj.celex, oj.lang, oj.date, oj.doc_type) == (fmx.celex, fmx.lang, fmx.date, fmx.doc_type)
        assert oj.text.casefold().split('\n') == fmx.text.casefold().split('\n'), 'line for line'
        assert sum(a != b for a, b in zip(oj.text.split('\n'), fmx.text.split('\n'))) == 2   # R. METSOLA, H. LAHBIB


def test_xhtml_in_every_language_and_the_consolidated_html_equals_its_formex():
    "Facts from the page in English, French and German; a consolidated version's HTML and Formex give the same text."
    from legalnb.sources import html_document
    work = XHTML/'cellar'/'32017r1799'/'versions'
    docs = {(d.celex, d.lang): d for d in read_documents(work) if Path(d.source).suffix in ('.xml', '.html')}
    assert sorted(docs) == [(c, l) for c in ('02017R1799-20190710', '02017R1799-20210101', '32017R1799') for l in ('en', 'fr')]
    assert docs['32017R1799', 'fr'].title.startswith('RÈGLEMENT DÉLÉGUÉ (UE) 2017/1799 DE LA COMMISSION du 12 juin 2017')
    assert docs['32017R1799', 'fr'].date == date(2017, 6, 12) and docs['02017R1799-20210101', 'en'].base_celex == '32017R1799'
    for version in ('2019-07-10', '2021-01-01'):
        for lang in ('en', 'fr'):
            (fmx,) = read_formex(work/version/f'{lang}.fmx4')
            assert html_document(work/version/f'{lang}.html').text == fmx.text, (version, lang)
    de = html_document(XHTML/'lexparency-de'/'32002F0584-de.html')
    assert (de.celex, de.lang, de.date) == ('32002F0584', 'de', date(2002, 6, 13))


def test_a_cellar_folder_mixing_formex_and_xhtml(tmp_path):
    "Every file of a CELLAR-style folder is read or skipped with a reason naming what it is; no XHTML is blamed for Formex."
    shutil.copytree(XHTML, tmp_path/'dump'/'xhtml'); shutil.copytree(OURS, tmp_path/'dump'/'formex')
    write_sample(tmp_path/'dump'/'sample', docs=30, seed=2)
    (tmp_path/'dump'/'scan.pdf').write_bytes(b'%PDF-1.4 ...'); (tmp_path/'dump'/'bundle.zip').write_bytes(b'PK\x03\x04...')
    r = legalnb('parse', tmp_path/'dump', '--out', tmp_path/'parsed.jsonl', '--batch-files', '16')
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path/'parse_report.json').read_text(encoding='utf-8'))
    files = sum(v for k, v in report['counters'].items() if k.startswith('files.'))
    assert files == sum(1 for p in (tmp_path/'dump').rglob('*') if p.is_file())
    reasons = {Path(x['source']).name: x['reason'] for x in report['skipped_items']}
    assert reasons == {'L_202400348FR.317101.fmx.tif': 'image', 'scan.pdf': 'pdf', 'bundle.zip': 'archive', 'README.md': 'text_file',
                       'NOTICE.md': 'text_file', 'en.html': 'notice_page'}
    assert not any('LG.DOC' in x['error'] for x in report['skipped_items'])
    recs = [json.loads(l) for l in (tmp_path/'parsed.jsonl').read_text(encoding='utf-8').splitlines()]
    kinds = {Path(x['source']).suffix for x in recs}
    assert {'.html', '.xml'} <= kinds and report['counters']['files.html'] >= 13 and report['counters']['versions.acts'] >= 2
    assert 'versions:' in r.stdout and 'are not documents: archive 1, image 1, notice_page 1, pdf 1, text_file 2' in r.stdout


def test_a_killed_parse_resumes_where_it_stopped(tmp_path):
    "`legalnb parse` killed (SIGKILL) after a few batches: run again, it keeps the finished batches and writes the same bytes."
    import signal, time
    write_sample(tmp_path/'s', docs=240, seed=11)
    n_files = sum(1 for p in (tmp_path/'s').rglob('*') if p.is_file())
    assert legalnb('parse', tmp_path/'s', '--out', tmp_path/'whole.jsonl', '--batch-files', '8').returncode == 0
    parts = tmp_path/'.parsed.jsonl.parts'
    p = subprocess.Popen([sys.executable, '-m', 'legalnb.cli', 'parse', str(tmp_path/'s'), '--out', str(tmp_path/'parsed.jsonl'),
                          '--batch-files', '8', '--num-proc', '1'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    # the bound only stops a hung parse: under load, 60 s could pass before the fifth batch, and the kill came too early
    while len(list(parts.glob('0*.json'))) < 5 and time.time() - t0 < 900 and p.poll() is None: time.sleep(0.01)
    p.send_signal(signal.SIGKILL); p.wait()
    done = len(list(parts.glob('0*.json')))
    assert 5 <= done < n_files // 8 and not (tmp_path/'parsed.jsonl').exists(), 'killed half-way: some batches finished'
    r = legalnb('parse', tmp_path/'s', '--out', tmp_path/'parsed.jsonl', '--batch-files', '8')
    assert r.returncode == 0, r.stderr
    kept = int(re.search(r'resumed: (\d+) of (\d+) batches', r.stdout)[1])
    assert done - 1 <= kept <= done, 'a batch whose marker was half-written is read again'
    assert (tmp_path/'parsed.jsonl').read_bytes() == (tmp_path/'whole.jsonl').read_bytes() and not parts.exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ['parse_report.json', 'parsed.jsonl', 's', 'whole.jsonl']
