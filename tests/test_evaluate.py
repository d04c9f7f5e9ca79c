"""`legalnb evaluate` and `legalnb generate` end to end: a native quickstart run, a tiny Hugging Face Llama and its
LoRA adapter, lm-evaluation-harness on the exported tasks (offline), the citation extractor on real Formex text, and
bad inputs as one LegalnbError line that leaves nothing behind."""
import os
for _k in ('HF_DATASETS_OFFLINE', 'HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE'): os.environ.setdefault(_k, '1')

import io, json, math, random
from collections import defaultdict
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

from legalnb.core import LegalnbError
from legalnb.locks import OWNED
from legalnb.corpus import train_tokenizer
from legalnb.evaluate import (EVAL_FORMAT, REPORT_FILES, EvalModel, LookupModel, citation_items, document_windows,
                              EvaluateConfig, evaluate, evaluate_main, extract_citations, generate, generate_ids,
                              generate_main, load_eval_model,
                              metrics, position_buckets, read_heldout, run_harness, score_citations, score_documents,
                              TextStream, write_lm_eval_tasks)
from legalnb.against import against_main
from legalnb.resonance import ResonanceLanguageModel
from legalnb.sources import parse_documents, read_formex
from legalnb.sample import write_sample

ROOT = Path(__file__).resolve().parents[1]
FORMEX = ROOT.parent/'shared'/'fixtures'/'formex'
FAST = ['--citations', '30', '--samples', '1', '--max-new-tokens', '8', '--rouge', '3', '--no-progress']


# ---------------------------------------------------------------- fixtures: documents, models, runs

@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
    "A parsed sample corpus and a held-out file of whole acts (every language of 5 CELEX ids)."
    d = tmp_path_factory.mktemp('corpus')
    write_sample(d/'sample', docs=30, seed=1)
    parse_documents([d/'sample'], d/'parsed.jsonl', progress=False)
    recs = [json.loads(l) for l in (d/'parsed.jsonl').read_text(encoding='utf-8').splitlines()]
    held = set(random.Random(0).sample(sorted({r['celex'] for r in recs}), 5))
    lines = [json.dumps(r, ensure_ascii=False) + '\n' for r in recs if r['celex'] in held]
    (d/'heldout.jsonl').write_text(''.join(lines), encoding='utf-8')
    small = sorted((r for r in recs if r['celex'] in held), key=lambda r: len(r['text']))[:3]   # short documents
    (d/'small.jsonl').write_text(''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in small), encoding='utf-8')
    return dict(dir=d, train=[r['text'] for r in recs if r['celex'] not in held], held=held)


@pytest.fixture(scope='module')
def tiny(corpus):
    "A small native model (random weights) with a BPE trained on the training side."
    tok = train_tokenizer(corpus['train'], 400)
    torch.manual_seed(0)
    model = ResonanceLanguageModel.from_kwargs(vocab_size=400, dim=32, num_layers=1, num_frequencies=4, max_seq_len=300)
    return EvalModel(model.eval(), tok, context=300, eos_id=0, name='tiny')


@pytest.fixture(scope='module')
def quickstart_run(tmp_path_factory):
    "The quickstart's outputs at a tiny size, made with relative paths from their parent folder, as a user would."
    from legalnb.cli import QuickstartConfig, quickstart
    d, here = tmp_path_factory.mktemp('qs'), Path.cwd()
    os.chdir(d)
    try:
        with redirect_stdout(io.StringIO()):
            quickstart(QuickstartConfig('qs', docs=20, vocab_size=300, seq_len=64, steps=10, dim=16, batch_size=4, device='cpu'))
    finally: os.chdir(here)
    return d/'qs'


@pytest.fixture(scope='module')
def hf(tmp_path_factory):
    "A tiny Llama, a LoRA adapter on it (as `legalnb finetune` writes final/) and the same adapter merged."
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from legalnb.hf import build_tiny_model
    d = tmp_path_factory.mktemp('hf')
    build_tiny_model(d/'tiny', arch='llama')
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(d/'tiny'),
                          LoraConfig(r=4, lora_alpha=8, target_modules=['q_proj', 'v_proj'], task_type='CAUSAL_LM'))
    torch.manual_seed(0)
    for name, p in peft.named_parameters():   # a trained adapter changes the outputs (a fresh one starts at zero)
        if 'lora_B' in name: torch.nn.init.normal_(p, std=0.5)
    peft.save_pretrained(d/'ft'/'final')
    (d/'ft'/'finetune.json').write_text('{}')
    peft.merge_and_unload().save_pretrained(d/'merged')
    AutoTokenizer.from_pretrained(d/'tiny').save_pretrained(d/'merged')
    return d


def run_cli(main, argv) -> str:
    "stdout of a command that must succeed."
    out = io.StringIO()
    with redirect_stdout(out): assert main([str(a) for a in argv]) == 0
    return out.getvalue()


# ---------------------------------------------------------------- the metrics against direct computations

def test_bits_per_byte_by_hand(tiny):
    text = 'Artikel 1 — Die Durchführung gilt ab dem 25. Mai 2018.'
    nbytes = len(text.encode('utf-8'))
    assert nbytes == len(text) + 3                       # 'ü' is 2 bytes, '—' 3
    seq = torch.tensor([[0] + tiny.encode(text) + [0]])  # prefix (EOS), text, EOS
    with torch.no_grad(): lp = tiny.module(seq[:, :-1]).log_softmax(-1)[0]
    nll = -lp.gather(1, seq[0, 1:, None]).sum().item()
    doc = dict(celex='x', lang='de', doc_type='other', band='unknown', text=text)
    r = evaluate(EvaluateConfig(tiny, [doc], citations=0, samples=0, progress=False))
    assert r['overall']['bytes'] == nbytes and r['overall']['tokens'] == seq.shape[1] - 1
    assert r['overall']['bits_per_byte'] == pytest.approx(nll / math.log(2) / nbytes, rel=1e-5)
    assert r['overall']['loss'] == pytest.approx(nll / (seq.shape[1] - 1), rel=1e-5)
    assert r['overall']['perplexity'] == pytest.approx(math.exp(nll / (seq.shape[1] - 1)), rel=1e-5)
    no_eos = evaluate(EvaluateConfig(tiny, [doc], eos=False, citations=0, samples=0, progress=False))['overall']
    assert no_eos['tokens'] == seq.shape[1] - 2
    assert no_eos['bits_per_byte'] * nbytes * math.log(2) == pytest.approx(nll + lp[-1, 0].item(), rel=1e-5)


def test_metrics_arithmetic():
    m = metrics(nll=1000 * math.log(2), tokens=500, nbytes=2000)
    assert m['bits_per_byte'] == pytest.approx(0.5) and m['loss'] == pytest.approx(2 * math.log(2))
    assert m['perplexity'] == pytest.approx(4.0)


def test_loss_by_position_against_a_direct_computation(tiny, corpus):
    text = ' '.join(corpus['train'])[:4000]
    s = score_documents(tiny, [dict(text=text)], batch_tokens=700)
    seq = [0] + tiny.encode(text) + [0]
    n = len(seq) - 1
    assert n > 2 * 300
    per_pos = defaultdict(list)
    with torch.no_grad():
        for a, b, first in document_windows(n, 300):
            lp = tiny.module(torch.tensor([seq[a:b]])).log_softmax(-1)[0]
            for j in range(first, b - a): per_pos[j].append(-lp[j, seq[a + j + 1]].item())
    assert [(b['lo'], b['hi']) for b in s['buckets']] == position_buckets(300) == [(0, 64), (64, 256), (256, 300)]
    for bk in s['buckets']:
        vals = [v for j in range(bk['lo'], bk['hi']) for v in per_pos[j]]
        assert bk['tokens'] == len(vals)
        assert bk['nll'] == pytest.approx(sum(vals), rel=1e-4)
    assert sum(b['tokens'] for b in s['buckets']) == n == s['doc_tokens'][0]


def test_windows_predict_every_token_once():
    for n in (1, 7, 300, 301, 599, 600, 1234):
        wins = document_windows(n, 300)
        assert sum(e - a - s for a, e, s in wins) == n
        assert all(e - a <= 300 and 0 <= s < e - a for a, e, s in wins)
        assert all(e - a == 300 for a, e, s in wins[1:])   # later windows are full


# ---------------------------------------------------------------- citations

@pytest.mark.skipif(not FORMEX.is_dir(), reason=f'real Formex samples not found at {FORMEX}')
def test_citation_extractor_on_real_formex():
    texts = {d.celex: d.text for d in read_formex(FORMEX)}
    # Regulation (EU) 2024/903 (Interoperable Europe Act): the acts it cites, listed by reading the text
    acts = {c['number'] for c in extract_citations(texts['32024R0903']) if c['kind'] == 'act'}
    assert acts == {'2022/2481', '2021/1119', '2016/679', '2002/58/EC', '2018/1725', '2016/680', '182/2011',
                    '2022/2555', '2019/1024', '2022/868', '1025/2012', '2008/114/EC', '2016/2102'}
    refs = {c['ref'] for c in extract_citations(texts['32024R0903'])}
    assert {'Regulation (EU) No 182/2011', 'Directive 2002/58/EC', 'Decision (EU) 2022/2481',
            'Article 58(2)', 'Article 6(4)', 'Article 35(1)'} <= refs
    # Regulation (EC) No 1137/2008 (comitology alignment): the comitology decisions and the acts it amends
    acts = {c['number'] for c in extract_citations(texts['32008R1137']) if c['kind'] == 'act'}
    assert {'1999/468/EC', '2006/512/EC', '1999/4/EC', '178/2002'} <= acts
    # headings ('Article 1' alone on its line) are not references
    text = texts['32024R0903']
    assert all(text[c['start']:c['end']].strip() == c['number'] for c in extract_citations(text))
    assert not any(c['kind'] == 'article' and text[c['end']:c['end'] + 1] == '\n'
                   and text[:c['start']].rsplit('\n', 1)[-1].strip() in ('Article',) for c in extract_citations(text))


def test_extractor_languages():
    got = [(c['kind'], c['number']) for c in extract_citations(
        'gemäß der Verordnung (EU) Nr. 182/2011 und Artikel 5; conformément au règlement (UE) no 1025/2012, '
        "l'article 6(2); Reglamento (UE) n.o 2016/679; Directive 95/46/EC.\nArticle 3\n")]
    assert got == [('act', '182/2011'), ('article', '5'), ('act', '1025/2012'), ('article', '6(2)'),
                   ('act', '2016/679'), ('act', '95/46/EC')]


def synthetic_citations(n: int = 10, seed: int = 0) -> list[dict]:
    "Documents whose references each sit in a context that names its document and point."
    rng = random.Random(seed)
    return [dict(celex=f'act{i}', lang='en', doc_type='regulation', band='2010s', text=f'Act {i}.\n' + '\n'.join(
        f'Point {j} of act {i} applies Regulation (EU) {rng.randint(1990, 2023)}/{rng.randint(1, 2999)} '
        f'and Article {rng.randint(1, 99)}.' for j in range(4))) for i in range(n)]


def test_a_model_that_copies_scores_100_percent_and_a_random_one_about_0(tiny):
    docs = synthetic_citations()
    items = citation_items(docs, limit=None)
    assert len(items) == 80
    memory = [[0] + tiny.encode(d['text']) + [0] for d in docs]
    copier = EvalModel(LookupModel(memory, 400, order=64), tiny.tokenizer, context=1024, eos_id=0, name='copier')
    assert all(score_citations(copier, docs, items))
    r = evaluate(EvaluateConfig(copier, docs, citations=500, samples=0, progress=False))
    assert r['citations']['accuracy'] == 1.0 and r['citations']['items'] == 80
    assert r['citations']['by_kind']['act']['items'] == 40 and len(r['citations']['right_examples']) == 5
    assert r['citations']['right_examples'][0]['greedy'].startswith(r['citations']['right_examples'][0]['expected'])
    random_model = evaluate(EvaluateConfig(tiny, docs, citations=500, samples=0, progress=False))['citations']
    assert random_model['accuracy'] <= 0.05 and len(random_model['wrong_examples']) == 5


# ---------------------------------------------------------------- a native run (the quickstart's), end to end

def test_evaluate_a_native_run(quickstart_run, corpus, tmp_path):
    out = tmp_path/'eval'
    table = run_cli(evaluate_main, [quickstart_run/'run', '--data', corpus['dir'], '--out', out, *FAST])
    assert sorted(p.name for p in out.iterdir()) == sorted([*REPORT_FILES, OWNED]), 'and the record of what it wrote'
    r = json.loads((out/'eval.json').read_text(encoding='utf-8'))
    assert r['format'] == EVAL_FORMAT and r['model']['kind'] == 'native' and r['model']['context'] == 64
    assert r['data']['acts'] == 5 and set(r['by_language']) == {d['lang'] for d in read_heldout(corpus['dir'])}
    assert sum(m['tokens'] for m in r['by_doc_type'].values()) == r['overall']['tokens']
    assert [b['bucket'] for b in r['by_position']] == ['0-64']
    assert 0 < r['overall']['bits_per_byte'] < 8 and r['citations']['items'] == 30 and len(r['samples']) == 1
    assert 'overall' in table and 'bits/byte' in table and 'citations:' in table and str(out/'eval.json') in table
    assert (out/'loss_by_position.png').read_bytes()[:4] == b'\x89PNG'
    assert '![loss by position](loss_by_position.png)' in (out/'eval.md').read_text(encoding='utf-8')
    again = json.loads(run_cli(evaluate_main, [quickstart_run/'run'/'model', '--data', corpus['dir']/'heldout.jsonl',
                                               '--out', tmp_path/'again', '--json', *FAST]))
    assert (again['overall'], again['citations'], again['samples']) == (r['overall'], r['citations'], r['samples'])


def test_generate_a_native_run(quickstart_run):
    a = run_cli(generate_main, [quickstart_run/'run', '--prompt', 'Article 1\n', '--max-new-tokens', 30, '--seed', 5])
    assert a.startswith('Article 1\n') and a == run_cli(generate_main, [quickstart_run/'run', '--prompt', 'Article 1\n',
                                                                          '--max-new-tokens', 30, '--seed', 5])
    lm = load_eval_model(quickstart_run/'run')
    assert a == 'Article 1\n' + generate(lm, prompt='Article 1\n', max_new_tokens=30, seed=5) + '\n'
    greedy = generate(lm, prompt='Artículo 1', max_new_tokens=20, temperature=0, seed=1)
    assert greedy == generate(lm, prompt='Artículo 1', max_new_tokens=20, temperature=0, seed=2)   # greedy: no seed
    pieces = []
    text = generate(lm, prompt='Die Durchführung — ', max_new_tokens=40, seed=3, stream=pieces.append)
    assert ''.join(pieces) == text


def test_streaming_waits_for_whole_characters(tiny):
    pieces = []
    stream = TextStream(tiny, tiny.encode('x')[-1], pieces.append)
    byte = {b: tiny.tokenizer.token_to_id(c) for b, c in ((0xC3, 'Ã'), (0xA9, '©'), (0xBC, '¼'))}   # GPT-2 byte map
    stream(byte[0xC3]); assert pieces == []            # half of 'é' (C3 A9): nothing printed yet
    stream(byte[0xA9]); assert pieces == ['é']
    stream(byte[0xC3]); stream(byte[0xBC]); stream.flush()
    assert pieces == ['é', 'ü'] and stream.text == 'éü'


# ---------------------------------------------------------------- Hugging Face models, LoRA, lm-eval

def test_evaluate_hf_model_and_its_lora_adapter(hf, corpus, tmp_path):
    small = corpus['dir']/'small.jsonl'
    kw = dict(citations=20, samples=1, max_new_tokens=8, rouge=2, progress=False)
    base = evaluate(EvaluateConfig(hf/'tiny', small, **kw))
    assert base['model']['kind'] == 'hf' and base['model']['context'] == 2048
    lora = evaluate(EvaluateConfig(hf/'ft', small, **kw))   # a finetune output
    merged = evaluate(EvaluateConfig(hf/'merged', small, **kw))
    assert lora['model']['kind'] == 'lora'
    assert lora['overall']['tokens'] == base['overall']['tokens']
    assert lora['overall']['bits_per_byte'] != pytest.approx(base['overall']['bits_per_byte'], rel=1e-4)
    assert lora['overall']['bits_per_byte'] == pytest.approx(merged['overall']['bits_per_byte'], rel=1e-4)
    out = run_cli(generate_main, [hf/'ft', '--prompt', 'Article 1', '--max-new-tokens', 10, '--seed', 1])
    assert out.startswith('Article 1') and out == run_cli(generate_main, [hf/'ft', '--prompt', 'Article 1',
                                                                          '--max-new-tokens', 10, '--seed', 1])


def test_lm_eval_tasks_load_and_score_a_tiny_llama(hf, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv('HF_DATASETS_CACHE', str(tmp_path/'datasets-cache'))
    docs = read_heldout(corpus['dir']/'small.jsonl')
    files = write_lm_eval_tasks(docs, tmp_path/'tasks', citations=10)
    assert {p.name for p in files} == {'heldout.jsonl', 'citations.jsonl', 'legalnb_heldout.yaml',
                                       'legalnb_citations.yaml'}
    lm = load_eval_model(hf/'tiny')
    h = run_harness(lm, tmp_path/'tasks', batch_size=4)
    ours = evaluate(EvaluateConfig(lm, docs, eos=False, citations=0, samples=0, rouge=0, progress=False))['overall']
    # the same windows, prefix token and bytes: lm-eval's bits per byte is ours without the EOS
    assert h['legalnb_heldout']['bits_per_byte'] == pytest.approx(ours['bits_per_byte'], rel=1e-5)
    assert 0 <= h['legalnb_citations']['acc'] <= 1


def test_evaluate_harness_flag(hf, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv('HF_DATASETS_CACHE', str(tmp_path/'datasets-cache'))
    run_cli(evaluate_main, [hf/'tiny', '--data', corpus['dir']/'small.jsonl', '--out', tmp_path/'eval', '--harness',
                            '--no-eos', '--export-lm-eval', tmp_path/'tasks', '--citations', 5, '--samples', 0,
                            '--rouge', 0, '--no-progress'])
    r = json.loads((tmp_path/'eval'/'eval.json').read_text(encoding='utf-8'))
    assert r['harness']['legalnb_heldout']['bits_per_byte'] == pytest.approx(r['overall']['bits_per_byte'], rel=1e-5)
    assert (tmp_path/'tasks'/'legalnb_heldout.yaml').is_file()


def test_export_without_a_model(corpus, tmp_path):
    out = run_cli(evaluate_main, ['--export-lm-eval', tmp_path/'tasks', '--data', corpus['dir'], '--citations', 7])
    assert 'legalnb_heldout.yaml' in out
    cites = [json.loads(l) for l in (tmp_path/'tasks'/'citations.jsonl').read_text(encoding='utf-8').splitlines()]
    assert len(cites) == 7 and all(c['target'].strip() and not c['prompt'].endswith(' ') for c in cites)


# ---------------------------------------------------------------- bad input: one line, nothing written

def bad_cases(run, data, tmp):
    (tmp/'empty.jsonl').write_text('\n')
    (tmp/'notext.jsonl').write_text('{"celex": "32016R0679", "lang": "en"}\n')
    (tmp/'notamodel').mkdir(exist_ok=True)
    (tmp/'lora').mkdir(exist_ok=True)
    (tmp/'lora'/'adapter_config.json').write_text('{"base_model_name_or_path": "meta-llama/Llama-3-8B"}')
    (tmp/'foreign').mkdir(exist_ok=True); (tmp/'foreign'/'mine.txt').write_text('mine')
    (tmp/'run_no_tok'/'model').mkdir(parents=True, exist_ok=True)
    ResonanceLanguageModel.from_kwargs(vocab_size=300, dim=8, num_layers=1, num_frequencies=2,
                                       max_seq_len=16).save(tmp/'run_no_tok'/'model')
    return [
        (evaluate_main, [tmp/'nowhere', '--data', data], 'no such folder'),
        (evaluate_main, [tmp/'notamodel', '--data', data], 'not a model'),
        (evaluate_main, [tmp/'run_no_tok', '--data', data], 'no tokenizer found'),
        (evaluate_main, [run, '--data', tmp/'empty.jsonl'], 'no documents with text'),
        (evaluate_main, [run, '--data', tmp/'notext.jsonl'], 'line 1: no "text" string'),
        (evaluate_main, [run, '--data', tmp/'nowhere.jsonl'], 'no such file'),
        (evaluate_main, [run, '--data', tmp], 'no heldout.jsonl in this folder'),
        (evaluate_main, [run], '--data is required'),
        (evaluate_main, ['--data', data], 'MODEL is required'),
        (evaluate_main, [tmp/'lora', '--data', data], 'is not a local model folder; pass --base'),
        (evaluate_main, [run, '--data', data, '--harness'], 'is a native run'),
        (evaluate_main, [run, '--data', data, '--context', 100000], 'the model takes 2 to'),
        (evaluate_main, [run, '--data', data, '--tokenizer', tmp/'nowhere.json'], 'no tokenizer there'),
        (evaluate_main, [run, '--data', data, '--out', tmp/'foreign'], 'holds files legalnb did not write'),
        (evaluate_main, [run, '--data', data, '--out', data], 'is also an input'),
        (evaluate_main, [run, '--data', data, '--batch-tokens', 0], '--batch-tokens must be at least 1'),
        (evaluate_main, [run, '--data', data, '--citations', 'many'], "--citations: expected a whole number"),
        (evaluate_main, [run, '--data', data, '--device', 'tpu'], 'invalid choice'),
        (generate_main, [run], '--prompt is required'),
        (generate_main, [tmp/'nowhere', '--prompt', 'x'], 'no such folder'),
        (generate_main, [run, '--prompt', 'x', '--max-new-tokens', 0], '--max-new-tokens must be at least 1'),
        (generate_main, [run, '--prompt', 'x', '--top-k', -1], 'must be 0 or more'),
        (evaluate_main, [run, '--data', data, '--max-tokens', 0], '--max-tokens must be at least 1'),
        (evaluate_main, [run, '--data', data, '--max-tokens', -5], '--max-tokens must be at least 1'),
        (evaluate_main, [run, '--data', data, '--max-tokens', 'lots'], '--max-tokens: expected a whole number'),
        (evaluate_main, [run, '--data', data, '--max-tokens', 2.5], '--max-tokens: expected a whole number'),
        (evaluate_main, [run, '--data', data, '--max-tokens', 3], '--max-tokens 3: fewer than one token per document'),
        (against_main, [run, '--against', run, '--data', data, '--max-tokens', 0], '--max-tokens must be at least 1'),
    ]


def test_bad_inputs_are_one_line_and_leave_nothing(quickstart_run, corpus, tmp_path):
    cases = bad_cases(quickstart_run/'run', corpus['dir']/'heldout.jsonl', tmp_path)
    before = sorted(p for p in tmp_path.rglob('*')) + sorted(quickstart_run.rglob('*'))
    here = Path.cwd()
    os.chdir(tmp_path)   # the default --out (eval/) would be created here
    try:
        for main, argv, expect in cases:
            with pytest.raises(LegalnbError) as e, redirect_stdout(io.StringIO()): main([str(a) for a in argv])
            assert expect in str(e.value) and '\n' not in str(e.value), (argv, str(e.value))
    finally: os.chdir(here)
    assert sorted(p for p in tmp_path.rglob('*')) + sorted(quickstart_run.rglob('*')) == before


class ForwardOnly(torch.nn.Module):
    "The same model without its recurrent state: generation has to recompute the context for every token."
    def __init__(self, model): super().__init__(); self.model = model
    def forward(self, ids): return self.model(ids)


def test_generation_uses_the_recurrent_state_and_gives_the_same_tokens(corpus):
    torch.manual_seed(0)
    tok = train_tokenizer(corpus['train'], 400)
    model = ResonanceLanguageModel.from_kwargs(vocab_size=400, dim=32, num_layers=2, num_frequencies=8, max_seq_len=300,
                                               init_std=0.3).eval()
    recurrent, recompute = (EvalModel(m, tok, context=300, eos_id=0) for m in (model, ForwardOnly(model)))
    ids = tok.encode('Article 1 This Regulation lays down').ids
    for temperature in (0, 0.8):
        a = generate_ids(recurrent, ids, 60, temperature=temperature, seed=4, stop_at_eos=False)
        assert a == generate_ids(recompute, ids, 60, temperature=temperature, seed=4, stop_at_eos=False)
    assert len(set(a)) > 5, 'a model that repeats one token would make the comparison meaningless'


def test_evaluate_an_exported_resonance_model(quickstart_run, corpus, tmp_path):
    "`legalnb export` writes its own modelling code; evaluate trusts that code, and only that code."
    from legalnb.export import export_main
    assert export_main([str(quickstart_run/'run'), '--out', str(tmp_path/'hf')]) == 0
    lm = load_eval_model(tmp_path/'hf')
    native = load_eval_model(quickstart_run/'run')
    ids = torch.tensor([native.tokenizer.encode('Article 2 Definitions').ids])
    assert (lm.logits(ids) - native.logits(ids)).abs().max() < 1e-4
    cfg = json.loads((tmp_path/'hf'/'config.json').read_text())
    cfg['auto_map']['AutoModelForCausalLM'] = 'modeling_other.Model'
    (tmp_path/'hf'/'config.json').write_text(json.dumps(cfg))
    with pytest.raises(LegalnbError, match='names modelling code legalnb did not write; .*--trust-remote-code'): load_eval_model(tmp_path/'hf')


# ---------------------------------------------------------------- generation through the model's state

def traced(module: torch.nn.Module) -> list[int]:
    "The input length of every forward call of `module`, appended as they happen."
    lengths = []
    module.register_forward_pre_hook(lambda m, args, kw: lengths.append((args[0] if args else kw['input_ids']).shape[1]),
                                     with_kwargs=True)
    return lengths


def same_tokens_through_the_state(lm: EvalModel, prompt: list[int], new: int):
    "Greedy and sampled tokens with the state equal the recomputed ones; the state path runs one position per token."
    for temperature in (0, 0.8):
        a = generate_ids(lm, prompt, new, temperature, top_k=20, seed=4, stop_at_eos=False)
        b = generate_ids(lm, prompt, new, temperature, top_k=20, seed=4, stop_at_eos=False, state=False)
        assert a == b, (temperature, a, b)
    assert len(set(a)) > 3, 'a model that repeats one token would make the comparison meaningless'
    return a


def test_a_transformers_llama_generates_through_its_cache(hf):
    from legalnb.models import decoder_of, transformers_decoder
    lm = load_eval_model(hf/'tiny', context=96)      # the folder `legalnb generate` would load
    assert decoder_of(lm.module) is transformers_decoder
    torch.manual_seed(0)
    for p in lm.module.parameters(): torch.nn.init.normal_(p, std=0.3)   # a random model that does not repeat itself
    prompt = [lm.prefix_id] + lm.encode('Article 1 This Regulation lays down rules on the protection of data')
    calls = traced(lm.module)
    same_tokens_through_the_state(lm, prompt, 40)
    assert calls[:40] == [len(prompt)] + [1] * 39, 'the prompt once, then one position per token'
    same_tokens_through_the_state(lm, prompt, 90)    # past the 96-token context the window slides: recomputed


def test_the_gpt_baseline_generates_through_its_kv_cache(tiny):
    from legalnb.gpt import GPTLanguageModel
    torch.manual_seed(0)
    model = GPTLanguageModel.from_kwargs(vocab_size=400, dim=32, num_layers=2, num_heads=4, max_seq_len=80,
                                         init_std=0.3).eval()
    lm = EvalModel(model, tiny.tokenizer, context=80, eos_id=0)
    prompt = tiny.encode('Article 1 This Regulation lays down')
    calls = traced(model)
    same_tokens_through_the_state(lm, prompt, 30)
    assert calls[:30] == [len(prompt)] + [1] * 29
    same_tokens_through_the_state(lm, prompt, 100)   # 100 new tokens after the prompt: past the context of 80
    assert generate_ids(lm, prompt * 20, 5, 0) == generate_ids(lm, prompt * 20, 5, 0, state=False)  # a long prompt


def test_resonance_generation_is_unchanged(tiny):
    calls = traced(tiny.module)
    prompt = tiny.encode('Article 1 This Regulation lays down')
    same_tokens_through_the_state(tiny, prompt, 30)
    n = len(prompt)   # per temperature: one prefill (the steps are no forward pass), then 30 recomputed windows
    assert calls[:3] == [n, n, n + 1] and len(calls) == 2 * (1 + 30)


# ---------------------------------------------------------------- --max-tokens

def test_max_tokens_caps_every_document_and_says_so(quickstart_run, corpus, tmp_path):
    whole = json.loads(run_cli(evaluate_main, [quickstart_run/'run', '--data', corpus['dir'], '--out', tmp_path/'a',
                                               '--json', '--general', 'python-docs', *FAST]))
    table = run_cli(evaluate_main, [quickstart_run/'run', '--data', corpus['dir'], '--out', tmp_path/'b',
                                    '--max-tokens', 1500, '--general', 'python-docs', *FAST])
    r = json.loads((tmp_path/'b'/'eval.json').read_text(encoding='utf-8'))
    cap = r['data']['cap']
    assert r['settings']['max_tokens'] == cap['max_tokens'] == 1500
    assert r['overall']['tokens'] == cap['tokens_scored'] <= 1500
    assert cap['tokens_available'] == whole['overall']['tokens'] > 1500 and cap['docs_cut'] > 0
    assert [d['celex'] for d in r['documents']] == [d['celex'] for d in whole['documents']]   # no document dropped
    assert all(d['tokens'] > 0 for d in r['documents']) and set(r['by_language']) == set(whole['by_language'])
    assert r['general']['overall']['tokens'] <= 1500 < r['general']['cap']['tokens_available']
    assert r['citations']['items'] == whole['citations']['items'] and 'cap' not in whole['data']
    assert 'capped sample: ' in table and 'of ' in table and 'not on the whole held-out set' in table
    assert 'Capped sample: ' in (tmp_path/'b'/'eval.md').read_text(encoding='utf-8')
    again = json.loads(run_cli(evaluate_main, [quickstart_run/'run', '--data', corpus['dir'], '--out', tmp_path/'c',
                                               '--max-tokens', 1500, '--general', 'python-docs', '--json', *FAST]))
    assert again['documents'] == r['documents'], 'the same cut every time'


def test_max_tokens_with_against_scores_both_models_on_the_same_text(quickstart_run, corpus, hf, tmp_path):
    "Two tokenizers (a native run, a Llama): the first one cuts the text once, both score it, the pairing holds."
    out = run_cli(against_main, [quickstart_run/'run', '--against', hf/'tiny', '--data', corpus['dir'],
                                 '--out', tmp_path/'cmp', '--max-tokens', 1200, *FAST])
    mine, ref = (json.loads((tmp_path/'cmp'/p/'eval.json').read_text(encoding='utf-8')) for p in ('.', 'reference'))
    assert [(d['celex'], d['bytes']) for d in mine['documents']] == [(d['celex'], d['bytes']) for d in ref['documents']]
    assert mine['data']['cap']['tokens_scored'] <= 1200 and ref['data']['cap']['max_tokens'] == 1200
    assert mine['data']['cap']['docs_cut'] == ref['data']['cap']['docs_cut'] > 0
    assert 'capped sample' in out


def test_max_tokens_is_a_plan_key():
    from legalnb.commands import command_values, command_words
    s = command_values('evaluate', {'max_tokens': '20k'})
    assert s == {'max_tokens': 20000} and command_words('evaluate', s) == ['--max-tokens', '20000']
