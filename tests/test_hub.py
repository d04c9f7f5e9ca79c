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


@pytest.fixture(scope='module')
def run_folder(tmp_path_factory) -> Path:
    "A native run folder as `legalnb train` leaves it (model/ with its tokenizer beside it)."
    import torch
    from legalnb.corpus import train_tokenizer
    from legalnb.hf import legal_sentences
    from legalnb.resonance import ResonanceConfig, ResonanceLanguageModel
    run = tmp_path_factory.mktemp('push')/'run'
    torch.manual_seed(0)
    ResonanceLanguageModel(ResonanceConfig(vocab_size=300, dim=32, num_layers=2, num_frequencies=8, max_seq_len=64)
                           ).save(run/'model')
    train_tokenizer(legal_sentences(200), 300).save(str(run/'model'/'tokenizer.json'))
    return run


def test_export_pushes_the_folder_and_refuses_someone_elses_repository(hub, env, run_folder, tmp_path):
    out = tmp_path/'hf'
    p = legalnb(['export', run_folder, '--out', out, '--push-to-hub', 'legal-org/legal-resonance', '--private'], env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "from_pretrained('legal-org/legal-resonance', trust_remote_code=True)" in p.stdout
    written = {f.name for f in out.iterdir() if not f.name.startswith('.')}   # not legalnb's records
    pushed = hub.files('legal-org/legal-resonance')
    assert set(pushed) == written | {'.gitattributes'} and 'README.md' in pushed and 'model.safetensors' in pushed
    assert pushed['model.safetensors'] == (out/'model.safetensors').read_bytes()
    assert "from_pretrained('legal-org/legal-resonance', trust_remote_code=True)" in pushed['README.md'].decode()
    assert hub.repos[('model', 'legal-org/legal-resonance')].private
    p = legalnb(['export', run_folder, '--out', out, '--push-to-hub', 'legal-org/legal-resonance', '--revision', 'v2'],
                env)   # again, to a branch: legalnb made the repository, so no --overwrite is needed
    assert p.returncode == 0 and set(hub.files('legal-org/legal-resonance', revision='v2')) == set(pushed), p.stderr

    hub.add_repo('legal-org/theirs', {'README.md': b'---\nlicense: mit\n---\n# their model\n', 'model.safetensors': b'x'})
    before = hub.files('legal-org/theirs')
    err = error_line(legalnb(['export', run_folder, '--out', tmp_path/'hf2', '--push-to-hub', 'legal-org/theirs'], env))
    assert 'legal-org/theirs: the repository holds files legalnb did not write' in err and '--overwrite' in err, err
    assert hub.files('legal-org/theirs') == before
    p = legalnb(['export', run_folder, '--out', tmp_path/'hf2', '--push-to-hub', 'legal-org/theirs', '--overwrite'], env)
    assert p.returncode == 0 and hub.files('legal-org/theirs')['README.md'] != before['README.md'], p.stderr[-2000:]


@pytest.mark.parametrize('change,expect', [
    ({'HF_TOKEN': 'hf_wrong'}, 'the Hub does not accept your token (invalid or expired)'),
    ({'HF_TOKEN': ''}, 'no Hugging Face token; log in with `hf auth login`'),
    ({'REPO': 'elsewhere/model'}, "your token is legal-org's, which may write to legal-org, not to elsewhere"),
    ({'REPO': 'legal-org/bad name'}, '--push-to-hub legal-org/bad name: '),
])
def test_the_name_and_the_token_are_checked_before_anything_is_written(change, expect, hub, env, run_folder, tmp_path):
    e = env | {k: v for k, v in change.items() if k != 'REPO'} | {'HF_HOME': str(tmp_path/'no-token-here')}
    repo = change.get('REPO', 'legal-org/legal-resonance')
    err = error_line(legalnb(['export', run_folder, '--out', tmp_path/'hf', '--push-to-hub', repo], e))
    assert expect in err, err
    assert not (tmp_path/'hf').exists() and not any(m == 'POST' for m, _ in hub.requests)


def test_a_plan_downloads_what_it_names_and_ends_with_a_push(hub, env, web, tmp_path):
    "legalnb run --download: the plan's Hub dataset fetched before any stage; its export: section last, pushed."
    import yaml
    from legalnb.cli import main
    assert main(['sample', str(tmp_path/'formex'), '--docs', '40']) == 0
    plan = tmp_path/'plan.yaml'
    plan.write_text(yaml.safe_dump({
        'input': ['formex'], 'out': 'work', 'model': 'resonance', 'mix': {'web': 'hf:legal-org/web-2:0.1'},
        'build-corpus': {'mix_languages': 'match', 'mix_heldout': 500},
        'export': {'push_to_hub': 'legal-org/legal-run', 'private': True}}))
    tiny = ['--target-tokens', '1M', '--seq-len', '32', '--train-tokenizer', '300', '--shards', '2', '--val-docs',
            '0.1', '--dim', '16', '--num-layers', '1', '--num-frequencies', '4', '--batch-size', '4', '--max-steps',
            '6', '--seq-warmup-steps', '0', '--batch-tokens', '128', '--eval-every', '3', '--eval-batches', '1', '--num-workers', '0', '--cpu-threads', '1', '--device',
            'cpu', '--citations', '5', '--samples', '0', '--rouge', '0', '--no-progress', '--yes']
    p = legalnb(['run', plan, *tiny, '--download'], env)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    work = tmp_path/'work'
    assert json.loads((work/'corpus'/'manifest.json').read_text())['mix'][0]['hub']['revision'] == web
    pushed = hub.files('legal-org/legal-run')
    assert pushed['README.md'] == (work/'export'/'README.md').read_bytes() and 'model.safetensors' in pushed
    assert '| export | `export/` |' in (work/'report.md').read_text()
    hub.requests.clear()   # up to date: every stage skipped, nothing asked of the Hub
    p = legalnb(['run', plan, *tiny], env)
    assert p.returncode == 0 and 'export: skipped, up to date' in p.stdout and not hub.requests, p.stderr[-2000:]


def test_evaluate_scores_general_text_of_the_hub(hub, env, web, run_folder, tmp_path):
    "evaluate --general hf:...: fetched with --download (the card and that config's files only), scored apart."
    held = tmp_path/'heldout.jsonl'
    held.write_text(''.join(json.dumps(dict(celex=f'3201{i}R000{i}', lang='en', doc_type='regulation',
                                            text=f'Article {i}\nThe Member States shall report.')) + '\n'
                            for i in range(1, 4)))
    argv = ['evaluate', run_folder, '--data', held, '--out', tmp_path/'eval', '--general', 'hf:legal-org/web-2:fra_Latn',
            '--citations', '0', '--samples', '0', '--rouge', '0', '--bootstrap', '0', '--device', 'cpu', '--no-progress']
    err = error_line(legalnb(argv, env))
    assert 'no dataset legal-org/web-2 in the Hugging Face cache' in err and not hub.requests, err
    p = legalnb([*argv, '--download'], env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert fetched(hub) == {'README.md', 'data/fra_Latn/train/000_00000.parquet'}
    g = json.loads((tmp_path/'eval'/'eval.json').read_text())['general']
    assert g['source'] == 'hf:legal-org/web-2:fra_Latn' and g['overall']['docs'] == 60 and set(g['by_language']) == {'fr'}
