"""`legalnb quickstart` end to end at a tiny size: every stage runs, the model learns (val loss below the uniform
ln V), and report.md and loss.png land in the workdir; a folder it did not write is refused."""
import json, math
from pathlib import Path

import pytest
import torch

from legalnb.cli import main
from legalnb.presets import get_preset

@pytest.fixture(autouse=True)
def restore_threads():
    "train(cpu_threads=1) sets torch's threads for the process: give the next test file back what it had."
    n = torch.get_num_threads(); yield; torch.set_num_threads(n)

FAST_STEPS = get_preset('scratch', 'fast', 'small', model='resonance').steps   # what the report's H100 estimate plans
TINY = ['--docs', '40', '--steps', '12', '--vocab-size', '300', '--seq-len', '32', '--device', 'cpu']

def summary_bpb(path) -> float: return json.loads(path.read_text())['overall']['bits_per_byte']

def test_quickstart_end_to_end(tmp_path, capsys):
    wd = tmp_path/'qs'
    assert main(['quickstart', '--workdir', str(wd), *TINY]) == 0
    out = capsys.readouterr().out
    assert '[sample]' in out and all(f'[{i}/7]' in out for i in range(1, 8)) and f'everything is in {wd}/' in out
    assert '[report]' in out and sorted(p.stem for p in (wd/'.legalnb-run').glob('*.json')) == sorted(
        ['parse', 'select', 'build-corpus', 'split', 'train', 'baseline', 'evaluate']), 'the stages of legalnb run'
    summary = json.loads((wd/'run'/'summary.json').read_text())
    assert math.isfinite(summary['val_loss']) and summary['val_loss'] < math.log(300), summary['val_loss']
    assert summary['steps'] == 12 and summary['device'] == 'cpu'
    # validation on the held-out acts reports bits per byte beside the loss: loss / ln 2 / bytes per token
    evals = [json.loads(l) for l in (wd/'run'/'metrics.jsonl').read_text().splitlines() if '"eval"' in l]
    assert evals and all(0 < e['val_bpb'] < 16 for e in evals) and summary['val_bpb'] == evals[-1]['val_bpb']
    ratio = [e['val_loss'] / math.log(2) / e['val_bpb'] for e in evals]   # bytes per token: the same rows each time
    assert max(ratio) - min(ratio) < 1e-9 and 1 < ratio[0] < 8
    assert (wd/'loss.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    report = (wd/'report.md').read_text()
    for part in ('## What each stage made', f"val loss {summary['val_loss']:.3f}", '![loss](loss.png)',
                 '## A generated continuation', 'H100 SXM', f'steps        {FAST_STEPS:,}', '## Where everything is',
                 '## Against a same-size baseline', 'bits per byte: overall', 'bits per byte: general text',
                 '![the change against the reference](eval/against.png)', '| baseline | `baseline/` |'):
        assert part in report, part
    # the baseline: a transformer of the run's width and depth, on the same rows for the same steps
    base = json.loads((wd/'baseline'/'summary.json').read_text())
    assert (base['steps'], base['tokens']) == (summary['steps'], summary['tokens'])
    c = json.loads((wd/'eval'/'against.json').read_text())
    assert c['reference']['name'].endswith('baseline') and c['windows'].startswith('the same windows')
    assert c['overall']['bits_per_byte']['change'] == pytest.approx(
        summary_bpb(wd/'eval'/'eval.json') - summary_bpb(wd/'eval'/'reference'/'eval.json'))
    assert (wd/'run'/'model'/'model.safetensors').exists() and (wd/'corpus'/'tokenizer.json').exists()
    # the same workdir again: the earlier outputs are replaced, not an error
    assert main(['quickstart', '--workdir', str(wd), *TINY, '--steps', '3']) == 0
    assert json.loads((wd/'run'/'summary.json').read_text())['steps'] == 3

def test_quickstart_refuses_a_folder_it_did_not_write(tmp_path, capsys):
    (tmp_path/'thesis').mkdir(); (tmp_path/'thesis'/'chapter1.tex').write_text('...')
    assert main(['quickstart', '--workdir', str(tmp_path/'thesis'), *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'not written by the quickstart' in err[0]
    assert [p.name for p in (tmp_path/'thesis').iterdir()] == ['chapter1.tex']

def test_quickstart_compare(tmp_path, capsys):
    "--compare trains the gpt baseline on the same rows and tokens and puts the comparison in the report."
    wd = tmp_path/'qs'
    assert main(['quickstart', '--workdir', str(wd), *TINY, '--compare']) == 0
    runs = json.loads((wd/'compare'/'compare.json').read_text())
    assert set(runs['models']) == {'resonance', 'gpt'} and runs['models']['gpt']['loss_at_tokens'] > 0
    report = (wd/'report.md').read_text()
    assert '## Against a transformer' in report and (wd/'compare'/'loss_vs_tokens.png').exists()

def test_training_rows_carry_the_corpus_document_starts(tmp_path, capsys):
    "A split of a corpus that wrote doc_starts/ yields them with each row, so every model resets (or masks) there."
    from legalnb.train import open_split
    wd = tmp_path/'qs'
    assert main(['quickstart', '--workdir', str(wd), *TINY, '--steps', '2']) == 0
    train_ds, val_ds = open_split(wd/'split')
    x, y, starts = train_ds[list(range(8))]
    assert starts.dtype == torch.bool and starts.shape == x.shape and train_ds.doc_starts and val_ds.doc_starts
    eos = json.loads((wd/'corpus'/'manifest.json').read_text())['eos_id']
    # a document starts right after every end-of-document token inside a row
    assert torch.equal(starts[:, 1:], x[:, :-1] == eos)
