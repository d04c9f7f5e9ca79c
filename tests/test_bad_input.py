"""Bad input across every command: each case must exit 2 with exactly one line on stderr that names the offending
path or flag, no traceback, no new files, and every file that was there before byte-identical.

A case is (name, argv, setup, expect): `argv` may use `{w}` for the case's own working folder, which starts as a
copy of a small set of good outputs (sample/, parsed.jsonl, selected.jsonl, corpus/, split/, run/) made once;
`setup(w)` then makes the bad input; `expect` is a piece of the one stderr line (the path or flag it must name).
Each module's cases live in their own list below."""
import hashlib, os, shutil, stat
from pathlib import Path

import pytest
import torch

from legalnb.cli import main

# ---------------------------------------------------------------- the good outputs every case starts from
@pytest.fixture(scope='module')
def base(tmp_path_factory):
    "sample -> parse -> select -> build-corpus -> split -> train (2 steps), at the smallest sizes."
    b = tmp_path_factory.mktemp('base')
    n = torch.get_num_threads()
    steps = [['sample', b/'sample', '--docs', '12'],
             ['parse', b/'sample', '--out', b/'parsed.jsonl'],
             ['select', b/'parsed.jsonl', '--out', b/'selected.jsonl', '--target-tokens', '1M'],
             ['build-corpus', b/'selected.jsonl', '--out', b/'corpus', '--seq-len', '32', '--shards', '2',
              '--train-tokenizer', '300', '--no-progress'],
             ['split', b/'corpus', '--out', b/'split', '--val-ratio', '0.25', '--by', 'rows'],
             ['train', '--data', b/'split', '--out', b/'run', '--dim', '16', '--num-layers', '1', '--num-frequencies', '4',
              '--batch-size', '2', '--max-steps', '2', '--save-every', '1', '--eval-every', '0', '--eval-batches', '1',
              '--num-workers', '0', '--device', 'cpu', '--cpu-threads', '1', '--no-progress']]
    for argv in steps: assert main([str(a) for a in argv]) == 0, argv
    torch.set_num_threads(n)
    return b

def snapshot(folder: Path) -> dict:
    "Every path under `folder` (links not followed) with its content hash and mode."
    out = {}
    for p in sorted(folder.rglob('*')):
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode): out[str(p.relative_to(folder))] = ('link', os.readlink(p))
        elif stat.S_ISDIR(st.st_mode): out[str(p.relative_to(folder))] = ('dir', stat.S_IMODE(st.st_mode))
        else: out[str(p.relative_to(folder))] = (hashlib.sha256(p.read_bytes()).hexdigest(), stat.S_IMODE(st.st_mode))
    return out

def write(rel: str, data: str | bytes):
    "A setup step that writes `data` to `w/rel` (replacing what is there)."
    def setup(w: Path):
        p = w/rel; p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink(): p.unlink()
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup

def nothing(w: Path): pass

# ---------------------------------------------------------------- cases, one list per module
# sources and scoring: sample, parse, select
SOURCES_CASES = [
]

# corpus and data: build-corpus, validate, split
CORPUS_CASES = [
]

# train (and resonance)
TRAIN_CASES = [
]

# hf, presets, calculator: finetune, estimate
CALCULATOR_CASES = [
]

# cli: the command itself and quickstart
CLI_CASES = [
    ('unknown command', ['trian', '--data', '{w}/split'], nothing, "unknown command 'trian'"),
    ('quickstart into a folder of the user', ['quickstart', '--workdir', '{w}/sample', '--docs', '5'], nothing, 'sample'),
]

CASES = SOURCES_CASES + CORPUS_CASES + TRAIN_CASES + CALCULATOR_CASES + CLI_CASES

@pytest.fixture(autouse=True)
def restore_threads():
    n = torch.get_num_threads(); yield; torch.set_num_threads(n)

@pytest.mark.parametrize('name,argv,setup,expect', CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, argv, setup, expect, base, tmp_path, capsys):
    w = tmp_path/'w'
    shutil.copytree(base, w, symlinks=True)
    setup(w)
    before = snapshot(w)
    capsys.readouterr()
    code = main([a.format(w=w) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert 'Traceback' not in err
    assert expect.format(w=w) in lines[0], (expect, lines[0])
    assert snapshot(w) == before, 'files changed or appeared'

def test_there_are_enough_cases():
    assert len(CASES) >= 60, len(CASES)
