"""A local stand-in for CELLAR (127.0.0.1 only), answering as the Publications Office does, from real files.

SPARQL: a POSTed `query` form answered in the SPARQL 1.1 JSON results format, its filters (CELEX, type pattern,
dates, languages, formats) applied to the acts it holds. Resources: `/resource/cellar/ID/zip` (a Formex
manifestation as a zip) and `/resource/cellar/ID/DOC_1` (an XHTML or HTML item), with CELLAR's content types.
The acts are the repository's real fixtures (Official Journal publications, EUR-Lex; see tests/fixtures/*/NOTICE.md):
Formex zips are made from the real Formex files at start. `plan[path]` lists what the next requests of a path get
(a status with headers, a body cut off, another body, a redirect), to test retries and damage; `log` keeps every request.
"""
from __future__ import annotations
import io, json, re, threading, time, urllib.parse, zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).parent/'fixtures'
CELLAR = 'http://publications.europa.eu/resource/'
LANG3 = {'en': 'ENG', 'fr': 'FRA', 'de': 'DEU'}
TYPES = {'fmx4': 'application/zip;mtype=fmx4', 'xhtml': 'application/xhtml+xml;charset=UTF-8',
         'html': 'text/html;charset=UTF-8'}


def formex_zip(folder: Path) -> bytes:
    "A Formex manifestation as CELLAR zips it: the publication's files at the top of the archive."
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w', zipfile.ZIP_DEFLATED) as z:
        for p in sorted(folder.iterdir()):
            info = zipfile.ZipInfo(p.name, (2024, 1, 1, 0, 0, 0)); info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, p.read_bytes())
    return buf.getvalue()


def real_acts() -> dict:
    "(celex, lang, format) -> (date, cellar id, body) of the real fixtures the server offers."
    f, x = FIXTURES/'formex', FIXTURES/'xhtml'
    return {('32011R1319', 'en', 'fmx4'): ('2011-12-08', '7d1c2a0e-2c1f-11e1-8c3a-01aa75ed71a1.0006.02',
                                          formex_zip(f/'32011R1319-en')),
            ('32016R0679', 'en', 'fmx4'): ('2016-04-27', '3e485e15-11bd-11e6-ba9a-01aa75ed71a1.0006.02',
                                          formex_zip(f/'32016R0679-en-act-only')),
            ('32024R0903', 'en', 'xhtml'): ('2024-03-13', 'c008bcb6-e7ec-11ee-9ea8-01aa75ed71a1.0006.03',
                                           (x/'32024R0903-en'/'DOC_1.html').read_bytes()),
            ('02014L0065-20200326', 'de', 'fmx4'): ('2020-03-26', 'a3a2e1f6-7f3e-11ea-aea8-01aa75ed71a1.0004.02',
                                                   formex_zip(f/'02014L0065-20200326-de')),
            ('12002E055', 'fr', 'html'): ('2002-12-24', 'b9b2c6c8-4e73-4b2a-8d35-1c2a6f0e9a11.0002.01',
                                          (x/'cellar'/'12002e055'/'versions'/'1957-03-25'/'fr.html').read_bytes())}


def _answer(query: str, acts: dict) -> dict:
    "The SPARQL JSON results for `query` over `acts`, its filters read as legalnb writes them."
    pattern = re.search(r'regex\(str\(\?celex\), "([^"]+)"\)', query)
    named = set(re.findall(r'str\(\?celex\) = "([^"]+)"', query))
    starts = re.findall(r'strstarts\(str\(\?celex\), "([^"]+)"\)', query)
    since, until = (re.search(rf'\?date {op} "([\d-]+)"', query) for op in ('>=', '<='))
    langs = set(re.findall(r'/language/([A-Z]{3})>', query))
    formats = set(re.findall(r'"(fmx4|xhtml|html)"', query))
    rows = []
    for (celex, lang, fmt), (day, cid, _) in sorted(acts.items()):
        if pattern and not re.search(pattern.group(1), celex): continue
        if (named or starts) and celex not in named and not any(celex.startswith(s) for s in starts): continue
        if since and day < since.group(1) or until and day > until.group(1): continue
        if LANG3[lang] not in langs or fmt not in formats: continue
        rows.append({'celex': {'type': 'literal', 'value': celex},
                     'date': {'type': 'literal', 'datatype': 'http://www.w3.org/2001/XMLSchema#date', 'value': day},
                     'lang': {'type': 'uri', 'value': f'{CELLAR}authority/language/{LANG3[lang]}'},
                     'format': {'type': 'literal', 'datatype': 'http://www.w3.org/2001/XMLSchema#string', 'value': fmt},
                     'manif': {'type': 'uri', 'value': f'{CELLAR}cellar/{cid}'}})
    return {'head': {'link': [], 'vars': ['celex', 'date', 'lang', 'format', 'manif']},
            'results': {'distinct': False, 'ordered': True, 'bindings': rows}}


class Cellar(ThreadingHTTPServer):
    "The server: `acts` it offers, `plan` of what the next requests of a path get, `log` of (time, method, path, headers)."
    daemon_threads = True

    def __init__(self, acts: dict | None = None, slow: float = 0.0):
        super().__init__(('127.0.0.1', 0), _Handler)
        self.acts, self.plan, self.log, self.slow = acts or real_acts(), {}, [], slow
        self.items = {f'/resource/cellar/{cid}/{"zip" if fmt == "fmx4" else "DOC_1"}': (fmt, body)
                      for (_, _, fmt), (_, cid, body) in self.acts.items()}

    @property
    def sparql(self) -> str: return f'http://127.0.0.1:{self.server_address[1]}/webapi/rdf/sparql'
    @property
    def resource(self) -> str: return f'http://127.0.0.1:{self.server_address[1]}/resource/'

    def flags(self) -> list[str]: return ['--sparql', self.sparql, '--resource', self.resource]

    def item_path(self, celex: str, lang: str, fmt: str) -> str:
        cid = self.acts[celex, lang, fmt][1]
        return f'/resource/cellar/{cid}/{"zip" if fmt == "fmx4" else "DOC_1"}'

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start(); return self

    def __exit__(self, *exc): self.shutdown(); self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *args): pass

    def _send(self, status: int, body: bytes, ctype: str, headers: dict | None = None, cut: int | None = None):
        self.send_response(status)
        self.send_header('Content-Type', ctype); self.send_header('Content-Length', str(len(body)))
        for k, v in (headers or {}).items(): self.send_header(k, v)
        self.end_headers()
        if cut is not None:   # the connection breaks off after `cut` bytes
            self.wfile.write(body[:cut]); self.wfile.flush(); self.close_connection = True
            self.connection.shutdown(2); return
        step = max(len(body) // 10, 1) if self.server.slow else len(body) or 1
        for k in range(0, len(body), step):
            self.wfile.write(body[k:k + step]); self.wfile.flush()
            if self.server.slow: time.sleep(self.server.slow / 10)

    def do_POST(self):
        self.server.log.append((time.monotonic(), 'POST', self.path, dict(self.headers)))
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers.get('Content-Length', 0))).decode())
        if self.path != '/webapi/rdf/sparql' or 'query' not in form:
            return self._send(400, b'bad request', 'text/plain')
        self._send(200, json.dumps(_answer(form['query'][0], self.server.acts)).encode(),
                   'application/sparql-results+json')

    def do_GET(self):
        self.server.log.append((time.monotonic(), 'GET', self.path, dict(self.headers)))
        path = self.path.split('?')[0]
        planned = self.server.plan.get(path) or []
        step = planned.pop(0) if planned else 'ok'
        if isinstance(step, tuple) and step[0] == 'redirect':   # ('redirect', URL): CELLAR's 303 See Other
            return self._send(303, b'', 'text/plain', {'Location': step[1]})
        if path not in self.server.items: return self._send(404, b'<html>Not found</html>', 'text/html')
        fmt, body = self.server.items[path]
        if isinstance(step, tuple) and step[0] == 'status':   # ('status', 429, {'Retry-After': '1'})
            return self._send(step[1], b'busy', 'text/plain', step[2] if len(step) > 2 else None)
        if step == 'cut': return self._send(200, body, TYPES[fmt], cut=len(body) // 2)
        if isinstance(step, tuple) and step[0] == 'body':     # ('body', bytes, content type): another answer
            return self._send(200, step[1], step[2])
        self._send(200, body, TYPES[fmt])
