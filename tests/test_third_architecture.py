"""A third architecture: the test toy (tests/toy_model.py, a one-layer Llama behind legalnb's model contract),
registered by one line here. It trains, resumes, is evaluated on held-out acts, is compared with the GPT baseline and
exports to a folder transformers loads: its spec is the whole contract (no library file names it)."""
import io, json, math, shutil
from contextlib import redirect_stdout

import pytest
import torch
from safetensors.torch import load_file

from legalnb.cli import main
from legalnb.models import MODELS, register
from toy_model import TOY, Toy, ToyConfig


def run(*argv) -> str:
    "stdout of `legalnb ARGV`, which must succeed."
    out = io.StringIO()
    with redirect_stdout(out): assert main([str(a) for a in argv]) == 0
    return out.getvalue()


@pytest.fixture(scope='module')
def toy(tmp_path_factory):
    "The toy registered, and a corpus of the generated sample with its held-out acts, split for training."
    register(TOY)
    d = tmp_path_factory.mktemp('toy')
    run('sample', d/'sample', '--docs', '40', '--seed', '3')
    run('parse', d/'sample', '--out', d/'parsed.jsonl', '--no-progress')
    run('build-corpus', d/'parsed.jsonl', '--out', d/'corpus', '--train-tokenizer', '300', '--seq-len', '32',
        '--val-docs', '0.3', '--shards', '2', '--no-progress')
    run('split', d/'corpus', '--out', d/'split')
    yield d
    del MODELS['toy']


TRAIN = ['--model', 'toy', '--size', 'small', '--batch-size', '4', '--save-every', '5', '--eval-every', '5',
         '--eval-batches', '1', '--num-workers', '0', '--device', 'cpu', '--log-every', '1', '--lr', '3e-3',
         '--max-steps', '15']


@pytest.fixture(scope='module')
def trained(toy):
    "The toy trained 15 steps in one go."
    run('train', '--data', toy/'split', '--out', toy/'run', *TRAIN)
    return toy/'run'


def test_a_registered_architecture_trains_and_resumes_where_it_stopped(toy, trained):
    "Resumed from the checkpoint of step 10, the run ends with the weights of the run that never stopped."
    s = json.loads((trained/'summary.json').read_text())
    assert s['step'] == 15 and json.loads((trained/'model'/'config.json').read_text())['architecture'] == 'toy'
    again = toy/'again'
    shutil.copytree(trained, again, ignore=shutil.ignore_patterns('model', 'summary.json'))   # killed after step 12
    shutil.rmtree(again/'checkpoints'/'step-00000015')
    run('train', '--data', toy/'split', '--out', again, *TRAIN, '--resume')
    r = json.loads((again/'summary.json').read_text())
    assert (r['step'], r['steps'], r['resumed_from']) == (15, 5, 10)
    a, b = load_file(str(trained/'model'/'model.safetensors')), load_file(str(again/'model'/'model.safetensors'))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), 'resumed: the same weights'


def test_a_registered_architecture_is_evaluated_on_held_out_acts(toy, trained):
    run('evaluate', trained, '--data', toy/'corpus'/'heldout.jsonl', '--out', toy/'eval', '--citations', '5',
        '--samples', '0', '--rouge', '0', '--bootstrap', '0', '--no-progress')
    r = json.loads((toy/'eval'/'eval.json').read_text())
    assert r['model']['kind'] == 'native' and r['model']['params'] == Toy.load(trained/'model').num_params()
    bits_per_token_guessing = math.log2(300)   # a uniform guess over the 300-token vocabulary
    assert r['overall']['docs'] > 0 and 0 < r['overall']['bits_per_byte'] < 4 * bits_per_token_guessing


def test_a_registered_architecture_is_compared_with_the_gpt_baseline(toy):
    run('compare', '--data', toy/'split', '--out', toy/'compare', '--models', 'toy,gpt', '--budget', '4000',
        '--batch-size', '4', '--dim', '16', '--num-layers', '1', '--num-heads', '2', '--device', 'cpu',
        '--eval-batches', '1')
    models = json.loads((toy/'compare'/'compare.json').read_text())['models']
    assert set(models) == {'toy', 'gpt'} and all(math.isfinite(m['loss_at_tokens']) for m in models.values())
    assert models['toy']['params'] == Toy(ToyConfig(300, 32, 16)).num_params()


def test_a_registered_architecture_exports_to_a_folder_transformers_loads(toy, trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    run('export', trained, '--out', toy/'hf')
    hf, tok = AutoModelForCausalLM.from_pretrained(toy/'hf').eval(), AutoTokenizer.from_pretrained(toy/'hf')
    ids = torch.tensor([tok.encode('Article 1 This Regulation lays down rules')])
    with torch.no_grad(): want = Toy.load(trained/'model').eval()(ids)
    assert torch.allclose(hf(input_ids=ids).logits, want, atol=1e-5)
