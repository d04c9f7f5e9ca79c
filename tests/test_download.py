"legalnb download against a local stand-in for CELLAR (tests/cellar_server.py): no test touches the network."
import hashlib, io, json, os, random, signal, subprocess, sys, time, zipfile
from pathlib import Path

import pytest

from cellar_server import Cellar, formex_zip, FIXTURES
from legalnb.cli import main
from legalnb.download import MANIFEST, NOTICE, read_manifest

ROOT = Path(__file__).parent.parent
QUICK = ['--backoff', '0.01', '--retry-after-max', '1.5', '--no-progress']


def files(folder: Path) -> dict:
    "Every file under `folder` but legalnb's hidden bookkeeping, with its bytes."
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob('*'))
            if p.is_file() and not any(part.startswith('.') for part in p.relative_to(folder).parts)}


def without_times(m: dict) -> dict:
    return dict(m, items=[{k: v for k, v in e.items() if k != 'fetched'} for e in m['items']])


def sha(data: bytes) -> str: return hashlib.sha256(data).hexdigest()


def test_a_query_gives_a_folder_that_parse_reads_and_a_second_run_fetches_nothing(tmp_path, capsys):
    out = tmp_path/'eurlex'
    with Cellar() as cellar:
        assert main(['download', '--out', str(out), '--types', 'regulation,directive', '--since', '2011-01-01',
                     '--languages', 'en', *cellar.flags(), *QUICK]) == 0
        printed = capsys.readouterr().out
        got = files(out)
        assert {'en/32011R1319/DOC_2.xml', 'en/32016R0679/L_2016119EN.01000101.xml',
                'en/32024R0903/32024R0903.xhtml', MANIFEST, NOTICE} <= set(got)
        assert not any(k.startswith('de/') or '12002E055' in k for k in got), 'not asked: German, a treaty article'
        m = read_manifest(out)
        assert [(e['celex'], e['lang'], e['format']) for e in m['items']] == [
            ('32011R1319', 'en', 'fmx4'), ('32016R0679', 'en', 'fmx4'), ('32024R0903', 'en', 'xhtml')]
        for e in m['items']:
            assert e['uri'].startswith('http://publications.europa.eu/resource/cellar/')
            assert all(sha(got[f'{e["path"]}/{n}']) == h and len(got[f'{e["path"]}/{n}']) == size
                       for n, size, h in e['files'])
        assert m['items'][0]['sha256'] == sha(formex_zip(FIXTURES/'formex'/'32011R1319-en'))
        assert '2011/833/EU' in got[NOTICE].decode() and m['failed'] == []
        assert 'legalnb download: 3 documents' in printed
        gets = [path for _, method, path, _ in cellar.log if method == 'GET']
        assert len(gets) == 3 and all(h['User-Agent'].startswith('legalnb/') for *_, h in cellar.log)
        assert {h['Accept'] for _, m_, p, h in cellar.log if p.endswith('/zip')} == {'application/zip;mtype=fmx4'}
        assert {h['Accept-Language'] for _, m_, p, h in cellar.log if m_ == 'GET'} == {'eng'}
        assert main(['download', '--out', str(out), '--types', 'regulation,directive', '--since', '2011-01-01',
                     '--languages', 'en', *cellar.flags(), *QUICK]) == 0
        assert len([1 for _, method, *_ in cellar.log if method == 'GET']) == 3, 'the second run fetched nothing'
        assert files(out) == got, 'the same query twice: the same folder, byte for byte'
    assert main(['parse', str(out), '--out', str(tmp_path/'parsed.jsonl'), '--no-progress']) == 0
    docs = [json.loads(l) for l in (tmp_path/'parsed.jsonl').read_text().splitlines()]
    assert sorted((d['celex'], d['lang']) for d in docs) == [('32011R1319', 'en'), ('32016R0679', 'en'),
                                                             ('32024R0903', 'en')]
    assert sorted(d['cellar'] for d in docs) == sorted(e['uri'] for e in m['items']), 'provenance in each document'


def test_a_celex_list_fetches_what_exists_and_names_what_does_not(tmp_path, capsys):
    out, listed = tmp_path/'acts', tmp_path/'list.txt'
    listed.write_text('# acts for the test\n12002E055\n\n32099r9999   # no such act\n')
    with Cellar() as cellar:
        assert main(['download', '--out', str(out), '--celex', '32016R0679', '--celex-file', str(listed),
                     '--languages', 'en,fr', *cellar.flags(), *QUICK]) == 1
    printed = capsys.readouterr().out
    m = read_manifest(out)
    assert [(e['celex'], e['lang'], e['format']) for e in m['items']] == [('12002E055', 'fr', 'html'),
                                                                           ('32016R0679', 'en', 'fmx4')]
    assert [(f['celex'], f['lang'], f['reason']) for f in m['failed']] == [
        ('12002E055', 'en', 'no text in en in fmx4, xhtml, html'),
        ('32016R0679', 'fr', 'no text in fr in fmx4, xhtml, html'),
        ('32099R9999', '', 'not in CELLAR (no act with this CELEX)')]
    assert '3 failed' in printed and 'failed: 32099R9999 : not in CELLAR' in printed
    assert (out/'fr'/'12002E055'/'12002E055.html').read_bytes().lstrip().lower().startswith((b'<!doctype', b'<html'))


def test_bad_flags_are_one_line(tmp_path, capsys):
    for argv, says in [(['--celex', 'nonsense'], '--celex:'), (['--celex', '32016R0679', '--types', 'regulation'],
                                                              'drop --types'),
                       (['--celex-file', str(tmp_path/'missing.txt')], 'cannot be read'),
                       (['--languages', 'xx'], 'official EU language'), (['--sparql', 'ftp://x'], 'http(s) URL')]:
        assert main(['download', '--out', str(tmp_path/'o'), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path/'o').exists()


def test_a_dry_run_counts_and_writes_nothing(tmp_path, capsys):
    with Cellar() as cellar:
        assert main(['download', '--out', str(tmp_path/'o'), '--languages', 'en,de', '--consolidated', '--dry-run',
                     *cellar.flags(), *QUICK]) == 0
        assert not any(m == 'GET' for _, m, *_ in cellar.log)
    printed = capsys.readouterr().out
    assert 'would fetch 4 documents (4 acts)' in printed and 'directive      de         1' in printed
    assert 'regulation     en         3' in printed and not (tmp_path/'o').exists()


def test_429_with_retry_after_500_and_a_dropped_connection_are_retried(tmp_path):
    out = tmp_path/'o'
    with Cellar() as cellar:
        busy, flaky = cellar.item_path('32011R1319', 'en', 'fmx4'), cellar.item_path('32016R0679', 'en', 'fmx4')
        cut = cellar.item_path('32024R0903', 'en', 'xhtml')
        cellar.plan = {busy: [('status', 429, {'Retry-After': '1'})], flaky: [('status', 500), ('status', 503)],
                       cut: ['cut']}
        assert main(['download', '--out', str(out), '--languages', 'en', '--types', 'regulation', *cellar.flags(),
                     *QUICK]) == 0
        times = [t for t, m, p, _ in cellar.log if p == busy]
        assert len(times) == 2 and times[1] - times[0] >= 0.95, 'Retry-After: 1 waited'
        assert len([p for _, _, p, _ in cellar.log if p == flaky]) == 3
        assert len([p for _, _, p, _ in cellar.log if p == cut]) == 2, 'the body broke off; fetched again'
    assert files(out)['en/32024R0903/32024R0903.xhtml'] == (FIXTURES/'xhtml'/'32024R0903-en'/'DOC_1.html').read_bytes()
    assert len(read_manifest(out)['items']) == 3


def _zip(members: dict, link: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w', zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items(): z.writestr(name, data)
        if link:
            info = zipfile.ZipInfo(link); info.external_attr = 0o120777 << 16; z.writestr(info, '/etc/passwd')
    return buf.getvalue()


def test_hostile_and_damaged_responses_are_one_line_each_and_touch_nothing_outside(tmp_path, capsys):
    out, good = tmp_path/'o', formex_zip(FIXTURES/'formex'/'32011R1319-en')
    damage = {'32011R1319': ('body', good[:len(good) // 2], 'application/zip;mtype=fmx4'),
              '32016R0679': ('body', _zip({'../../escaped.xml': '<x/>'}), 'application/zip;mtype=fmx4'),
              '02014L0065-20200326': ('body', _zip({'a.xml': b'\0' * (30 << 20)}), 'application/zip;mtype=fmx4'),
              '32024R0903': ('body', b'{"error": "not a page"}', 'application/json')}
    says = {'32011R1319': 'not a zip archive', '32016R0679': 'outside its folder',
            '02014L0065-20200326': 'zip bomb', '32024R0903': 'expected an XHTML page, got application/json'}
    with Cellar() as cellar:
        paths = {c: cellar.item_path(c, l, f) for c, l, f in cellar.acts if c in damage}
        cellar.plan = {p: [damage[c]] for c, p in paths.items()}
        link = cellar.item_path('12002E055', 'fr', 'html')
        cellar.plan[link] = ['cut'] * 3
        t0 = time.monotonic()
        assert main(['download', '--out', str(out), '--consolidated', '--celex',
                     '32011R1319,32016R0679,32014L0065,32024R0903,12002E055', '--retries', '2', *cellar.flags(),
                     *QUICK]) == 1
        assert time.monotonic() - t0 < 60
        printed = capsys.readouterr()
        lines = [l for l in printed.err.splitlines() + printed.out.splitlines() if l.startswith('legalnb download: ')]
        for celex, why in says.items():
            assert len([l for l in lines if f' {celex} ' in l]) == 1 and any(why in l for l in lines if celex in l), \
                (celex, lines)
        assert any('12002E055 fr' in l and 'connection failed 3 times' in l for l in lines)
        assert sorted(p.name for p in tmp_path.iterdir()) == ['o'], 'nothing written outside the folder'
        assert set(files(out)) == {MANIFEST, NOTICE} and not list(out.glob('.*.tmp')), 'no partial file left'
        assert {f['celex'] for f in read_manifest(out)['failed']} == {*says, '12002E055', '32014L0065'}
        cellar.plan = {}
        (out/'.notes.tmp').write_text('a hidden file of the user')
        argv = ['download', '--out', str(out), '--consolidated', '--celex', '32011R1319', *cellar.flags(), *QUICK]
        capsys.readouterr()
        assert main(argv) == 2 and '.notes.tmp' in capsys.readouterr().err, 'a file legalnb did not write: refused'
        assert (out/'.notes.tmp').read_text() == 'a hidden file of the user'
        (out/'.notes.tmp').unlink()
        assert main(['download', '--out', str(out), '--consolidated', '--celex',
                     '32011R1319,32016R0679,32014L0065,32024R0903,12002E055', *cellar.flags(), *QUICK]) == 1
    m = read_manifest(out)
    assert len(m['items']) == 5 and [f['celex'] for f in m['failed']] == ['32014L0065'], 'the base act: no text'


def _cli(out: Path, cellar: Cellar) -> list[str]:
    return [sys.executable, '-m', 'legalnb.cli', 'download', '--out', str(out), '--languages', 'en,de,fr',
            '--consolidated', '--celex', '32011R1319,32016R0679,32014L0065,32024R0903,12002E055', '--concurrency',
            '1', *cellar.flags(), *QUICK]


def test_kill_9_at_any_moment_then_the_same_command_gives_the_same_folder(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with Cellar(slow=0.4) as cellar:   # each body takes 0.4 s at least: a kill lands mid-body or between items
        subprocess.run(_cli(tmp_path/'whole', cellar), env=env, check=False, capture_output=True)
        whole = files(tmp_path/'whole')
        assert len(read_manifest(tmp_path/'whole')['items']) == 5
        seen = len(cellar.log)
        p = subprocess.Popen(_cli(tmp_path/'o', cellar), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while not any(m == 'GET' for _, m, *_ in cellar.log[seen:]) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(random.uniform(0, 2.0))
        p.send_signal(signal.SIGKILL); p.wait()
        out = tmp_path/'o'
        m = read_manifest(out) or {'items': []}
        now = files(out)
        for e in m['items']:   # what the manifest lists is there, whole
            assert all(sha(now[f'{e["path"]}/{n}']) == h for n, _, h in e['files'])
        assert all(now[k] == whole[k] for k in now if k != MANIFEST), 'no partial file in place'
        subprocess.run(_cli(out, cellar), env=env, check=False, capture_output=True)
    assert set(files(out)) == set(whole) and all(files(out)[k] == whole[k] for k in whole if k != MANIFEST)
    assert without_times(read_manifest(out)) == without_times(read_manifest(tmp_path/'whole'))
    assert not list(out.glob('.*.tmp'))


def test_redirects_are_followed_on_the_same_host_only(tmp_path, capsys):
    with Cellar() as cellar:
        here, there = cellar.item_path('32011R1319', 'en', 'fmx4'), cellar.item_path('32016R0679', 'en', 'fmx4')
        cellar.plan = {here: [('redirect', here + '?after=303')], there: [('redirect', 'http://127.0.0.2:9/elsewhere')]}
        assert main(['download', '--out', str(tmp_path/'o'), '--celex', '32011R1319,32016R0679', '--languages', 'en',
                     *cellar.flags(), *QUICK]) == 1
        assert [p for _, m, p, _ in cellar.log if m == 'GET' and p.startswith(here)] == [here, here + '?after=303']
    assert [e['celex'] for e in read_manifest(tmp_path/'o')['items']] == ['32011R1319']
    assert 'redirected to another host (127.0.0.2:9): not followed' in capsys.readouterr().out
