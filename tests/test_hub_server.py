"""The Hub stand-in (tests/hub_server.py) answers the installed huggingface_hub: downloads with patterns, datasets,
each error class, whoami, create_repo, upload_folder (also to a branch), and a child process through HF_ENDPOINT."""
import os, subprocess, sys, urllib.error, urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, RemoteEntryNotFoundError,
                                    RepositoryNotFoundError, RevisionNotFoundError)

from hub_server import GITATTRIBUTES, HubStandIn, blob_id

MODEL = {'config.json': b'{"dim": 8}', 'model.safetensors': b'\x00' * 4096, 'tokenizer/tokenizer.json': b'{"v": 1}',
         'pytorch_model.bin': b'pickled', 'modeling.py': b'import os', 'README.md': b'# tiny'}


@pytest.fixture
def hub(monkeypatch):
    "A fresh stand-in with the tiny model; the client's offline switch off (other test files set HF_HUB_OFFLINE)."
    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', False)
    with HubStandIn(token='hf_test', user='legal-org') as hub:
        hub.add_repo('legal-org/tiny', MODEL)
        yield hub


def tree(folder) -> dict[str, bytes]:
    "{relative path: bytes} of the files under `folder`."
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in Path(folder).rglob('*') if p.is_file()}


def test_snapshot_with_patterns_fetches_only_those(hub, tmp_path):
    path = snapshot_download('legal-org/tiny', allow_patterns=['*.safetensors', '*.json'], cache_dir=tmp_path,
                             endpoint=hub.url, token=hub.token)
    assert tree(path) == {k: v for k, v in MODEL.items() if k.endswith(('.safetensors', '.json'))}
    assert Path(path).name == hub.repos[('model', 'legal-org/tiny')].branches['main']   # the snapshot of main's commit
    touched = [p for m, p in hub.requests if '/resolve/' in p]
    assert len(touched) == 6 and not [p for p in touched if p.endswith(('.bin', '.py', '.md'))]


def test_dataset_snapshot_and_upload_file(hub, tmp_path):
    sha = hub.add_repo('legal-org/corpus', {'data/train.jsonl': b'{"text": "a"}\n', 'README.md': b'# corpus'},
                       repo_type='dataset')
    path = snapshot_download('legal-org/corpus', repo_type='dataset', cache_dir=tmp_path, endpoint=hub.url,
                             token=hub.token)
    assert Path(path).name == sha and tree(path) == hub.files('legal-org/corpus', repo_type='dataset')
    assert ('GET', '/datasets/legal-org/corpus/resolve/' + sha + '/data/train.jsonl') in hub.requests
    HfApi(endpoint=hub.url, token=hub.token).upload_file(path_or_fileobj=b'x\n', path_in_repo='data/test.jsonl',
                                                         repo_id='legal-org/corpus', repo_type='dataset')
    assert hub.files('legal-org/corpus', repo_type='dataset')['data/test.jsonl'] == b'x\n'
    assert hub.files('legal-org/corpus', repo_type='dataset', revision=sha) == tree(path)   # the old commit stays


def test_hf_hub_download_one_file_and_range(hub, tmp_path):
    path = hf_hub_download('legal-org/tiny', 'tokenizer/tokenizer.json', cache_dir=tmp_path, endpoint=hub.url,
                           token=hub.token)
    assert Path(path).read_bytes() == MODEL['tokenizer/tokenizer.json']
    assert [m for m, p in hub.requests] == ['HEAD', 'GET']
    url = f'{hub.url}/legal-org/tiny/resolve/main/config.json'
    request = urllib.request.Request(url, headers={'Range': 'bytes=1-4'})
    with urllib.request.urlopen(request) as r:
        assert (r.status, r.read(), r.headers['ETag']) == (206, b'"dim', f'"{blob_id(MODEL["config.json"])}"')


def test_errors_map_to_the_client_classes(hub, tmp_path):
    hub.add_repo('legal-org/gated', {'config.json': b'{}'}, gated=True)
    hub.add_repo('legal-org/secret', {'config.json': b'{}'}, private=True)
    get = lambda repo, name='config.json', **kw: hf_hub_download(repo, name, cache_dir=tmp_path, endpoint=hub.url, **kw)
    with pytest.raises(RepositoryNotFoundError): get('legal-org/absent', token=hub.token)
    with pytest.raises(RepositoryNotFoundError): snapshot_download('legal-org/absent', cache_dir=tmp_path,
                                                                   endpoint=hub.url, token=hub.token)
    with pytest.raises(RevisionNotFoundError): get('legal-org/tiny', revision='v9', token=hub.token)
    with pytest.raises(RevisionNotFoundError): snapshot_download('legal-org/tiny', revision='v9', cache_dir=tmp_path,
                                                                 endpoint=hub.url, token=hub.token)
    with pytest.raises(RemoteEntryNotFoundError): get('legal-org/tiny', 'absent.json', token=hub.token)
    assert issubclass(RemoteEntryNotFoundError, EntryNotFoundError)
    with pytest.raises(GatedRepoError): get('legal-org/gated', token=False)
    with pytest.raises(GatedRepoError): get('legal-org/gated', token='hf_wrong')
    assert Path(get('legal-org/gated', token=hub.token)).read_bytes() == b'{}'
    assert HfApi(endpoint=hub.url, token=False).model_info('legal-org/gated').gated == 'auto'   # info stays public
    with pytest.raises(RepositoryNotFoundError) as e: get('legal-org/secret', token=False)
    assert not isinstance(e.value, GatedRepoError)
    assert HfApi(endpoint=hub.url, token=hub.token).model_info('legal-org/secret').private is True


def test_whoami_with_and_without_the_token(hub):
    assert HfApi(endpoint=hub.url, token=hub.token).whoami()['name'] == 'legal-org'
    with pytest.raises(HfHubHTTPError) as e: HfApi(endpoint=hub.url, token='hf_wrong').whoami()
    assert e.value.response.status_code == 401
    with pytest.raises(urllib.error.HTTPError) as e: urllib.request.urlopen(f'{hub.url}/api/whoami-v2')
    assert e.value.code == 401


def test_create_repo_and_upload_folder(hub, tmp_path):
    api = HfApi(endpoint=hub.url, token=hub.token)
    url = api.create_repo('legal-org/pushed')
    assert url.repo_id == 'legal-org/pushed' and hub.files('legal-org/pushed') == {'.gitattributes': GITATTRIBUTES}
    with pytest.raises(HfHubHTTPError) as e: api.create_repo('legal-org/pushed')
    assert e.value.response.status_code == 409
    assert api.create_repo('legal-org/pushed', exist_ok=True).repo_id == 'legal-org/pushed'
    with pytest.raises(HfHubHTTPError) as e: HfApi(endpoint=hub.url, token='hf_wrong').create_repo('legal-org/other')
    assert e.value.response.status_code == 401
    folder = tmp_path/'model'; (folder/'shards').mkdir(parents=True)
    local = {'config.json': b'{"dim": 8}', 'shards/model.safetensors': os.urandom(1 << 20)}
    for name, content in local.items(): (folder/name).write_bytes(content)
    info = api.upload_folder(folder_path=folder, repo_id='legal-org/pushed', commit_message='push')
    assert info.oid == hub.repos[('model', 'legal-org/pushed')].branches['main']
    assert hub.files('legal-org/pushed') == {**local, '.gitattributes': GITATTRIBUTES}
    assert sorted(api.list_repo_files('legal-org/pushed')) == ['.gitattributes', *sorted(local)]
    assert not [p for m, p in hub.requests if 'lfs' in p or 'xet' in p]
    commits = len(hub.repos[('model', 'legal-org/pushed')].commits)
    api.upload_folder(folder_path=folder, repo_id='legal-org/pushed')   # unchanged files: no new commit
    assert len(hub.repos[('model', 'legal-org/pushed')].commits) == commits
    with pytest.raises(HfHubHTTPError) as e:
        HfApi(endpoint=hub.url, token='hf_wrong').upload_folder(folder_path=folder, repo_id='legal-org/pushed')
    assert e.value.response.status_code == 401


def test_upload_folder_to_a_branch(hub, tmp_path):
    api = HfApi(endpoint=hub.url, token=hub.token)
    (tmp_path/'weights.safetensors').write_bytes(b'v1')
    api.create_branch('legal-org/tiny', branch='v1')
    api.create_branch('legal-org/tiny', branch='v1', exist_ok=True)
    api.upload_folder(folder_path=tmp_path, repo_id='legal-org/tiny', revision='v1')
    assert hub.files('legal-org/tiny', revision='v1') == {**MODEL, 'weights.safetensors': b'v1'}
    assert hub.files('legal-org/tiny') == MODEL
    assert 'weights.safetensors' in api.list_repo_files('legal-org/tiny', revision='v1')


def test_a_child_process_through_hf_endpoint(hub, tmp_path):
    code = ('from huggingface_hub import snapshot_download; '
            f'print(snapshot_download("legal-org/tiny", allow_patterns=["*.json"], cache_dir={str(tmp_path)!r}))')
    out = subprocess.run([sys.executable, '-c', code], env=hub.environ(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert tree(out.stdout.strip()) == {k: v for k, v in MODEL.items() if k.endswith('.json')}
    assert any(p.startswith('/api/models/legal-org/tiny') for m, p in hub.requests)
