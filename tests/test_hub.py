"""The Hugging Face Hub both ways (issue 50), against a stand-in of the Hub on 127.0.0.1 (tests/hub_server.py): a
model or a dataset fetched only with --download (or `legalnb fetch`), only the files legalnb reads (no pickle, no
Python), each failure one line; a Hub dataset mixed into a corpus with its revision recorded; an export pushed, and a
repository legalnb did not make refused. No test touches the real Hub."""
import json, os, socket, subprocess, sys
from pathlib import Path

import pytest

from hub_server import HubStandIn

ROOT = Path(__file__).parents[1]
MODEL = 'legal-org/tiny-llama'


def legalnb(args, env: dict, cwd=None) -> subprocess.CompletedProcess:
    "`legalnb ARGS` in a child process (huggingface_hub reads HF_ENDPOINT and HF_HOME when it is imported)."
    return subprocess.run([sys.executable, '-m', 'legalnb.cli', *map(str, args)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def error_line(p: subprocess.CompletedProcess) -> str:
    "The one line a refused command wrote (its exit code 2)."
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr[-2000:])
    return lines[0]


@pytest.fixture(scope='module')
def model_files(tiny_llama) -> dict[str, bytes]:
    "The tiny Llama's files, and what a real repository often holds beside them: a pickle and modelling code."
    files = {p.name: p.read_bytes() for p in tiny_llama.iterdir() if p.is_file()}
    return files | {'pytorch_model.bin': b'a pickle that must never be fetched', 'modeling_tiny.py': b'import os\n',
                    'README.md': b'# tiny\n'}


@pytest.fixture
def hub(model_files):
    with HubStandIn(token='hf_test', user='legal-org') as h:
        h.add_repo(MODEL, model_files)
        h.add_repo('legal-org/gated', model_files, gated=True)
        h.add_repo('legal-org/pickled-only', {k: v for k, v in model_files.items() if k != 'model.safetensors'})
        yield h


@pytest.fixture
def env(hub, tmp_path) -> dict:
    "A child's environment: the stand-in as the Hub, its token, a cache of its own; no offline switch of the user's."
    e = hub.environ(dict(os.environ, PYTHONPATH=str(ROOT)))
    for k in ('HF_HUB_CACHE', 'HUGGINGFACE_HUB_CACHE', 'LEGALNB_HUB_OFFLINE'): e.pop(k, None)
    return e | {'HF_HOME': str(tmp_path/'hf-home')}


def fetched(hub) -> set[str]:
    "The files the stand-in sent (GET of .../resolve/REV/PATH)."
    return {p.split('/resolve/', 1)[1].split('/', 1)[1] for m, p in hub.requests if m == 'GET' and '/resolve/' in p}


def test_fetch_takes_only_what_legalnb_reads(hub, env, tmp_path):
    p = legalnb(['fetch', MODEL], env)
    assert p.returncode == 0, p.stderr
    got = fetched(hub)
    assert 'model.safetensors' in got and 'config.json' in got and 'tokenizer.json' in got
    assert not got & {'pytorch_model.bin', 'modeling_tiny.py', 'README.md'}, got
    snap = Path(p.stdout.split(' in ', 1)[1].split(';')[0])
    assert snap.is_dir() and str(tmp_path/'hf-home'/'hub') in str(snap)
    assert not (snap/'pytorch_model.bin').exists() and not (snap/'modeling_tiny.py').exists()
    assert f'--model {MODEL} reads it' in p.stdout


def test_a_model_is_fetched_with_download_and_never_without(hub, env):
    argv = ['generate', MODEL, '--prompt', 'Article 1', '--max-new-tokens', '4', '--device', 'cpu']
    err = error_line(legalnb(argv, env))
    assert 'no such folder, and no model legal-org/tiny-llama in the Hugging Face cache' in err, err
    assert '--download' in err and not hub.requests   # nothing asked of the Hub without --download
    p = legalnb([*argv, '--download'], env)
    assert p.returncode == 0 and p.stdout.startswith('Article 1'), p.stderr[-2000:]
    assert 'pytorch_model.bin' not in fetched(hub)
    hub.requests.clear()
    assert legalnb(argv, env).returncode == 0 and not hub.requests   # from the cache now, offline


@pytest.mark.parametrize('args,expect', [
    (['legal-org/absent'], 'legal-org/absent: no such model on the Hub ('),
    (['legal-org/gated'], 'legal-org/gated: a gated model: accept its conditions at '),
    ([MODEL, '--revision', 'v9'], "has no revision 'v9' of it"),
    (['legal-org/pickled-only'], 'the Hub has no safetensors weights of it'),
    (['not-a-name'], 'not-a-name: not a name on the Hub; expected org/name'),
])
def test_each_refusal_is_one_line(args, expect, hub, env):
    e = env if args[0] != 'legal-org/gated' else {k: v for k, v in env.items() if k != 'HF_TOKEN'}
    err = error_line(legalnb(['fetch', *args], e))
    assert expect in err, err


def test_no_network_and_a_users_offline_switch_are_one_line_each(env):
    with socket.socket() as s:   # a port nothing listens on: the Hub cannot be reached
        s.bind(('127.0.0.1', 0)); closed = f'http://127.0.0.1:{s.getsockname()[1]}'
    err = error_line(legalnb(['fetch', MODEL], env | {'HF_ENDPOINT': closed}))
    assert f'{MODEL}: cannot reach the Hub at {closed}' in err and 'check the network' in err, err
    err = error_line(legalnb(['fetch', MODEL], env | {'HF_HUB_OFFLINE': '1'}))
    assert 'HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set in your environment' in err, err


@pytest.fixture
def web(hub) -> str:
    "A FineWeb-2-like dataset on the stand-in: a card with configs per language, Parquet files, a loading script."
    import io
    import pyarrow as pa, pyarrow.parquet as pq
    files, card = {}, '---\nconfigs:\n'
    for c, words in (('fra_Latn', "Le droit de l'Union s'applique"), ('deu_Latn', 'Das Recht der Union gilt'),
                     ('ita_Latn', "Il diritto dell'Unione si applica")):
        buf = io.BytesIO()
        pq.write_table(pa.table({'text': [f'{words} {i}. ' * 20 for i in range(60)], 'language': [c] * 60}), buf)
        files[f'data/{c}/train/000_00000.parquet'] = buf.getvalue()
        card += f'- config_name: {c}\n  data_files:\n  - split: train\n    path: data/{c}/train/*\n'
    files |= {'README.md': (card + '---\n# web sample\n').encode(), 'web.py': b'raise SystemExit("never run")\n'}
    return hub.add_repo('legal-org/web-2', files, repo_type='dataset')


def test_a_hub_dataset_is_mixed_in_with_its_revision(hub, env, web, tmp_path):
    sel = tmp_path/'selected.jsonl'
    sel.write_text(''.join(json.dumps(dict(celex=f'3201{i}R00{i:02d}', lang=('fr', 'de')[i % 2], doc_type='regulation',
                                           text=f'Article {i}\nThe Member States shall apply this Regulation. ' * 30))
                           + '\n' for i in range(12)))
    argv = ['build-corpus', sel, '--out', tmp_path/'corpus', '--train-tokenizer', '300', '--seq-len', '32',
            '--mix', 'web=hf:legal-org/web-2:0.2', '--mix-languages', 'match', '--mix-heldout', '200', '--no-progress']
    err = error_line(legalnb(argv, env))   # not in the cache, and no --download: nothing fetched
    assert 'legal-org/web-2: no such folder, and no dataset legal-org/web-2 in the Hugging Face cache' in err, err
    p = legalnb([*argv, '--download'], env)
    assert p.returncode == 0, p.stderr[-3000:]
    got = fetched(hub)
    assert got == {'README.md', 'data/fra_Latn/train/000_00000.parquet', 'data/deu_Latn/train/000_00000.parquet',
                   'data/ita_Latn/train/000_00000.parquet'}, got   # the card and the data files; never web.py
    mix = json.loads((tmp_path/'corpus'/'manifest.json').read_text())['mix'][0]
    assert mix['hub'] == dict(repo='legal-org/web-2', configs=['fra_Latn', 'deu_Latn', 'ita_Latn'], split='train',
                              rows=None, revision=web)
    assert set(mix['tokens_per_lang']) == {'fr', 'de'}   # matched to the legal languages
    hub.requests.clear()   # a rebuild reads the cache: up to date, nothing asked of the Hub
    p = legalnb(argv, env)
    assert p.returncode == 0 and 'up to date' in p.stdout and not hub.requests, (p.stdout, p.stderr[-2000:])
