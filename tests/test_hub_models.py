"""Models by name (issue 40): `org/name` of a model in the Hugging Face cache ($HF_HOME/hub), laid out as `hf download`
lays it out, wherever a model folder is taken (finetune, evaluate and its --against, generate, a plan's model:); no
network, the checks a folder gets, and one line with the `hf download` command for a name not in the cache."""
import io, json, shutil
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from legalnb.cli import main
from legalnb.hub import add_to_hub_cache

NAME = 'legal-org/tiny-llama'
QUICK = ['--citations', '0', '--samples', '0', '--rouge', '0', '--bootstrap', '0', '--general', 'none', '--device', 'cpu',
         '--no-progress']


@pytest.fixture(scope='module')
def hf_home(tiny_llama, tmp_path_factory) -> Path:
    "An HF_HOME whose cache holds the tiny Llama, a copy whose config names code (auto_map) and one with pickled weights."
    home, work = tmp_path_factory.mktemp('hf-home'), tmp_path_factory.mktemp('hub-sources')
    add_to_hub_cache(tiny_llama, NAME, home/'hub')
    remote, pickled = shutil.copytree(tiny_llama, work/'remote'), shutil.copytree(tiny_llama, work/'pickled')
    cfg = json.loads((remote/'config.json').read_text()) | {'auto_map': {'AutoModelForCausalLM': 'modeling.Model'}}
    (remote/'config.json').write_text(json.dumps(cfg))
    (pickled/'model.safetensors').rename(pickled/'pytorch_model.bin')
    add_to_hub_cache(remote, 'legal-org/remote', home/'hub'); add_to_hub_cache(pickled, 'legal-org/pickled', home/'hub')
    from legalnb.hf import load_hf_model, write_demo_shards
    write_demo_shards(work/'corpus', load_hf_model(tiny_llama, tokenizer_only=True)[1], rows=16, seq_len=32)
    (work/'heldout.jsonl').write_text(''.join(json.dumps(dict(celex=f'3201{i}R000{i}', lang='en', doc_type='regulation',
                                                              text=f'Article {i}: the Member States shall report.'))
                                              + '\n' for i in range(1, 4)))
    return home


@pytest.fixture
def cache(hf_home, monkeypatch) -> Path:
    "The fixture's cache as huggingface_hub's (it reads HF_HOME at import: its constant is set), and HF_HOME for the "
    "commands this test starts; the cache folder."
    import huggingface_hub.constants
    monkeypatch.setenv('HF_HOME', str(hf_home))
    for k in ('HF_HUB_CACHE', 'HUGGINGFACE_HUB_CACHE'): monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(hf_home/'hub'))
    return hf_home/'hub'


def snapshot(cache: Path, name: str = NAME) -> Path:
    repo = cache/f'models--{name.replace("/", "--")}'
    return repo/'snapshots'/(repo/'refs'/'main').read_text()


def run(argv) -> str:
    "stdout of a command that must succeed."
    with redirect_stdout(io.StringIO()) as out: assert main([str(a) for a in argv]) == 0
    return out.getvalue()


def test_generate_by_name_is_generate_from_the_folder(cache, tiny_llama):
    args = ['--prompt', 'Article 1', '--max-new-tokens', '6', '--device', 'cpu']
    assert run(['generate', NAME, *args]) == run(['generate', tiny_llama, *args])


def test_finetune_by_name_then_evaluate_against_it_by_name(cache, tmp_path):
    run(['finetune', '--model', NAME, '--data', _sources(cache)/'corpus', '--out', tmp_path/'ft', '--max-steps', '1',
         '--batch-size', '2', '--grad-accum', '1', '--workers', '0', '--force-single'])
    assert json.loads((tmp_path/'ft'/'finetune.json').read_text())['base'] == str(snapshot(cache).resolve())
    run(['evaluate', tmp_path/'ft', '--against', NAME, '--data', _sources(cache)/'heldout.jsonl', '--out',
         tmp_path/'eval', *QUICK])
    c = json.loads((tmp_path/'eval'/'against.json').read_text())
    assert c['reference']['name'] == NAME and c['reference_is_base'], 'the name is the base the run recorded'


def _sources(cache: Path) -> Path:
    "The fixture's folder of held-out documents (heldout.jsonl) and a corpus (corpus/)."
    return next(cache.parent.parent.glob('hub-sources*'))


@pytest.mark.parametrize('command', ['finetune', 'evaluate', 'generate'])
def test_a_name_not_in_the_cache_is_one_line_with_the_download_command(command, cache, tmp_path, capsys):
    argv = {'finetune': ['--model', 'legal-org/absent', '--data', _sources(cache)/'corpus', '--out', tmp_path/'ft'],
            'evaluate': ['legal-org/absent', '--data', _sources(cache)/'heldout.jsonl', '--out', tmp_path/'eval'],
            'generate': ['legal-org/absent', '--prompt', 'Article 1']}[command]
    assert main([command, *map(str, argv)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f'legalnb {command}: error: legal-org/absent: no such folder, and no model legal-org/absent in the Hugging Face '
        f'cache {cache}; download it with `hf download legal-org/absent` or --download (HF_HOME decides where it goes), '
        'or give a model folder']
    assert not (tmp_path/'ft').exists() and not (tmp_path/'eval').exists()


@pytest.mark.parametrize('argv,expect', [
    (['finetune', '--model', 'legal-org/remote', '--out', 'ft', '--force-single'], 'config.json: its auto_map names Python code'),
    (['evaluate', 'legal-org/remote', '--out', 'eval'], 'config.json: its auto_map'),
    (['generate', 'legal-org/remote', '--prompt', 'Article'], 'config.json: its auto_map'),
    (['evaluate', 'legal-org/pickled', '--out', 'eval'], 'pytorch_model.bin: pickled weights, not safetensors'),
    (['finetune', '--model', 'legal-org/pickled', '--out', 'ft', '--force-single'], 'pytorch_model.bin: pickled weights'),
])
def test_a_cached_model_gets_the_refusals_of_a_folder(argv, expect, cache, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = {'finetune': ['--data', str(_sources(cache)/'corpus')], 'generate': []}.get(
        argv[0], ['--data', str(_sources(cache)/'heldout.jsonl')])
    assert main([*argv, *data]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and expect in err[0] and str(snapshot(cache, argv[1 + (argv[0] == 'finetune')])) in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_folder_here_of_the_same_name_wins_over_the_cache(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path/NAME).mkdir(parents=True); (tmp_path/NAME/'config.json').write_text('{"model_type": "llama"}')
    assert main(['generate', NAME, '--prompt', 'Article 1', '--device', 'cpu']) == 2
    assert capsys.readouterr().err.startswith(f'legalnb generate: error: {NAME}: no tokenizer files'), 'the folder here'


def test_a_plan_names_a_cached_model(cache):
    from legalnb.core import LegalnbError
    from legalnb.run import build_stages, plan_of
    stages, top = build_stages(plan_of({'input': ['formex'], 'out': 'work', 'model': NAME}))
    finetune = next(s for s in stages if s.name == 'finetune')
    assert top.hf and finetune.argv[finetune.argv.index('--model') + 1] == str(snapshot(cache))
    with pytest.raises(LegalnbError, match='download it with `hf download legal-org/absent`'):
        build_stages(plan_of({'input': ['formex'], 'out': 'work', 'model': 'legal-org/absent'}))


def test_build_corpus_takes_a_cached_models_tokenizer_by_name(cache, tiny_llama):
    from legalnb.corpus import load_tokenizer
    assert load_tokenizer(NAME).to_str() == load_tokenizer(tiny_llama).to_str()


def test_help_says_a_model_may_be_named():
    from legalnb.commands import command_flags
    for command in ('finetune', 'evaluate', 'generate', 'run', 'build-corpus'):
        assert 'org/name' in command_flags(command).format_help(), command


def _listener():
    "A socket on 127.0.0.1 that counts the connections made to it (the requests' first bytes)."
    import socket, threading
    s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(64); seen = []
    def accept():
        while True:
            try: c, _ = s.accept()
            except OSError: return
            c.settimeout(5)
            try: seen.append(c.recv(200))
            except OSError: seen.append(b'')
            c.close()
    threading.Thread(target=accept, daemon=True).start()
    return s, seen


def test_no_command_opens_a_connection_for_a_missing_or_a_cached_model(hf_home, tmp_path):
    "Issue 48: the Hub (HF_ENDPOINT) and a proxy (HTTPS_PROXY, HTTP_PROXY) are local listeners; no command given a "
    "model, in the cache or not, connects to either. `legalnb slurm` resolves the model as the others do: one line "
    "naming `hf download` for a missing one, no job written (it used to ask huggingface_hub, which fetched its agent "
    "registry, and then wrote the job with a guessed layer class)."
    import os, subprocess, sys
    (hub, hub_seen), (proxy, proxy_seen) = _listener(), _listener()
    at = lambda s: f'http://127.0.0.1:{s.getsockname()[1]}'
    env = {k: v for k, v in os.environ.items() if k.upper() not in ('NO_PROXY', 'HF_HUB_OFFLINE', 'HF_HUB_CACHE',
                                                                     'HUGGINGFACE_HUB_CACHE', 'TRANSFORMERS_OFFLINE')}
    env |= dict(HF_HOME=str(hf_home), HF_ENDPOINT=at(hub), HTTPS_PROXY=at(proxy), HTTP_PROXY=at(proxy),
                https_proxy=at(proxy), http_proxy=at(proxy))
    src, missing = _sources(hf_home/'hub'), 'legal-org/absent'
    slurm = lambda m, job: ['slurm', 'finetune', '--strategy', 'fsdp', '-o', tmp_path/job, '--', '--model', m,
                            '--data', src/'corpus', '--out', 'ft']
    cases = {'slurm': slurm(missing, 'missing.slurm'),
             'finetune': ['finetune', '--model', missing, '--data', src/'corpus', '--out', tmp_path/'ft'],
             'evaluate': ['evaluate', missing, '--data', src/'heldout.jsonl', '--out', tmp_path/'eval'],
             'generate': ['generate', missing, '--prompt', 'Article 1'],
             'export': ['export', missing, '--out', tmp_path/'hf'],
             'slurm, cached': slurm(NAME, 'cached.slurm')}
    runs = {k: subprocess.Popen([sys.executable, '-m', 'legalnb.cli', *map(str, argv)], env=env, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k, argv in cases.items()}
    done = {k: (p.wait(timeout=300), p.communicate()[1].strip().splitlines()) for k, p in runs.items()}
    hub.close(); proxy.close()
    assert hub_seen == [] and proxy_seen == [], (hub_seen, proxy_seen)
    for k in ('slurm', 'finetune', 'evaluate', 'generate'):
        assert done[k][0] == 2 and len(done[k][1]) == 1 and f'`hf download {missing}`' in done[k][1][0], (k, done[k])
    assert done['export'][0] == 2 and len(done['export'][1]) == 1, done['export']
    assert not (tmp_path/'missing.slurm').exists() and not (tmp_path/'ft').exists() and not (tmp_path/'eval').exists()
    assert done['slurm, cached'][0] == 0, done['slurm, cached']
    assert '--fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer' in (tmp_path/'cached.slurm').read_text()
