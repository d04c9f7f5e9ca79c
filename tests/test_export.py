"""legalnb export: the folder loads with transformers alone (a subprocess that cannot import legalnb), with legalnb's
logits and greedy tokens; the GPT baseline as a plain Llama; lm-evaluation-harness scores the export; bad input."""
import json, os, subprocess, sys, sysconfig, textwrap

import pytest
import torch

from legalnb.core import LegalnbError
from legalnb.locks import OWNED
from legalnb.corpus import train_tokenizer
from legalnb.export import EXPORT_FILES, export_main, export_model
from legalnb.gpt import GPTConfig, GPTLanguageModel
from legalnb.hf import legal_sentences
from legalnb.resonance import ResonanceConfig, ResonanceLanguageModel

pytest.importorskip('transformers')


@pytest.fixture(scope='module')
def tok():
    return train_tokenizer(legal_sentences(300), 300)


def native(folder, model, tok):
    "A model folder as `legalnb train` leaves it: model.save() plus the tokenizer beside it."
    model.save(folder); tok.save(str(folder/'tokenizer.json'))
    return folder


def resonance(**kw):
    torch.manual_seed(0)
    return ResonanceLanguageModel(ResonanceConfig(**{**dict(vocab_size=300, dim=32, num_layers=2, num_frequencies=8,
                                                           max_seq_len=200, init_std=0.2), **kw})).eval()


def without_legalnb(tmp_path, code: str) -> dict:
    "Run `code` in a fresh interpreter that sees site-packages but not legalnb (no .pth files, no PYTHONPATH, no cwd)."
    site = sysconfig.get_paths()['purelib']
    prelude = textwrap.dedent(f'''
        import sys, importlib.util
        sys.path.append({site!r})          # the packages, without running their .pth files (legalnb's editable finder)
        assert importlib.util.find_spec('legalnb') is None, 'legalnb is importable'
        try: import legalnb
        except ImportError: pass
        else: raise SystemExit('legalnb imported')
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        ''')
    run_dir = tmp_path/'isolated'; run_dir.mkdir(exist_ok=True)
    env = {'PATH': os.environ.get('PATH', ''), 'HF_HOME': str(tmp_path/'hf-home'), 'HF_HUB_OFFLINE': '1',
           'TRANSFORMERS_OFFLINE': '1', 'OMP_NUM_THREADS': '1'}
    r = subprocess.run([sys.executable, '-I', '-S', '-c', prelude + textwrap.dedent(code)], cwd=run_dir, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(run_dir/'result.pt')


@pytest.mark.parametrize('kw', [{}, dict(recall_layers=[]), dict(attention_layers=[1], attention_window=150),
                                dict(linear_layers=[0]), dict(delta_layers=[1]), dict(filter_heads=2)],
                         ids=['resonance', 'no-recall-branch', 'hybrid', 'linear', 'delta', 'filters'])
def test_resonance_export_round_trip_without_legalnb(tmp_path, tok, kw):
    "The default (a recall branch in block 0, its gate drawn so that it counts), the plain mixer of older "
    "checkpoints (its config.json has no `recall_layers`), and the hybrid with a (windowed) attention block: its KV "
    "cache is part of the generation state."
    m = resonance(**kw)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith('recall_gate'): p.normal_()
    native(tmp_path/'run'/'model', m, tok)
    files = export_model(tmp_path/'run', tmp_path/'hf')
    assert {'config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json',
            'configuration_legalnb_resonance.py', 'modeling_legalnb_resonance.py'} <= set(files)
    cfg = json.loads((tmp_path/'hf'/'config.json').read_text())
    assert cfg['auto_map']['AutoModelForCausalLM'] == 'modeling_legalnb_resonance.LegalnbResonanceForCausalLM'
    assert cfg.get('recall_layers', []) == list(m.config.recall_layers), 'unwritten: none (the config class default)'
    ids = torch.randint(3, 300, (2, 37)); ids[0, 5] = 0            # an odd length, a special id inside
    torch.save(ids, tmp_path/'ids.pt')
    res = without_legalnb(tmp_path, f'''
        m = AutoModelForCausalLM.from_pretrained({str(tmp_path/'hf')!r}, trust_remote_code=True).eval()
        t = AutoTokenizer.from_pretrained({str(tmp_path/'hf')!r})
        ids = torch.load({str(tmp_path/'ids.pt')!r})
        with torch.no_grad():
            logits = m(ids).logits
            padded = m(torch.cat([torch.full((2, 4), t.pad_token_id), ids], 1),
                       attention_mask=torch.cat([torch.zeros(2, 4, dtype=torch.long), torch.ones_like(ids)], 1)).logits
        gen = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=200, do_sample=False,
                         eos_token_id=None)
        torch.save(dict(logits=logits, padded=padded[:, 4:], gen=gen, eos=t.eos_token, module=type(m).__module__,
                        text=t.decode(t.encode('Article 5 shall apply'))), 'result.pt')
        ''')
    with torch.no_grad(): ref = m(ids)
    assert (res['logits'] - ref).abs().max() < 1e-5
    assert (res['padded'] - ref).abs().max() < 1e-5, 'left padding is a document of its own: exact'
    assert res['gen'].shape == (2, 37 + 200), 'past max_seq_len=200 the window is re-run, as in legalnb'
    assert torch.equal(res['gen'], m.generate(ids, 200, temperature=0))
    assert res['eos'] == '<|endoftext|>' and res['text'] == 'Article 5 shall apply'
    assert 'legalnb' not in res['module'].split('.')[0]


def test_gpt_exports_as_plain_llama(tmp_path, tok):
    torch.manual_seed(0)
    g = GPTLanguageModel(GPTConfig(vocab_size=300, dim=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                   max_seq_len=128, init_std=0.2)).eval()
    native(tmp_path/'gpt', g, tok)
    files = export_model(tmp_path/'gpt', tmp_path/'hf')
    assert not any(f.endswith('.py') for f in files)
    cfg = json.loads((tmp_path/'hf'/'config.json').read_text())
    assert cfg['model_type'] == 'llama' and 'auto_map' not in cfg
    ids = torch.randint(3, 300, (2, 41)); torch.save(ids, tmp_path/'ids.pt')
    res = without_legalnb(tmp_path, f'''
        m = AutoModelForCausalLM.from_pretrained({str(tmp_path/'hf')!r}).eval()   # no remote code
        ids = torch.load({str(tmp_path/'ids.pt')!r})
        with torch.no_grad(): logits = m(ids).logits
        gen = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                         eos_token_id=None)
        torch.save(dict(logits=logits, gen=gen, cls=type(m).__name__), 'result.pt')
        ''')
    with torch.no_grad(): assert (res['logits'] - g(ids)).abs().max() < 1e-5
    assert res['cls'] == 'LlamaForCausalLM' and torch.equal(res['gen'], g.generate(ids, 40, temperature=0))


def test_lm_eval_harness_scores_the_export(tmp_path, tok, monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1'); monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
    monkeypatch.setenv('HF_HOME', str(tmp_path/'hf-home'))
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from legalnb.evaluate import EvalModel, run_harness, write_lm_eval_tasks
    native(tmp_path/'m', resonance(), tok)
    export_model(tmp_path/'m', tmp_path/'hf')
    hf = AutoModelForCausalLM.from_pretrained(tmp_path/'hf', trust_remote_code=True).eval()
    hf_tok = AutoTokenizer.from_pretrained(tmp_path/'hf')
    docs = [dict(celex=f'3202{i}R000{i}', lang='en', doc_type='regulation', band='2020s', text=t)
            for i, t in enumerate(legal_sentences(3, seed=2))]
    tasks = write_lm_eval_tasks(docs, tmp_path/'tasks', citations=0)[0].parent
    lm = EvalModel(hf, hf_tok.backend_tokenizer, 200, hf_tok.eos_token_id, kind='hf', hf_tokenizer=hf_tok)
    scores = run_harness(lm, tasks, batch_size=2)['legalnb_heldout']
    assert 1 < scores['byte_perplexity'] < 300 and scores['bits_per_byte'] > 0


def test_reexport_replaces_and_bad_input_leaves_nothing(tmp_path, tok, capsys):
    native(tmp_path/'run'/'model', resonance(), tok)
    assert export_main([str(tmp_path/'run'), '--out', str(tmp_path/'hf')]) == 0
    out = capsys.readouterr().out
    assert 'trust_remote_code=True' in out and 'model.safetensors' in out
    before = (tmp_path/'hf'/'model.safetensors').read_bytes()
    native(tmp_path/'run'/'model', resonance(dim=16), tok)          # retrained: export again into the same folder
    export_model(tmp_path/'run', tmp_path/'hf')
    assert (tmp_path/'hf'/'model.safetensors').read_bytes() != before
    assert sorted(p.name for p in (tmp_path/'hf').iterdir() if p.name != OWNED) == sorted(
        f for f in EXPORT_FILES if (tmp_path/'hf'/f).exists()), 'and the record of what legalnb wrote (OWNED)'
    with pytest.raises(LegalnbError, match='--out is required'): export_main([str(tmp_path/'run')])
    with pytest.raises(LegalnbError, match='no such folder'): export_main([str(tmp_path/'none'), '--out', 'x'])
    with pytest.raises(LegalnbError, match='already a Hugging Face folder'):
        export_main([str(tmp_path/'hf'), '--out', str(tmp_path/'again')])
    (tmp_path/'busy').mkdir(); (tmp_path/'busy'/'keep.txt').write_text('mine')
    with pytest.raises(LegalnbError, match=r'holds files legalnb did not write \(keep.txt\)'):
        export_main([str(tmp_path/'run'), '--out', str(tmp_path/'busy')])
    (tmp_path/'bare').mkdir(); resonance().save(tmp_path/'bare')                 # no tokenizer anywhere
    with pytest.raises(LegalnbError, match='no tokenizer found'):
        export_main([str(tmp_path/'bare'), '--out', str(tmp_path/'new')])
    cfg = json.loads((tmp_path/'run'/'model'/'config.json').read_text())
    (tmp_path/'run'/'model'/'config.json').write_text(json.dumps({**cfg, 'architecture': 'mamba'}))
    with pytest.raises(LegalnbError, match="architecture 'mamba' is not registered"):
        export_main([str(tmp_path/'run'), '--out', str(tmp_path/'new')])
    assert not (tmp_path/'again').exists() and not (tmp_path/'new').exists() and not (tmp_path/'x').exists()
    assert sorted(p.name for p in (tmp_path/'busy').iterdir()) == ['keep.txt']
    assert not [p for p in tmp_path.iterdir() if '.export-' in p.name], 'no temporary folder left'


def test_an_export_by_legalnb_0_1_0_is_still_trusted_and_gives_the_same_logits(tmp_path, tok):
    "The code legalnb 0.1.0 wrote (tests/fixtures, before the classes were split into @patch cells) is accepted "
    "without --trust-remote-code and computes what today's code computes; a changed byte is refused."
    from legalnb.export import legalnb_remote_code
    from legalnb.resonance import exported_code
    m = resonance(attention_layers=[1])
    export_model(native(tmp_path/'run', m, tok), tmp_path/'hf')
    old = tmp_path/'old'; old.mkdir()
    for f in (tmp_path/'hf').iterdir(): (old/f.name).write_bytes(f.read_bytes())
    fixture = os.path.join(os.path.dirname(__file__), 'fixtures', 'resonance_export_0.1.0')
    for name in exported_code():
        with open(os.path.join(fixture, name), 'rb') as f: (old/name).write_bytes(f.read())
    name = 'modeling_legalnb_resonance.py'
    assert (old/name).read_bytes() != (tmp_path/'hf'/name).read_bytes(), 'the code has moved since 0.1.0'
    assert legalnb_remote_code(tmp_path/'hf') and legalnb_remote_code(old)
    ids = torch.randint(3, 300, (2, 29)); torch.save(ids, tmp_path/'ids.pt')
    res = without_legalnb(tmp_path, f'''
        ids = torch.load({str(tmp_path/'ids.pt')!r})
        out = {{}}
        for name in ('hf', 'old'):
            m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r} + '/' + name, trust_remote_code=True).eval()
            with torch.no_grad(): out[name] = m(ids).logits
        torch.save(out, 'result.pt')
        ''')
    with torch.no_grad(): ref = m(ids)
    assert (res['hf'] - ref).abs().max() < 1e-5 and torch.equal(res['old'], res['hf'])
    (old/'modeling_legalnb_resonance.py').write_text((old/'modeling_legalnb_resonance.py').read_text() + '# mine\n')
    with pytest.raises(LegalnbError, match='modeling_legalnb_resonance.py: not the code legalnb export writes'):
        legalnb_remote_code(old)


@pytest.fixture(scope='module')
def quickstart_work(tmp_path_factory):
    "A tiny `legalnb quickstart` work folder (run, baseline, corpus, selection, eval), made from its parent folder "
    "with relative paths, as a user would."
    import io
    from contextlib import redirect_stdout
    from legalnb.cli import QuickstartConfig, quickstart
    d, here = tmp_path_factory.mktemp('qs'), os.getcwd()
    os.chdir(d)
    try:
        with redirect_stdout(io.StringIO()):
            quickstart(QuickstartConfig('qs', docs=20, vocab_size=300, seq_len=64, steps=10, dim=16, batch_size=4,
                                        device='cpu'))
    finally: os.chdir(here)
    return d/'qs'


def test_the_model_card_is_made_of_the_runs_files(quickstart_work, tmp_path, capsys):
    "README.md: the manifest's languages, eval.json's scores (in the tables and as a model-index that parses back), "
    "no base model for a run from scratch, trust_remote_code exactly when code was exported; a user's README refused."
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results
    work = quickstart_work
    manifest = json.loads((work/'corpus'/'manifest.json').read_text())
    ev = json.loads((work/'eval'/'eval.json').read_text())
    assert export_main([str(work/'run'), '--out', str(tmp_path/'hf')]) == 0
    assert 'README.md' in capsys.readouterr().out
    text = (tmp_path/'hf'/'README.md').read_text()
    card = ModelCard.load(tmp_path/'hf'/'README.md')   # parsed back offline: the validation the export runs too
    meta = card.data.to_dict()
    assert card.data.language == sorted(manifest['tokens_per_lang'])
    assert 'base_model' not in meta and 'base model' not in text, 'trained from scratch: no base model'
    assert meta['license'] == 'cc-by-4.0' and {'legalnb', 'eur-lex', 'legal', 'resonance'} <= set(meta['tags'])
    name, results = model_index_to_eval_results(meta['model-index'])
    assert name == 'hf' and results == card.data.eval_results
    for lang, g in ev['by_language'].items():
        got = next(r for r in results if r.dataset_config == lang and r.metric_type == 'bits_per_byte')
        assert got.metric_value == round(g['bits_per_byte'], 4)
        assert f"| {lang} " in text and f"{g['bits_per_byte']:.3f}" in text
    overall = next(r for r in results if r.dataset_config is None and r.metric_type == 'bits_per_byte')
    assert overall.metric_value == round(ev['overall']['bits_per_byte'], 4)
    general = ev['general']['overall']   # 4 held-out acts give no interval; the general text's documents do
    lo, hi = general['bits_per_byte_ci']
    assert f"{general['bits_per_byte']:.3f} [{lo:.3f}, {hi:.3f}] bits per byte" in text
    assert 'trust_remote_code=True' in text and 'modeling_legalnb_resonance.py' in text
    assert 'Decision 2011/833/EU' in text and '## Training' in text and 'Against the reference run' in text

    assert export_main([str(work/'baseline'), '--out', str(tmp_path/'gpt')]) == 0   # the GPT baseline: plain Llama
    files = os.listdir(tmp_path/'gpt')
    gpt_text = (tmp_path/'gpt'/'README.md').read_text()
    assert not any(f.endswith('.py') for f in files) and 'trust_remote_code' not in gpt_text
    base_ev = json.loads((work/'eval'/'reference'/'eval.json').read_text())
    assert f"{base_ev['overall']['bits_per_byte']:.3f}" in gpt_text, "the baseline's own evaluation, not the run's"
    assert f"{ev['overall']['bits_per_byte']:.3f}" not in gpt_text

    (tmp_path/'mine').mkdir(); (tmp_path/'mine'/'README.md').write_text('my notes')
    for call in (lambda: export_main([str(work/'run'), '--out', str(tmp_path/'mine')]),
                 lambda: export_model(work/'run', tmp_path/'mine')):
        with pytest.raises(LegalnbError, match=r'holds files legalnb did not write \(README.md\)'): call()
    assert os.listdir(tmp_path/'mine') == ['README.md'] and (tmp_path/'mine'/'README.md').read_text() == 'my notes'


def test_a_card_without_an_evaluation_has_no_numbers(quickstart_work, tmp_path):
    "A run folder copied out of its work folder: no eval folder, so no evaluation section and no model-index; "
    "--eval and --corpus name them again, and --eval of another model is refused."
    import shutil
    from huggingface_hub import ModelCard
    work = quickstart_work
    shutil.copytree(work/'run', tmp_path/'run', ignore=shutil.ignore_patterns('.legalnb*'))
    tok = work/'corpus'/'tokenizer.json'   # the run's data, named relative to the work folder, is not found from here
    export_model(tmp_path/'run', tmp_path/'hf', tok)
    card = ModelCard.load(tmp_path/'hf'/'README.md')
    assert '## Evaluation' not in card.text and 'bits per byte' not in card.text
    assert 'model-index' not in card.data.to_dict()
    assert '## Training data' not in card.text and 'language' not in card.data.to_dict()
    assert '## Training' in card.text, 'the run itself still says how it trained'
    export_model(tmp_path/'run', tmp_path/'hf', tok, eval_dir=work/'eval', corpus_dir=work/'corpus')
    card = ModelCard.load(tmp_path/'hf'/'README.md')
    assert card.data.eval_results and '## Evaluation' in card.text and '## Training data' in card.text
    with pytest.raises(LegalnbError, match='eval.json scores qs/baseline'):
        export_model(work/'run', tmp_path/'other', eval_dir=work/'eval'/'reference')
    assert not (tmp_path/'other').exists()
