"End-to-end tests of the sources stage: real Formex fixtures, the sample generator, `legalnb sample` / `legalnb parse`, bad input."
import hashlib, json, re, subprocess, sys
from datetime import date
from pathlib import Path

import pytest

from legalnb.cli import main
from legalnb.sources import read_documents, read_formex, write_sample, _Writer, sample_publications

FIXTURES = Path(__file__).resolve().parents[2]/'shared'/'fixtures'/'formex'
needs_fixtures = pytest.mark.skipif(not FIXTURES.exists(), reason=f'real Formex fixtures not found at {FIXTURES} (../shared beside the repo)')
OJ_REF = re.compile(r'\b(OJ|ABl\.|JO|DO|GU) [CL] \d+')


def legalnb(*args) -> subprocess.CompletedProcess:
    "Run the `legalnb` command in a fresh interpreter, as a user would."
    return subprocess.run([sys.executable, '-m', 'legalnb.cli', *map(str, args)], capture_output=True, text=True, timeout=120)


def tree_digest(folder: Path) -> str:
    "One hash over the names and bytes of every file under `folder`."
    h = hashlib.sha256()
    for p in sorted(folder.rglob('*')):
        if p.is_file(): h.update(str(p.relative_to(folder)).encode() + b'\0' + p.read_bytes())
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
    assert 'set up by Article 58 of Regulation (EC) No 178/2002 of the European Parliament and of the Council’' in old
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
    annex_word = {'en': 'ANNEX', 'de': 'ANHANG', 'fr': 'ANNEXE', 'es': 'ANEXO', 'pt': 'ANEXO', 'it': 'ALLEGATO'}
    assert all(d.text.count(f'\n{annex_word[d.lang]}\n') == 1 for d in docs), 'each act gets its own annex, once'


# --- legalnb sample -> legalnb parse ----------------------------------------------------------------------------

def test_sample_parse_round_trip(tmp_path):
    r = legalnb('sample', tmp_path/'corpus', '--docs', 60, '--seed', 8)   # seed 8: three publications delivered twice
    assert r.returncode == 0 and 'wrote 60 Formex publications' in r.stdout, r.stderr
    (tmp_path/'extra.jsonl').write_text(json.dumps({'text': 'Artículo 1. Texto.', 'lang': 'es', 'celex': '32020R0001'}) + '\n'
                                        + json.dumps({'text': 'Article 1', 'lang': 'en', 'date': None}) + '\n', encoding='utf-8')
    r = legalnb('parse', tmp_path/'corpus', tmp_path/'extra.jsonl', '--out', tmp_path/'parsed.jsonl')
    assert r.returncode == 0, r.stderr
    recs = [json.loads(l) for l in (tmp_path/'parsed.jsonl').read_text(encoding='utf-8').splitlines()]
    manifest = json.loads((tmp_path/'corpus'/'sample.json').read_text())
    unique = {(p['celex'], p['lang']) for p in manifest['publications']}
    dups = len(manifest['publications']) - len(unique)
    assert dups == 3
    assert len(recs) == len(unique) + 2 and len({(x['celex'], x['lang']) for x in recs if x['celex']}) == len(unique) + 1
    assert all(set(x) == {'celex', 'title', 'text', 'lang', 'date', 'doc_type', 'subjects', 'source'} for x in recs)
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
    r = legalnb('parse', *inputs, '--out', tmp_path/'out.jsonl')
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
    assert [p.wait(timeout=120) for p in procs] == [0, 0], [p.stderr.read() for p in procs]
    assert tree_digest(tmp_path/'s') == tree_digest(reference)
    procs = [cmd('parse', tmp_path/'s', '--out', tmp_path/'parsed.jsonl') for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0], [p.stderr.read() for p in procs]
    assert len((tmp_path/'parsed.jsonl').read_text(encoding='utf-8').splitlines()) == len(list(read_documents(reference)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ['parsed.jsonl', 'ref', 's'], 'no temporary files or folders left'


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
    r = legalnb('parse', tmp_path/'in.jsonl', '--out', tmp_path/'new'/'deeper'/'parsed.jsonl')
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
    from legalnb.core import command_parser
    from legalnb.sources import sample_command, parse_command
    want = json.loads((Path(__file__).parent/'fixtures'/'cli_flags.json').read_text())
    for name, func in (('sample', sample_command), ('parse', parse_command)):
        have = {o for a in command_parser(func, f'legalnb {name}')._actions for o in a.option_strings}
        assert set(want[name]) <= have, (name, set(want[name]) - have)
