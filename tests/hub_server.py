"""A local stand-in for the Hugging Face Hub HTTP API (127.0.0.1 only), answering the installed `huggingface_hub`.

Point the client at it with `endpoint=hub.url` (`HfApi(endpoint=..., token=...)`, `snapshot_download(endpoint=...)`,
`hf_hub_download(endpoint=...)`) or, in a child process, with `hub.environ()` (`HF_ENDPOINT`, `HF_TOKEN`, offline mode
off). State lives in memory: repos -> commits (sha -> {path: bytes}) and branches (name -> sha).

What it answers, as the Hub does for what the client reads (huggingface_hub 2.4, read from its source):
- `GET /api/whoami-v2`: the user and its orgs for the one valid token; 401 otherwise.
- `GET /api/{models|datasets}/{ns}/{name}[/revision/{rev}]`: repo info (`sha`, `siblings` with `rfilename`, `size`,
  `blobId`, `private`, `gated`, `lastModified`, ...).
- `GET /api/{type}s/{repo}/tree/{rev}[/{path}]?recursive=`: files (`type`, `oid`, `size`, `path`) and directories.
- `HEAD|GET /[datasets/]{repo}/resolve/{rev}/{path}`: the bytes, `X-Repo-Commit`, `ETag` (the git blob id),
  `Content-Length`; `Range: bytes=a-[b]` answered with 206. No Xet headers (`X-Xet-Hash`), so `hf_hub_download`
  takes its plain HTTP path, and no redirect.
- `POST /api/repos/create` (`name`, `organization`, `type`, `visibility`): a repo whose first commit holds a
  `.gitattributes` as the Hub writes it (GITATTRIBUTES); 409 when it exists (`create_repo(exist_ok=True)` passes).
- `POST /api/validate-yaml`: a README's metadata checked before a commit that holds it (`card_errors`: YAML, a
  licence id, language codes, the model-index's required fields): 400 with `errors`, as the Hub refuses a bad card.
- `POST /api/{type}s/{repo}/preupload/{rev}`: `uploadMode` "regular" for every file, with the `oid` of the file
  already there, so the client sends contents base64 in the commit and skips unchanged files. Nothing goes
  through LFS or Xet (`upload_folder` with `hf_xet` installed still only calls preupload + commit then).
- `POST /api/{type}s/{repo}/commit/{branch}` (application/x-ndjson: `header`, `file`, `deletedFile`,
  `deletedFolder`): a new commit on the branch; `lfsFile` is refused (400) since preupload never asks for LFS.
- `POST /api/{type}s/{repo}/branch/{branch}` (`startingPoint`): a new branch (409 when it exists).
Errors carry `X-Error-Code` as the client maps them: RepoNotFound (a missing repo, or a private one without the
token: 401 without a valid token, 404 with it), RevisionNotFound, EntryNotFound (404), GatedRepo (401: a gated repo's
files without the token; its info and tree stay public as on the Hub), 401 "Invalid credentials in Authorization
header" for a bad or missing token on whoami and on every write, 403 for a write outside the user's namespaces.
Repo ids are always `namespace/name`. `requests` keeps (method, unquoted path) of every request served.
"""
from __future__ import annotations
import base64, hashlib, itertools, json, os, threading, urllib.parse
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TYPES = {'models': 'model', 'datasets': 'dataset'}   # URL segment -> repo_type
PREFIX = {'model': '', 'dataset': 'datasets/'}      # repo_type -> prefix of its web and resolve URLs
GITATTRIBUTES = b'*.bin filter=lfs diff=lfs merge=lfs -text\n*.safetensors filter=lfs diff=lfs merge=lfs -text\n'
BAD_TOKEN = 'Invalid credentials in Authorization header'   # the message the client keeps from RepoNotFound


def blob_id(content: bytes) -> str:
    "The git blob id (sha1 of `blob <size>\\0` + content): the Hub's `oid` and `ETag` of a regular file."
    return hashlib.sha1(b'blob %d\0' % len(content) + content).hexdigest()


LICENSES = {'apache-2.0', 'mit', 'cc-by-4.0', 'cc-by-sa-4.0', 'cc-by-nc-4.0', 'cc0-1.0', 'eupl-1.1', 'eupl-1.2',
            'gpl-3.0', 'llama3', 'other', 'unknown'}   # a few of the Hub's licence ids


def card_errors(text: str) -> list[str]:
    "What the Hub would refuse in a card's YAML block: unreadable YAML, an unknown licence, a language that is not a "
    "code, a model-index without name, task type, dataset and metric values."
    import yaml
    if not text.startswith('---\n'): return []
    try: meta = yaml.safe_load(text.split('---\n', 2)[1]) or {}
    except yaml.YAMLError as e: return [f'"yaml" is not valid YAML: {e}']
    errors = []
    if 'license' in meta and meta['license'] not in LICENSES: errors.append(f'"license" must be one of the Hub\'s ids')
    for lang in [meta['language']] if isinstance(meta.get('language'), str) else meta.get('language') or []:
        if not (isinstance(lang, str) and 2 <= len(lang) <= 3 and lang.isalpha()): errors.append(f'"language" {lang}')
    for m in meta.get('model-index') or []:
        if not m.get('name'): errors.append('"model-index[].name" is required')
        for r in m.get('results') or [None]:
            if not (r and r.get('task', {}).get('type') and r.get('dataset', {}).get('type')
                    and r.get('dataset', {}).get('name') and r.get('metrics')):
                errors.append('"model-index[].results[]" needs task.type, dataset.type, dataset.name and metrics')
            for x in (r or {}).get('metrics') or []:
                if not x.get('type') or not isinstance(x.get('value'), (int, float, str)):
                    errors.append('"model-index[].results[].metrics[]" needs type and value')
    return errors


def _now() -> str:
    "The time now in the Hub's format ('2024-05-01T12:00:00.000Z')."
    return datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%S.000Z')


class HubError(Exception):
    """An error answer: status, X-Error-Code (or None), message; `commit` adds X-Repo-Commit (a missing file's
    commit), `extra` fields to the JSON body (a 409 on create names the repo's `url`: create_repo(exist_ok) reads
    it)."""
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.commit, self.extra = status, code, message, commit, extra


class Repo:
    "One repo: its commits (sha -> {path: bytes}), branches (name -> sha) and flags."
    def __init__(self, repo_id: str, repo_type: str, private: bool, gated: bool):
        self.id, self.type, self.private, self.gated = repo_id, repo_type, private, gated
        self.commits: dict[str, dict[str, bytes]] = {}
        self.branches: dict[str, str] = {}
        self.created = self.modified = _now()

    def resolve(self, revision: str) -> str:
        "The commit sha `revision` (a branch or a full commit sha) names; RevisionNotFound otherwise."
        if revision in self.branches: return self.branches[revision]
        if revision in self.commits: return revision
        raise HubError(404, 'RevisionNotFound', f'Invalid rev id: {revision}')


class HubStandIn:
    """The server: `with HubStandIn(token='hf_test', user='legal-org') as hub:` starts it on 127.0.0.1, a free port.

    `token` is the one valid token, `user` whoami's name (writes are allowed in `user`'s namespace and in `orgs`').
    """
    def __init__(self, token: str = 'hf_test', user: str = 'legal-org', orgs: tuple[str, ...] = ()):
        self.token, self.user, self.orgs = token, user, tuple(orgs)
        self.repos: dict[tuple[str, str], Repo] = {}   # (repo_type, repo_id) -> Repo
        self.requests: list[tuple[str, str]] = []       # (method, unquoted path) of every request served
        self.lock = threading.RLock()
        self._counter = itertools.count()
        self.server = ThreadingHTTPServer(('127.0.0.1', 0), _Handler)
        self.server.daemon_threads, self.server.hub = True, self
        self.url = f'http://127.0.0.1:{self.server.server_address[1]}'
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name='hub-stand-in')
        self._thread.start()

    def __enter__(self): return self
    def __exit__(self, *exc): self.close()

    def close(self):
        "Stops the server and frees its port."
        self.server.shutdown(); self.server.server_close()

    def environ(self, base: dict | None = None) -> dict[str, str]:
        "`base` (default os.environ) for a child process using this hub: HF_ENDPOINT, HF_TOKEN, offline mode off."
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if k not in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE', 'HF_DATASETS_OFFLINE')}
        return {**env, 'HF_ENDPOINT': self.url, 'HF_TOKEN': self.token}

    # -- state -------------------------------------------------------------------------------------------------

    def add_repo(self, repo_id: str, files: dict[str, bytes], repo_type: str = 'model', gated: bool = False,
                 private: bool = False) -> str:
        "A repo with `files` committed on 'main' (replacing one of that id); returns the commit sha (40 hex)."
        assert repo_id.count('/') == 1 and repo_type in PREFIX, f'namespace/name of a model or dataset: {repo_id}'
        with self.lock:
            repo = self.repos[(repo_type, repo_id)] = Repo(repo_id, repo_type, private, gated)
            return self._commit(repo, 'main', dict(files), 'initial commit')

    def files(self, repo_id: str, repo_type: str = 'model', revision: str = 'main') -> dict[str, bytes]:
        "What repo `repo_id` holds at `revision` (a branch or a commit sha): {path: bytes}."
        with self.lock:
            repo = self.repos[(repo_type, repo_id)]
            return dict(repo.commits[repo.resolve(revision)])

    def _commit(self, repo: Repo, branch: str, files: dict[str, bytes], summary: str) -> str:
        "Records `files` as the new head of `branch`; returns the new commit's sha."
        parent = repo.branches.get(branch, '')
        listing = ''.join(f'{p}\0{blob_id(c)}\n' for p, c in sorted(files.items()))
        sha = hashlib.sha1(f'{repo.id}\n{parent}\n{summary}\n{next(self._counter)}\n{listing}'.encode()).hexdigest()
        repo.commits[sha], repo.branches[branch], repo.modified = files, sha, _now()
        return sha

    # -- access ------------------------------------------------------------------------------------------------

    def authorized(self, headers) -> bool:
        "Whether the request carries `Authorization: Bearer <the valid token>`."
        return headers.get('Authorization', '') == f'Bearer {self.token}'

    def readable(self, repo_type: str, repo_id: str, headers) -> Repo:
        "The repo, when it exists and the request may see it; RepoNotFound (401 without the token) otherwise."
        repo = self.repos.get((repo_type, repo_id))
        if repo is None or repo.private and not self.authorized(headers):
            raise HubError(404 if self.authorized(headers) else 401, 'RepoNotFound', 'Repository not found')
        return repo

    def writable(self, repo_type: str, repo_id: str, headers) -> Repo:
        "The repo, when the request holds the token and the repo's namespace is the user's or an org's."
        self.check_token(headers)
        repo = self.readable(repo_type, repo_id, headers)
        if repo_id.split('/')[0] not in (self.user, *self.orgs):
            raise HubError(403, None, f'You have read access but not the required permissions for {repo_id}')
        return repo

    def check_token(self, headers):
        "401 unless the request holds the valid token."
        if not self.authorized(headers): raise HubError(401, None, BAD_TOKEN)


def _split(path: str) -> list[str]:
    "The path's segments, each unquoted (a revision or tree path quoted with safe='' stays one segment)."
    return [urllib.parse.unquote(s) for s in path.strip('/').split('/')]


def _tree(files: dict[str, bytes], path: str, recursive: bool) -> list[dict]:
    "The tree entries under `path` ('' is the root) as the Hub lists them: directories, then files."
    prefix = f'{path.strip("/")}/' if path.strip('/') else ''
    dirs, entries = set(), []
    for p, content in sorted(files.items()):
        if not p.startswith(prefix): continue
        parts = p[len(prefix):].split('/')
        for i in range(1, len(parts) if recursive else min(len(parts), 2)):
            dirs.add(prefix + '/'.join(parts[:i]))
        if recursive or len(parts) == 1:
            entries.append({'type': 'file', 'oid': blob_id(content), 'size': len(content), 'path': p})
    folders = [{'type': 'directory', 'oid': hashlib.sha1(d.encode()).hexdigest(), 'size': 0, 'path': d}
               for d in sorted(dirs)]
    return folders + entries


class _Handler(BaseHTTPRequestHandler):
    "Routes each request to the hub's answer; every answer has a Content-Length (HTTP/1.1 keep-alive)."
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args): pass

    @property
    def hub(self) -> HubStandIn: return self.server.hub

    def do_GET(self): self._serve('GET')
    def do_HEAD(self): self._serve('HEAD')
    def do_POST(self): self._serve('POST')

    def _body(self) -> bytes:
        "The request body (Content-Length or chunked)."
        if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':
            out = b''
            while size := int(self.rfile.readline().split(b';')[0].strip() or b'0', 16):
                out += self.rfile.read(size); self.rfile.readline()
            while self.rfile.readline() not in (b'\r\n', b'\n', b''): pass
            return out
        return self.rfile.read(int(self.headers.get('Content-Length') or 0))

    def _serve(self, method: str):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        body = self._body() if method == 'POST' else b''
        with self.hub.lock: self.hub.requests.append((method, urllib.parse.unquote(url.path)))
        try:
            with self.hub.lock: status, headers, payload = self._route(method, url.path, query, body)
        except HubError as e:
            status, payload = e.status, json.dumps({'error': e.message, **e.extra}).encode()
            headers = {'Content-Type': 'application/json', 'X-Error-Message': e.message,
                       **({'X-Error-Code': e.code} if e.code else {}),
                       **({'X-Repo-Commit': e.commit} if e.commit else {})}
        self.send_response(status)
        headers.setdefault('Content-Length', str(len(payload)))
        for k, v in headers.items(): self.send_header(k, v)
        self.end_headers()
        if method != 'HEAD': self.wfile.write(payload)

    def _json(self, data, status: int = 200):
        return status, {'Content-Type': 'application/json'}, json.dumps(data).encode()

    def _route(self, method: str, path: str, query: dict, body: bytes):
        "(status, headers, payload) for a request; raises HubError for the Hub's error answers."
        seg, hub = _split(path), self.hub
        if seg[:2] == ['api', 'whoami-v2'] and method == 'GET': return self._whoami()
        if seg[:3] == ['api', 'repos', 'create'] and method == 'POST': return self._create(json.loads(body or b'{}'))
        if seg[:2] == ['api', 'validate-yaml'] and method == 'POST': return self._validate(json.loads(body or b'{}'))
        if len(seg) >= 4 and seg[0] == 'api' and seg[1] in TYPES:
            repo_type, repo_id, rest = TYPES[seg[1]], '/'.join(seg[2:4]), seg[4:] or ['']
            if method == 'GET' and (rest == [''] or rest[0] == 'revision' and len(rest) == 2):   # model_info et al.
                return self._info(hub.readable(repo_type, repo_id, self.headers), rest[1] if rest[0] else 'main')
            if method == 'GET' and rest[0] == 'tree' and len(rest) >= 2:
                repo = hub.readable(repo_type, repo_id, self.headers)
                recursive = query.get('recursive', '').lower() in ('true', '1')
                return self._list(repo, rest[1], '/'.join(rest[2:]), recursive)
            if method == 'POST' and rest[0] == 'preupload' and len(rest) == 2:
                return self._preupload(hub.writable(repo_type, repo_id, self.headers), rest[1], json.loads(body))
            if method == 'POST' and rest[0] == 'commit' and len(rest) == 2:
                return self._commit(hub.writable(repo_type, repo_id, self.headers), rest[1], query, body)
            if method == 'POST' and rest[0] == 'branch' and len(rest) == 2:
                return self._branch(hub.writable(repo_type, repo_id, self.headers), rest[1], json.loads(body or b'{}'))
        repo_type, start = ('dataset', 1) if seg[0] == 'datasets' else ('model', 0)
        if method in ('GET', 'HEAD') and len(seg) >= start + 5 and seg[start + 2] == 'resolve':
            repo = hub.readable(repo_type, '/'.join(seg[start:start + 2]), self.headers)
            return self._resolve(repo, seg[start + 3], '/'.join(seg[start + 4:]))
        raise HubError(404, None, f'The stand-in does not answer {method} {path}')

    def _validate(self, payload: dict):
        "A README's metadata checked as the Hub checks a card before a commit: 400 with the errors, else 200."
        errors = card_errors(payload.get('content') or '')
        return self._json({'errors': [{'message': m} for m in errors], 'warnings': []}, 400 if errors else 200)

    def _whoami(self):
        self.hub.check_token(self.headers)
        orgs = [{'type': 'org', 'name': name, 'roleInOrg': 'write'} for name in self.hub.orgs]
        return self._json({'type': 'user', 'id': hashlib.sha1(self.hub.user.encode()).hexdigest()[:24],
                           'name': self.hub.user, 'fullname': self.hub.user, 'orgs': orgs,
                           'auth': {'type': 'access_token', 'accessToken': {'displayName': 'test', 'role': 'write'}}})

    def _create(self, payload: dict):
        hub = self.hub
        hub.check_token(self.headers)
        repo_type = payload.get('type') or 'model'
        repo_id = f"{payload.get('organization') or hub.user}/{payload['name']}"
        url = f'{hub.url}/{PREFIX[repo_type]}{repo_id}'
        if repo_id.split('/')[0] not in (hub.user, *hub.orgs):
            raise HubError(403, None, f'You do not have the rights to create a repo in {repo_id.split("/")[0]}')
        if (repo_type, repo_id) in hub.repos:
            raise HubError(409, None, f'You already created this {repo_type} repo', url=url)
        repo = hub.repos[(repo_type, repo_id)] = Repo(repo_id, repo_type, payload.get('visibility') == 'private', False)
        hub._commit(repo, 'main', {'.gitattributes': GITATTRIBUTES}, 'initial commit')
        return self._json({'url': url, 'name': repo_id, 'id': repo_id})

    def _info(self, repo: Repo, revision: str):
        sha, (ns, name) = repo.resolve(revision), repo.id.split('/')
        siblings = [{'rfilename': p, 'size': len(c), 'blobId': blob_id(c)}
                    for p, c in sorted(repo.commits[sha].items())]
        return self._json({'_id': hashlib.sha1(repo.id.encode()).hexdigest()[:24], 'id': repo.id, 'author': ns,
                           'sha': sha, 'lastModified': repo.modified, 'createdAt': repo.created,
                           'private': repo.private, 'gated': 'auto' if repo.gated else False, 'disabled': False,
                           'downloads': 0, 'likes': 0, 'tags': [], 'siblings': siblings,
                           'usedStorage': sum(s['size'] for s in siblings)})

    def _list(self, repo: Repo, revision: str, path: str, recursive: bool):
        files = repo.commits[repo.resolve(revision)]
        if path and path not in files and not any(p.startswith(path.rstrip('/') + '/') for p in files):
            raise HubError(404, 'EntryNotFound', f'{path} does not exist on "{revision}"')
        return self._json(_tree(files, path, recursive))

    def _resolve(self, repo: Repo, revision: str, path: str):
        sha = repo.resolve(revision)
        if repo.gated and not self.hub.authorized(self.headers):
            raise HubError(401, 'GatedRepo', f'Access to {repo.type} {repo.id} is restricted. You must have access '
                                             'to it and be authenticated to access it. Please log in.')
        if path not in repo.commits[sha]: raise HubError(404, 'EntryNotFound', 'Entry not found', commit=sha)
        content = repo.commits[sha][path]
        headers = {'Content-Type': 'application/octet-stream', 'X-Repo-Commit': sha, 'Accept-Ranges': 'bytes',
                   'ETag': f'"{blob_id(content)}"'}
        wanted = self.headers.get('Range', '')
        if wanted.startswith('bytes=') and '-' in wanted and ',' not in wanted:
            first, last = wanted[6:].split('-')
            first, last = int(first or 0), min(int(last) if last else len(content) - 1, len(content) - 1)
            headers['Content-Range'] = f'bytes {first}-{last}/{len(content)}'
            return 206, headers, content[first:last + 1]
        return 200, headers, content

    def _preupload(self, repo: Repo, revision: str, payload: dict):
        files = repo.commits[repo.resolve(revision)]
        return self._json({'files': [{'path': f['path'], 'uploadMode': 'regular', 'shouldIgnore': False,
                                      'oid': blob_id(files[f['path']]) if f['path'] in files else None}
                                     for f in payload['files']]})

    def _commit(self, repo: Repo, branch: str, query: dict, body: bytes):
        if query.get('create_pr') == '1': raise HubError(400, None, 'The stand-in does not open pull requests')
        if branch not in repo.branches: raise HubError(404, 'RevisionNotFound', f'Invalid rev id: {branch}')
        files, summary = dict(repo.commits[repo.branches[branch]]), ''
        for line in filter(None, body.splitlines()):
            item = json.loads(line); key, value = item['key'], item['value']
            if key == 'header':
                summary = value.get('summary', '')
                if value.get('parentCommit') not in (None, repo.branches[branch]):
                    raise HubError(412, None, f'A commit has happened since {value["parentCommit"]}')
            elif key == 'file': files[value['path']] = base64.b64decode(value['content'])
            elif key == 'deletedFile':
                if files.pop(value['path'], None) is None:
                    raise HubError(404, 'EntryNotFound', f'{value["path"]} does not exist')
            elif key == 'deletedFolder':
                for p in [p for p in files if p.startswith(value['path'].rstrip('/') + '/')]: del files[p]
            else: raise HubError(400, None, f'The stand-in answers preupload "regular" only; it got a {key} operation')
        sha = self.hub._commit(repo, branch, files, summary)
        return self._json({'success': True, 'commitOid': sha, 'hookOutput': '',
                           'commitUrl': f'{self.hub.url}/{PREFIX[repo.type]}{repo.id}/commit/{sha}'})

    def _branch(self, repo: Repo, branch: str, payload: dict):
        if branch in repo.branches: raise HubError(409, None, f'Reference already exists: refs/heads/{branch}')
        repo.branches[branch] = repo.resolve(payload.get('startingPoint') or 'main')
        return self._json({})
