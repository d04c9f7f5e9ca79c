"""What a run bought against its reference, end to end: a LoRA continued-pretraining run of a tiny Llama through
`legalnb run` reporting base against trained with intervals and forgetting; `legalnb evaluate --retained` on three
runs; a public-suite-style lm-eval task read from a local file, compared with --against offline; bad inputs as one
LegalnbError line that leaves nothing behind; and the arithmetic of every new number on cases with known answers."""
import os
for _k in ('HF_DATASETS_OFFLINE', 'HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE'): os.environ.setdefault(_k, '1')

import io, json, math, random, shutil
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

from legalnb.against import compare_evaluations, retained, run_facts, verdict, NO_DIFFERENCE
from legalnb.cli import main
from legalnb.core import LegalnbError
from legalnb.locks import OWNED as RECORD
from legalnb.corpus import train_tokenizer
from legalnb.evaluate import (AGAINST_FILES, LN2, REPORT_FILES, RETAINED_FILES, EvalModel, bootstrap_estimate, evaluate,
                              evaluate_main, general_texts, read_general, read_heldout, write_general_texts)
from legalnb.resonance import ResonanceLanguageModel
from legalnb.sources import parse_documents
from legalnb.sample import write_sample

QUICK = ['--citations', '20', '--samples', '0', '--rouge', '2', '--max-new-tokens', '8', '--no-progress']


@pytest.fixture(autouse=True)
def restore_threads():
    "train(cpu_threads=1) sets torch's threads for the process: give the next test back what it had."
    n = torch.get_num_threads(); yield; torch.set_num_threads(n)


def run_cli(argv) -> str:
    "stdout of `legalnb ARGV`, which must succeed."
    out = io.StringIO()
    with redirect_stdout(out): assert main([str(a) for a in argv]) == 0
    return out.getvalue()


# ---------------------------------------------------------------- the arithmetic, on hand-made cases

def rows(act: str, bpb: float, lang: str = 'en', docs: int = 3, nbytes: int = 500) -> list[dict]:
    "`docs` documents of one act at exactly `bpb` bits per byte."
    return [dict(celex=act, lang=lang, doc_type='regulation', band='2010s', nll=bpb * nbytes * LN2, tokens=100,
                 bytes=nbytes) for _ in range(docs)]


def acts(*bpbs: float, lang: str = 'en', docs: int = 3) -> list[dict]:
    "One act per figure (A, B, ...), each of `docs` documents at exactly that many bits per byte."
    return [r for i, b in enumerate(bpbs) for r in rows('ABCDEFGH'[i], b, lang, docs)]


def test_bootstrap_resamples_acts_not_documents():
    "Five acts, one hard: a resample's figure is 1 + k (k ~ Binomial(5, 1/5) draws of it), so the interval is [1, 4]."
    five = acts(1, 1, 1, 1, 6, docs=12)
    value, ci = bootstrap_estimate(lambda a: a, [five], 'bits_per_byte')
    assert value == pytest.approx(2.0) and ci == pytest.approx([1.0, 4.0])
    lo, hi = bootstrap_estimate(lambda a: a, [[dict(r, celex=str(i)) for i, r in enumerate(five)]], 'bits_per_byte')[1]
    assert 1.3 < lo < 1.8 and 2.2 < hi < 2.8   # the 60 documents as units: an interval too narrow for a new act
    # six acts, one at 11: 1 + 10k/6 with k ~ Binomial(6, 1/6); P(k <= 2) = 94% < 97.5% <= P(k <= 3) = 99%
    value, ci = bootstrap_estimate(lambda a: a, [acts(1, 1, 1, 1, 1, 11)], 'bits_per_byte', iters=4000)
    assert value == pytest.approx(8 / 3) and ci == pytest.approx([1.0, 6.0])
    assert bootstrap_estimate(lambda a: a, [acts(1, 2, 3, 4)], 'bits_per_byte')[1] is None   # fewer than 5 acts: no interval
    # bytes weigh: an act of twice the bytes counts twice in the ratio of sums
    value, _ = bootstrap_estimate(lambda a: a, [rows('A', 1.0, nbytes=1000) + rows('B', 4.0, nbytes=500)], 'bits_per_byte')
    assert value == pytest.approx((1.0 * 1000 + 4.0 * 500) / 1500)


def test_accuracy_and_rouge_intervals_on_known_answers():
    "Accuracy and ROUGE-L are ratios of sums over acts too: the same known answers as bits per byte."
    marks = [dict(celex=a, lang='en', doc_type='regulation', band='2010s', kind='act', start=i, right=int(i < r))
             for a, r in zip('ABCDE', (1, 1, 1, 1, 6)) for i in range(10)]
    value, ci = bootstrap_estimate(lambda a: a, [marks], 'accuracy')   # 0.1 + 0.1k, k ~ Binomial(5, 1/5) draws of act E
    assert value == pytest.approx(0.2) and ci == pytest.approx([0.1, 0.4])
    openings = [dict(celex=a, rouge_l=float(a == 'E')) for a in 'ABCDE']
    value, ci = bootstrap_estimate(lambda a: a, [openings], 'rouge_l')
    assert value == pytest.approx(0.2) and ci == pytest.approx([0.0, 0.6])


def test_lm_eval_items_sum_as_lm_eval_aggregates_them():
    "Per-item rows from lm-eval's samples give back lm-eval's own aggregate: accuracy and bits per byte."
    from lm_eval.api.metrics import bits_per_byte, mean
    from legalnb.evaluate import _per_item
    pairs = [(-120.0, 50), (-30.5, 20), (-410.0, 130)]   # lm-eval's per-document (log-likelihood, bytes)
    rows_ = [dict(celex=str(i), num=n, den=d) for i, (n, d) in enumerate(_per_item(p, 'bits_per_byte') for p in pairs)]
    assert bootstrap_estimate(lambda a: a, [rows_], 'ratio', iters=0)[0] == pytest.approx(bits_per_byte(pairs))
    accs = [1.0, 0.0, 1.0, 1.0]
    rows_ = [dict(celex=str(i), num=n, den=d) for i, (n, d) in enumerate(_per_item(a, 'acc') for a in accs)]
    assert bootstrap_estimate(lambda a: a, [rows_], 'ratio', iters=0)[0] == pytest.approx(mean(accs))
    assert _per_item((1.0, 2.0), 'word_perplexity') is None   # an exponential of a ratio: left out


def test_paired_change_and_its_verdict():
    ref = acts(1, 3, 2, 2, 2)
    shift, ci = bootstrap_estimate(lambda a, b: a - b, [acts(0.9, 2.9, 1.9, 1.9, 1.9), ref], 'bits_per_byte')
    assert shift == pytest.approx(-0.1) and ci == pytest.approx([-0.1, -0.1]) and verdict(shift, ci) == 'better'
    d, ci = bootstrap_estimate(lambda a, b: a - b, [acts(0.5, 3.5, 2, 2, 2), ref], 'bits_per_byte')
    assert d == pytest.approx(0) and ci[0] < 0 < ci[1] and verdict(d, ci) == NO_DIFFERENCE
    assert verdict(0.1, [0.05, 0.2], lower_is_better=True) == 'worse'
    assert verdict(0.1, [0.05, 0.2], lower_is_better=False) == 'better'
    assert verdict(-0.1, [-0.2, 0.0]) == NO_DIFFERENCE   # 0 on the edge is inside


def evaluation(bpb: dict[str, tuple[str, float]], right: dict[str, int], general: float | None = None) -> dict:
    "An eval.json-shaped dict with the rows a comparison reads: acts {celex: (lang, bits per byte)}, right per act."
    marks = [dict(celex=a, lang=l, doc_type='regulation', band='2010s', kind='act', start=i, right=int(i < right[a]))
             for a, (l, _) in bpb.items() for i in range(10)]
    e = dict(format='legalnb.eval/2', model=dict(name='m', kind='hf', context=64, tokenizer='t', params=1),
             data=dict(docs=3, acts=3), by_language={l: {} for l, _ in bpb.values()}, by_doc_type={'regulation': {}},
             by_year_band={'2010s': {}}, documents=[r for a, (l, b) in bpb.items() for r in rows(a, b, l)],
             citations=dict(marks=marks))
    if general is not None:
        e['general'] = dict(source='g', documents=[r for i in range(6) for r in rows(f'g{i}', general + i / 10)])
    return e


def test_compare_evaluations_reports_groups_citations_and_forgetting():
    en = 'ABCDE'
    base = evaluation({a: ('en', 2.0 + i / 10) for i, a in enumerate(en)} | {'F': ('de', 2.5)},
                      dict.fromkeys(en, 1) | {'F': 1}, general=1.0)
    tuned = evaluation({a: ('en', 1.5 + i / 10) for i, a in enumerate(en)} | {'F': ('de', 2.4)},
                       dict.fromkeys(en, 5) | {'F': 3}, general=1.2)
    c = compare_evaluations(tuned, base)
    assert c['overall']['bits_per_byte']['change'] == pytest.approx((5 * -0.5 - 0.1) / 6)
    assert c['by_language']['en']['bits_per_byte']['change_ci'] == pytest.approx([-0.5, -0.5])
    assert c['by_language']['de']['bits_per_byte']['verdict'] == 'no interval (fewer than 5 acts)'
    assert c['overall']['accuracy']['change'] == pytest.approx((5 * 4 + 2) / 60) and \
        c['overall']['accuracy']['verdict'] == 'better'
    assert c['forgetting']['change'] == pytest.approx(0.2) and c['forgetting']['change_ci'] == pytest.approx([0.2, 0.2])
    assert c['forgetting']['verdict'] == 'worse'   # bits per byte on general text went up: forgot


def test_retained_share_on_hand_made_numbers():
    def run(en: float, de: float, right: int) -> dict:   # five English acts a tenth apart, one German act
        return evaluation({a: ('en', en + i / 10) for i, a in enumerate('ABCDE')} | {'F': ('de', de)},
                          dict.fromkeys('ABCDEF', right))
    base, fast, full = run(2.0, 2.5, 2), run(1.7, 2.2, 5), run(1.6, 2.1, 6)
    r = retained(base, fast, full)
    assert r['overall']['share'] == pytest.approx(0.75) and r['overall']['share_ci'] == pytest.approx([0.75, 0.75])
    assert r['by_language']['de']['share'] == pytest.approx(0.75) and r['by_language']['de']['share_ci'] is None
    assert r['citations']['share'] == pytest.approx((0.2 - 0.5) / (0.2 - 0.6))
    assert retained(base, fast, base)['overall']['share'] is None


def test_run_facts_time_and_cost(tmp_path):
    (tmp_path/'gpu').mkdir(); (tmp_path/'cpu').mkdir(); (tmp_path/'base').mkdir()
    (tmp_path/'gpu'/'summary.json').write_text(json.dumps(dict(elapsed_s=7200, device='cuda:0', world_size=2)))
    (tmp_path/'cpu'/'finetune.json').write_text(json.dumps(dict(seconds=90, device='cpu', world_size=1)))
    assert run_facts(tmp_path/'gpu', 2.5)['cost'] == pytest.approx(2 * 2 * 2.5)   # 2 h x 2 GPUs x $2.50
    assert run_facts(tmp_path/'cpu')['cost'] is None and run_facts(tmp_path/'cpu')['seconds'] == 90
    assert run_facts(tmp_path/'base') == dict(seconds=None, device=None, gpus=None, cost=None, trained=False)


def test_the_built_in_general_text():
    g = general_texts()
    assert len(g) >= 25 and all(r['licence'] == 'PSF-2.0' and 'Python' in r['source'] for r in g)
    assert g == general_texts() and len({r['id'] for r in g}) == len(g)
    assert all(len(r['text']) <= 600 for r in general_texts(600))
    docs = read_general('python-docs')
    assert [d['celex'] for d in docs] == [r['id'] for r in g] and {d['lang'] for d in docs} == {'en'}


# ---------------------------------------------------------------- tiny native runs: --against, --retained, bad input

@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    "Held-out acts of the sample and three tiny native runs trained 0, 15 and 60 steps, saved as run folders."
    d = tmp_path_factory.mktemp('against')
    write_sample(d/'sample', docs=40, seed=3)
    parse_documents([d/'sample'], d/'parsed.jsonl', progress=False)
    recs = [json.loads(l) for l in (d/'parsed.jsonl').read_text(encoding='utf-8').splitlines()]
    held = set(random.Random(0).sample(sorted({r['celex'] for r in recs}), 5))
    (d/'heldout.jsonl').write_text(''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in recs
                                           if r['celex'] in held), encoding='utf-8')
    texts = [r['text'] for r in recs if r['celex'] not in held]
    tok = train_tokenizer(texts, 400)
    ids = torch.tensor([i for t in texts for i in tok.encode(t).ids + [0]])
    for steps in (0, 15, 60):
        torch.manual_seed(0)
        m = ResonanceLanguageModel.from_kwargs(vocab_size=400, dim=32, num_layers=1, num_frequencies=4, max_seq_len=96)
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        for _ in range(steps):
            x = torch.stack([ids[s:s + 97] for s in torch.randint(0, len(ids) - 97, (16,))])
            _, loss = m(x[:, :-1], x[:, 1:]); opt.zero_grad(); loss.backward(); opt.step()
        m.save(d/f'run{steps}'/'model'); tok.save(str(d/f'run{steps}'/'model'/'tokenizer.json'))
    # what `legalnb train` records of a run: the 60-step one as if it had trained 2 h on 2 GPUs, to check the cost
    (d/'run15'/'summary.json').write_text(json.dumps(dict(elapsed_s=30, device='cpu', world_size=1)))
    (d/'run60'/'summary.json').write_text(json.dumps(dict(elapsed_s=7200, device='cuda', world_size=2)))
    write_general_texts(d/'general.jsonl', max_chars=400)
    return d


def test_against_from_the_command_line(runs, tmp_path):
    out = tmp_path/'cmp'
    text = run_cli(['evaluate', runs/'run60', '--against', runs/'run0', '--data', runs/'heldout.jsonl', '--general',
                    runs/'general.jsonl', '--out', out, *QUICK])
    assert sorted(p.name for p in out.iterdir()) == sorted([*AGAINST_FILES, *REPORT_FILES, 'reference', RECORD])
    c = json.loads((out/'against.json').read_text())
    mine, ref = (json.loads(p.read_text()) for p in (out/'eval.json', out/'reference'/'eval.json'))
    o = c['overall']['bits_per_byte']
    assert o['change'] == pytest.approx(mine['overall']['bits_per_byte'] - ref['overall']['bits_per_byte'])
    assert o['model_ci'] == mine['overall']['bits_per_byte_ci'] and o['verdict'] == 'better' and o['change_ci'][1] < 0
    assert c['windows'].startswith('the same windows') and c['reference_is_base'] is False
    assert 'general text' in c['forgetting']['source'] or c['forgetting']['source'].endswith('general.jsonl')
    assert 'bits per byte: overall' in text and 'bits per byte: general text ' in text and 'forgetting' not in text
    # the plain evaluate into the same folder replaces the comparison: no stale against.json is left to be read
    run_cli(['evaluate', runs/'run60', '--data', runs/'heldout.jsonl', '--out', out, *QUICK])
    assert sorted(p.name for p in out.iterdir()) == sorted([*REPORT_FILES, RECORD])


def test_retained_prints_the_share_for_three_runs(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv('LEGALNB_CACHE', str(tmp_path/'cache'))
    out = tmp_path/'kept'
    text = run_cli(['evaluate', '--retained', runs/'run0', runs/'run15', runs/'run60', '--data', runs/'heldout.jsonl',
                    '--out', out, '--price-per-hour', '2.5', *QUICK])
    assert sorted(p.name for p in out.iterdir()) == sorted([*RETAINED_FILES, 'base', 'fast', 'full', RECORD])
    r = json.loads((out/'retained.json').read_text())
    b, f, F = (json.loads((out/k/'eval.json').read_text())['overall']['bits_per_byte'] for k in ('base', 'fast', 'full'))
    assert r['overall']['share'] == pytest.approx((b - f) / (b - F)) and 0 < r['overall']['share'] < 1.2
    for lang, s in r['by_language'].items():
        assert s['share'] == pytest.approx((s['base'] - s['fast']) / (s['base'] - s['full']))
    assert r['facts']['full']['cost'] == pytest.approx(10.0) and r['facts']['fast']['cost'] is None
    assert '$10.00 (2 GPU)' in text and 'not trained here' in text and 'fast kept [95% interval]' in text
    assert f"reference {runs/'run0'}: scored, and kept in" in capsys.readouterr().err   # the base, for the next one


def bad_cases(runs: Path, tmp: Path):
    (tmp/'notext.jsonl').write_text('{"title": "x"}\n')
    (tmp/'foreign').mkdir(exist_ok=True); (tmp/'foreign'/'mine.txt').write_text('mine')
    (tmp/'lora').mkdir(exist_ok=True)
    (tmp/'plain-corpus').mkdir(exist_ok=True); (tmp/'plain-corpus'/'manifest.json').write_text('{"format": "x"}')
    (tmp/'lora'/'adapter_config.json').write_text('{"base_model_name_or_path": "meta-llama/Llama-3-8B"}')
    (tmp/'numlang.jsonl').write_text('{"text": "some general text", "lang": 5}\n')
    (tmp/'mdlang.jsonl').write_text('{"text": "some general text", "lang": "| en | **x** |"}\n')
    (tmp/'listlang.jsonl').write_text('{"text": "some general text", "lang": ["en"]}\n')
    (tmp/'other').mkdir(exist_ok=True); (tmp/'other'/'general.jsonl').write_text('{"text": "other text"}\n')
    (tmp/'badrun'/'.legalnb-run').mkdir(parents=True, exist_ok=True)   # a run record whose argv is an object
    (tmp/'badrun'/'.legalnb-run'/'evaluate.json').write_text('{"argv": {"model": "run"}}')
    data = runs/'heldout.jsonl'
    return [
        *[(['evaluate', runs/'run60', '--against', runs/'run0', '--data', data, '--general', tmp/f'{k}lang.jsonl'],
           'line 1: "lang" must be a language code') for k in ('num', 'md', 'list')],
        (['evaluate', runs/'run60', '--against', runs/'run0', '--data', data, '--general', runs/'general.jsonl',
          tmp/'other'/'general.jsonl'], "both are the source 'general' of the report"),
        (['evaluate', runs/'run60', '--data', data, '--general-max-tokens', '0'], '--general-max-tokens must be at least 1'),
        (['evaluate', '--retained', tmp/'badrun', runs/'run15', runs/'run60', '--data', data],
         'a damaged stage record of legalnb run ("argv" is {"model": "run"}'),
        (['evaluate', runs/'run60', '--against', '--data', data], 'trained from scratch has no base; pass --against'),
        (['evaluate', tmp/'lora', '--against', '--data', data], 'is not a local model folder; pass --base'),
        (['evaluate', runs/'run60', '--against', tmp/'nowhere', '--data', data], 'nowhere: no such folder'),
        (['evaluate', runs/'run60', '--against', runs/'run0', '--data', data, '--general', tmp/'none.jsonl'],
         'none.jsonl: no such file'),
        (['evaluate', runs/'run60', '--against', runs/'run0', '--data', data, '--general', tmp/'notext.jsonl'],
         'line 1: no "text" string'),
        (['evaluate', runs/'run60', '--against', runs/'run0', '--data', data, '--general', tmp/'plain-corpus'],
         'this corpus has no general held-out slices (no "mix" sources); build it with `legalnb build-corpus'),
        (['evaluate', runs/'run60', '--against', runs/'run0', '--data', data, '--harness'], 'with --against use'),
        (['evaluate', runs/'run60', '--against', runs/'run0', '--data', data, '--out', tmp/'foreign'],
         'holds files legalnb did not write'),
        (['evaluate', runs/'run60', '--against', runs/'run0', '--data', data, '--lm-eval-tasks', 'belebele_deu_Latn'],
         'Hugging Face models and finetune outputs'),
        (['evaluate', runs/'run60', '--data', data, '--lm-eval-tasks', tmp/'missing.yaml'], 'no such file'),
        (['evaluate', '--retained', runs/'run0', runs/'run60', '--data', data], 'expected 3 argument'),
        (['evaluate', runs/'run60', '--retained', runs/'run0', runs/'run15', runs/'run60', '--data', data],
         'drop MODEL'),
        (['evaluate', runs/'run60', '--data', data, '--rouge', '-1'], '--rouge must be at least 0'),
        (['evaluate', runs/'run60', '--data', data, '--bootstrap', '-5'], '--bootstrap must be at least 0'),
    ]


def test_bad_inputs_are_one_line_and_leave_nothing(runs, tmp_path, capsys):
    cases = bad_cases(runs, tmp_path)
    before = sorted(tmp_path.rglob('*')) + sorted(runs.rglob('*'))
    here = Path.cwd(); os.chdir(tmp_path)   # the default --out (eval/) would land here
    try:
        for argv, expect in cases:
            assert main([str(a) for a in argv]) == 2, argv
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and expect in err[0], (argv, err)
    finally: os.chdir(here)
    assert sorted(tmp_path.rglob('*')) + sorted(runs.rglob('*')) == before


# ---------------------------------------------------------------- a tiny Llama: LoRA CPT through legalnb run; lm-eval

def test_a_lora_cpt_run_of_a_tiny_llama_reports_base_against_trained(tmp_path):
    "The issue's end-to-end case: `legalnb run` on the sample, LoRA continued pretraining, report.md shows the change."
    from legalnb.hf import build_tiny_model
    from legalnb.run import read_record
    model = build_tiny_model(tmp_path/'llama')
    assert main(['sample', str(tmp_path/'formex'), '--docs', '40']) == 0
    work = tmp_path/'work'
    run_cli(['run', '--input', tmp_path/'formex', '--out', work, '--model', model, '--lora', '--target-tokens', '1M',
             '--seq-len', '32', '--shards', '2', '--val-docs', '0.25', '--force-single', '--max-steps', '12',
             '--lr', '3e-3', '--batch-size', '4', '--grad-accum', '1', '--save-steps', '100', '--workers', '0',
             '--context', '256', *QUICK[:-1], '--device', 'cpu', '--yes'])
    ev = read_record(work, 'evaluate')['argv']
    assert ev[ev.index('--against') + 1] == str(model) and ev[ev.index('--general') + 1] == 'auto'
    # no mixed corpus, no suite data on this machine: the built-in set, and the report says it was the one used
    assert json.loads((work/'eval'/'eval.json').read_text())['general']['chosen'].startswith('general text: python-docs')
    c = json.loads((work/'eval'/'against.json').read_text())
    assert c['model']['kind'] == 'lora' and c['reference_is_base'] is True and c['data']['acts'] >= 2
    o = c['overall']['bits_per_byte']
    assert o['change'] < 0 and o['change_ci'] is not None and o['verdict'] == 'better', o
    assert c['forgetting']['change_ci'] is not None and c['forgetting']['verdict'] in ('worse', 'better', NO_DIFFERENCE)
    report = (work/'report.md').read_text()
    for part in ('## Against its base', 'bits per byte: overall', 'general text (forgetting)', '95% interval',
                 'general text: python-docs, the built-in set',
                 '![the change against the reference](eval/against.png)'):
        assert part in report, part
    assert (work/'eval'/'against.png').read_bytes()[:4] == b'\x89PNG'


BELEBELE_LOCAL = '''\
task: belebele_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "P: {{{{flores_passage}}}}\\nQ: {{{{question.strip()}}}}\\nA: {{{{mc_answer1}}}}\\nB: {{{{mc_answer2}}}}\\nC: {{{{mc_answer3}}}}\\nD: {{{{mc_answer4}}}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: "{{{{['1', '2', '3', '4'].index(correct_answer_num)}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
'''

LEGALBENCH_LOCAL = r"""task: legalbench_proa_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
description: "A private right of action is when a regular person, a private citizen, is legally entitled to enforce their rights under a given statute. Does the clause specify a private right of action? Answer Yes or No.\n\n"
doc_to_text: "Statute: {{{{text}}}}\nAnswer:"
doc_to_target: "{{{{answer}}}}"
target_delimiter: " "
generation_kwargs: {{until: ["\n"], do_sample: false, temperature: 0.0, max_gen_toks: 15}}
filter_list:
  - name: get-answer
    filter: [{{function: remove_whitespace}}, {{function: take_first}}]
metric_list:
  - {{metric: exact_match, aggregation: mean, higher_is_better: true, ignore_case: true, ignore_punctuation: true}}
"""


def test_a_local_lm_eval_task_compared_against_the_base(tmp_path, monkeypatch):
    "A Belebele-shaped task read from a local file (as the docs show), scored on a LoRA model and its base offline."
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from legalnb.hf import build_tiny_model
    monkeypatch.setenv('HF_DATASETS_CACHE', str(tmp_path/'datasets-cache'))
    base = build_tiny_model(tmp_path/'tiny')
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                          LoraConfig(r=4, lora_alpha=8, target_modules=['q_proj', 'v_proj'], task_type='CAUSAL_LM'))
    torch.manual_seed(0)
    for name, p in peft.named_parameters():
        if 'lora_B' in name: torch.nn.init.normal_(p, std=0.5)
    peft.save_pretrained(tmp_path/'ft'/'final')
    rng = random.Random(0)
    items = [dict(flores_passage=f'The Regulation applies from {1990 + i}.', question=f'From when, case {i}?',
                  mc_answer1=str(1990 + i), mc_answer2=str(2000 + i), mc_answer3='never', mc_answer4='always',
                  correct_answer_num=str(rng.randint(1, 4))) for i in range(12)]
    (tmp_path/'belebele.jsonl').write_text(''.join(json.dumps(x) + '\n' for x in items))
    (tmp_path/'tasks').mkdir()
    (tmp_path/'tasks'/'belebele_local.yaml').write_text(BELEBELE_LOCAL.format(data=tmp_path/'belebele.jsonl'))
    (tmp_path/'proa.jsonl').write_text(''.join(json.dumps(dict(text=f'Any person injured by clause {i} may sue.',
                                                               answer='Yes' if i % 2 else 'No')) + '\n' for i in range(4)))
    (tmp_path/'tasks'/'legalbench_proa_local.yaml').write_text(LEGALBENCH_LOCAL.format(data=tmp_path/'proa.jsonl'))
    docs = [dict(celex=f'a{i}', lang='en', doc_type='regulation', date='2016-04-27',
                 text=f'Article 1\nThis Regulation {i} applies to operators.\n(2) Member States shall report.')
            for i in range(3)]
    (tmp_path/'held.jsonl').write_text(''.join(json.dumps(d) + '\n' for d in docs))
    out = tmp_path/'eval'
    text = run_cli(['evaluate', tmp_path/'ft', '--against', '--data', tmp_path/'held.jsonl', '--out', out,
                    '--lm-eval-tasks', tmp_path/'tasks', *QUICK])   # the folder: both its tasks
    c = json.loads((out/'against.json').read_text())
    acc = c['suites']['belebele_local']['acc']
    mine = json.loads((out/'eval.json').read_text())['suites']['belebele_local']['acc']
    assert acc['items'] == 12 and mine['value'] == pytest.approx(mine['lm_eval'])   # our per-item mean is lm-eval's
    assert mine['value'] == pytest.approx(sum(r['num'] for r in mine['rows']) / 12)
    assert acc['change'] == pytest.approx(acc['model'] - acc['reference']) and acc['verdict']
    assert 'belebele_local' in text and Path(c['reference']['name']) == base
    em = c['suites']['legalbench_proa_local']['exact_match,get-answer']   # a generation task, scored after its filter
    assert em['items'] == 4 and 0 <= em['model'] <= 1 and em['verdict']
    # general capabilities maintained: the share of the base's score kept, paired over the items
    ref = json.loads((out/'reference'/'eval.json').read_text())['suites']['belebele_local']['acc']
    assert acc['reference'] > 0 and acc['kept'] == pytest.approx(mine['value'] / ref['value'])
    assert acc['kept_ci'][0] <= acc['kept'] <= acc['kept_ci'][1] and acc['kept_verdict']
    assert acc['kept_ci'] == pytest.approx(bootstrap_estimate(lambda a, b: a / b, [mine['rows'], ref['rows']], 'ratio')[1])
    assert 'general capabilities maintained' in text and 'kept: model / base' in text


# ---------------------------------------------------------------- forgetting per language; the share of the base kept

def general_rows(shift: dict[str, float], units: int = 6) -> list[dict]:
    "General-text rows of two sources, English and French (wiki) and German (news), `shift` bits per byte up per language."
    return [dict(r, lang=l, source=s) for i in range(units) for l, s in (('en', 'wiki'), ('fr', 'wiki'), ('de', 'news'))
            for r in rows(f'{s}:{l}{i}', 1.0 + shift.get(l, 0) + i / 20)]


def with_general(e: dict, shift: dict[str, float]) -> dict:
    return e | dict(general=dict(source='corpus', documents=general_rows(shift), by_source={'wiki': {}, 'news': {}},
                                 by_language={'en': {}, 'fr': {}, 'de': {}}))


def test_forgetting_per_language_and_source_and_the_plot_that_shows_it():
    from legalnb.against import against_figure, against_markdown, against_table
    langs = {a: ('en', 2.0 + i / 10) for i, a in enumerate('ABCDE')}
    base = with_general(evaluation(langs, dict.fromkeys('ABCDE', 0)), {})
    tuned = with_general(evaluation({a: (l, b - 0.3) for a, (l, b) in langs.items()}, dict.fromkeys('ABCDE', 0)),
                         {'fr': 0.2, 'de': 0.1})
    for e in (base, tuned): e['citations']['marks'] = []   # no citation scored: the plot has no panel for them
    base['model']['name'], tuned['model']['name'] = '/models/hf/SmolLM2-135M', '/home/u/runs/cpt/final'
    f = compare_evaluations(tuned, base)['forgetting']
    assert f['by_language']['en']['change_ci'] == pytest.approx([0, 0]) and f['by_language']['en']['verdict'] == NO_DIFFERENCE
    assert f['by_language']['fr']['change'] == pytest.approx(0.2) and f['by_language']['fr']['verdict'] == 'worse'
    assert f['by_language']['de']['change_ci'] == pytest.approx([0.1, 0.1])
    assert f['by_source']['news']['change'] == pytest.approx(0.1) and f['by_source']['wiki']['change'] == pytest.approx(0.1)
    assert f['change'] == pytest.approx(0.1)   # equal bytes per language: the mean of 0, 0.2 and 0.1
    c = compare_evaluations(tuned, base)
    table = against_table(c)
    assert 'general text lang fr (forgetting)' in table and 'general text source news (forgetting)' in table
    assert 'per language: en no measurable difference, fr forgot, de forgot' in against_markdown(c)
    fig = against_figure(c)
    assert [ax.get_title(loc='left') for ax in fig.axes] == ['Held-out law: bits per byte',
                                                            'General text: bits per byte (above 0: forgot)']
    assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == [
        'overall', 'lang en', 'lang fr', 'lang de', 'source wiki', 'source news']
    assert fig._suptitle.get_text().startswith('model: cpt/final vs base: hf/SmolLM2-135M\n')
    assert compare_evaluations(tuned, base, base=False)['model']   # against another run: no 'forgot' wording
    assert 'forgetting' not in against_table(compare_evaluations(tuned, base, base=False))


def suite(right: list[int], task: str = 'belebele_local') -> dict:
    return {task: {'acc': dict(higher_is_better=True, items=len(right),
                               rows=[dict(celex=f'item {i}', num=float(r), den=1.0) for i, r in enumerate(right)])}}


def test_the_share_of_the_base_score_kept_is_paired_over_items():
    from legalnb.against import kept_table
    langs = {a: ('en', 2.0) for a in 'ABCDE'}
    e = lambda s: evaluation(langs, dict.fromkeys('ABCDE', 1)) | dict(suites=s)
    base = [1, 0] * 20                                       # right on 20 of 40 items
    same = compare_evaluations(e(suite(base)), e(suite(base)))['suites']['belebele_local']['acc']
    assert same['kept'] == 1 and same['kept_ci'] == [1, 1]   # paired: every resample keeps all of it
    half = [1, 0, 0, 0] * 10                                 # right on half the items the base got right, no other
    m = compare_evaluations(e(suite(half)), e(suite(base)))['suites']['belebele_local']['acc']
    assert m['kept'] == pytest.approx(0.5) and 0.25 < m['kept_ci'][0] < 0.5 < m['kept_ci'][1] < 0.75
    assert m['kept_verdict'] == 'kept below 90%'
    two = compare_evaluations(e(suite(half) | suite(base, 'other')), e(suite(base) | suite(base, 'other')))
    assert two['general_capabilities']['acc']['kept'] == pytest.approx(0.75)   # 30 of the base's 40, items pooled
    assert two['general_capabilities']['acc']['items'] == 80
    assert 'all suites acc (80 items)' in kept_table(two) and 'kept: model / base' in kept_table(two)
    zero = compare_evaluations(e(suite(half)), e(suite([0] * 40)))['suites']['belebele_local']['acc']
    assert zero['kept'] is None and zero['kept_verdict'].startswith('no data')


def test_the_suites_named_for_a_corpus_languages_are_lm_eval_tasks():
    import lm_eval
    from legalnb.against import language_suites
    names = language_suites(['en', 'fr', 'ga', 'mt'])
    assert names == ['global_mmlu_full_en', 'belebele_eng_Latn', 'global_mmlu_full_fr', 'belebele_fra_Latn',
                     'belebele_mlt_Latn']   # Irish: neither suite has it; Maltese: Belebele only
    root = Path(lm_eval.__file__).parent/'tasks'
    declared = {m for p in [*root.glob('belebele/*.yaml'), *root.glob('global_mmlu/full/*/_*.yaml')]
                for m in __import__('re').findall(r'^(?:task|group):\s*(\S+)', p.read_text(), __import__('re').M)}
    assert set(language_suites(['bg', 'cs', 'da', 'de', 'el', 'en', 'es', 'et', 'fi', 'fr', 'ga', 'hr', 'hu', 'it',
                                'lt', 'lv', 'mt', 'nl', 'pl', 'pt', 'ro', 'sk', 'sl', 'sv'])) <= declared


def mixed_corpus(folder: Path) -> Path:
    "A corpus folder as `legalnb build-corpus --mix` writes it: manifest.json's mix, each source's held-out slice."
    texts = {'en': 'The river flows north past the old mill and the town.',
             'fr': 'La rivière coule vers le nord le long du vieux moulin.',
             'de': 'Der Fluss fließt nach Norden am alten Mühlrad vorbei.'}
    mix = []
    for name, langs in (('wiki', ('en', 'fr')), ('news', ('de',))):
        recs = [dict(text=f'{texts[l]} {i}', lang=l, id=f'{l}{i}') for l in langs for i in range(5)]
        (folder/'mix'/name).mkdir(parents=True)
        (folder/'mix'/name/'heldout.jsonl').write_text(''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in recs),
                                                      encoding='utf-8')
        mix.append(dict(name=name, origin=f'/data/{name}', heldout=dict(file=f'mix/{name}/heldout.jsonl',
                                                                        documents=len(recs), tokens=300)))
    (folder/'manifest.json').write_text(json.dumps(dict(format='legalnb.corpus/1', mix=mix)))
    return folder


def test_general_text_per_language_from_a_mixed_corpus_folder(runs, tmp_path, capsys, monkeypatch):
    "A mixed corpus's held-out slices are the general text by default; a second arm against the same base reuses the "
    "base's evaluation (kept once in the cache) instead of scoring it again."
    monkeypatch.setenv('LEGALNB_CACHE', str(tmp_path/'cache'))
    corpus, out = mixed_corpus(tmp_path/'corpus'), tmp_path/'cmp'
    shutil.copy(runs/'heldout.jsonl', corpus/'heldout.jsonl')   # --data CORPUS: its held-out acts and its mix
    text = run_cli(['evaluate', runs/'run60', '--against', runs/'run0', '--data', corpus, '--out', out, *QUICK])
    err = capsys.readouterr().err
    assert f'general text: the held-out slices of the sources mixed into {corpus} (news, wiki), the default' in err
    assert 'scored, and kept in' in err and 'reused' not in err
    c, mine = (json.loads((out/n).read_text()) for n in ('against.json', 'eval.json'))
    g, f = mine['general'], c['forgetting']
    assert set(g['by_language']) == set(f['by_language']) == {'en', 'fr', 'de'} and list(g['by_source']) == ['wiki', 'news']
    assert g['docs'] == 15 and all(m['bits_per_byte_ci'] is not None for m in g['by_language'].values())
    for lang, ch in f['by_language'].items():
        ref = json.loads((out/'reference'/'eval.json').read_text())['general']['by_language'][lang]
        assert ch['change'] == pytest.approx(g['by_language'][lang]['bits_per_byte'] - ref['bits_per_byte'])
        assert ch['change_ci'] is not None and ch['verdict']
    assert f['source'] == str(corpus) and 'general text lang fr' in text and 'general text source news' in text
    md = (out/'eval.md').read_text()
    assert '| fr | 5 |' in md and '| news | 5 |' in md   # eval.md's general text per language and per source
    assert 'General text: the held-out slices of the sources mixed into' in md   # ... and which general text was used
    # a second arm against the same base: the base is not scored again, its evaluation is the one kept
    kept = sorted((tmp_path/'cache'/'evaluations').glob('reference-*.json'))
    assert len(kept) == 1 and g['chosen'] == json.loads(kept[0].read_text())['evaluation']['general']['chosen']
    stamp = (kept[0].stat().st_ino, kept[0].stat().st_mtime_ns)
    run_cli(['evaluate', runs/'run15', '--against', runs/'run0', '--data', corpus, '--out', tmp_path/'cmp2', *QUICK])
    err = capsys.readouterr().err
    assert f'reference {runs/"run0"}: its evaluation reused from {kept[0]}' in err and 'scored, and kept' not in err
    assert sorted((tmp_path/'cache'/'evaluations').glob('reference-*.json')) == kept
    assert (kept[0].stat().st_ino, kept[0].stat().st_mtime_ns) == stamp   # not written again
    assert (tmp_path/'cmp2'/'reference'/'eval.json').read_text() == (out/'reference'/'eval.json').read_text()
    second = json.loads((tmp_path/'cmp2'/'against.json').read_text())
    assert second['overall']['bits_per_byte']['reference'] == c['overall']['bits_per_byte']['reference']


def test_several_general_sources_each_with_its_own_cap(runs, tmp_path):
    "--general takes files and mixed corpora together, each reported apart; --general-max-tokens caps each of them and "
    "not the law."
    corpus, out = mixed_corpus(tmp_path/'corpus'), tmp_path/'ev'
    text = run_cli(['evaluate', runs/'run60', '--data', runs/'heldout.jsonl', '--general', corpus, runs/'general.jsonl',
                    '--general-max-tokens', 30, '--out', out, *QUICK])
    r = json.loads((out/'eval.json').read_text())
    g = r['general']
    assert set(g['by_source']) == {'wiki', 'news', 'general'} and g['source'] == f"{corpus}, {runs/'general.jsonl'}"
    assert all(m['tokens'] <= 30 for m in g['by_source'].values()) and g['cap']['max_tokens'] == 30
    assert 'cap' not in r['data'] and r['settings']['max_tokens'] is None   # the held-out law is scored whole
    assert g['cap']['tokens_available'] > g['overall']['tokens']
    assert 'general src general' in text and 'general src news' in text and 'at most 30 a source' in text
    md = (out/'eval.md').read_text()
    assert all(f'| {k} | ' in md for k in ('wiki', 'news', 'general'))


def test_the_reference_key_follows_the_weights_not_the_folder(runs, tmp_path):
    "The cache key: the same files elsewhere give the same key; other weights, documents or settings another one."
    from dataclasses import replace
    from legalnb.against import reference_key
    from legalnb.evaluate import EvaluateConfig
    docs = read_heldout(runs/'heldout.jsonl')
    cfg = EvaluateConfig(str(runs/'run0'), data=str(runs/'heldout.jsonl'), device='cpu')
    key = reference_key(cfg, docs, None)
    shutil.copytree(runs/'run0', tmp_path/'copy')
    assert reference_key(replace(cfg, model=str(tmp_path/'copy')), docs, None) == key
    assert reference_key(replace(cfg, seed=1), docs, None) != key
    assert reference_key(cfg, docs[1:], None) != key
    assert reference_key(cfg, docs, read_general(runs/'general.jsonl')) != key
    w = tmp_path/'copy'/'model'/'model.safetensors'
    w.write_bytes(w.read_bytes()[:-1] + bytes([w.read_bytes()[-1] ^ 1]))   # one bit of the weights
    assert reference_key(replace(cfg, model=str(tmp_path/'copy')), docs, None) != key


def test_a_hugging_face_model_gets_the_suites_cached_here_by_default(runs, tmp_path, monkeypatch, capsys):
    "--general auto (legalnb run's default) for a Hugging Face model and no mixed corpus: the lm-eval suites of the "
    "held-out languages whose data is on this machine, never one that would be fetched; else python-docs."
    import datasets.config
    from legalnb.against import cached_suites
    from legalnb.evaluate import EvaluateConfig
    model = tmp_path/'llama'; model.mkdir()   # a Hugging Face model folder as evaluate tells it (the choice needs no weights)
    (model/'config.json').write_text(json.dumps(dict(model_type='llama', architectures=['LlamaForCausalLM'])))
    monkeypatch.setattr('huggingface_hub.constants.HF_HUB_CACHE', str(tmp_path/'hub'))
    monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', tmp_path/'datasets')   # not this machine's own
    data = tmp_path/'heldout.jsonl'
    data.write_text(''.join(json.dumps(dict(celex=f'3201{i}R000{i}', lang=l, text='Article 1 text.')) + '\n'
                            for i, l in enumerate(('en', 'fr', 'ga'))))
    cfg = EvaluateConfig(str(model), data=str(data), general=['auto'])
    assert cached_suites(cfg) == cfg   # nothing cached: python-docs, as before
    snap = tmp_path/'hub'/'datasets--facebook--belebele'/'snapshots'/'abc'/'data'
    snap.mkdir(parents=True); (snap/'fra_Latn.jsonl').write_text('{}\n')
    (tmp_path/'datasets'/'CohereForAI___Global-MMLU'/'en').mkdir(parents=True)
    got = cached_suites(cfg)
    assert got.lm_eval_tasks == ['global_mmlu_full_en', 'belebele_fra_Latn'] and got.general == 'none'
    assert 'the lm-eval suites global_mmlu_full_en, belebele_fra_Latn of the held-out languages' in capsys.readouterr().err
    assert cached_suites(EvaluateConfig(str(model), data=str(data))).general is None   # evaluate's own default: none
    assert cached_suites(EvaluateConfig(str(runs/'run60'), data=str(data), general=['auto'])).lm_eval_tasks is None
