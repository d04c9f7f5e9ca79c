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
    ('sample: --docs 0', ['sample', '{w}/new/s', '--docs', '0'], nothing, '--docs must be at least 1'),
    ('sample: --docs -3', ['sample', '{w}/new/s', '--docs', '-3'], nothing, '--docs must be at least 1, got -3'),
    ('sample: --docs many', ['sample', '{w}/new/s', '--docs', 'many'], nothing, '--docs'),
    ('sample: into a folder of the user', ['sample', '{w}/corpus', '--docs', '3'], nothing,
     '{w}/corpus: exists and is not a legalnb sample'),
    ('sample: into a file', ['sample', '{w}/parsed.jsonl', '--docs', '3'], nothing, '{w}/parsed.jsonl'),
    ('parse: a line that is not JSON', ['parse', '{w}/bad.jsonl', '--out', '{w}/new/p.jsonl'],
     write('bad.jsonl', '{"text": "ok", "lang": "en"}\n{"text": "cut\n'), '{w}/bad.jsonl, line 2: not JSON'),
    ('parse: not UTF-8', ['parse', '{w}/bad.jsonl', '--out', '{w}/new/p.jsonl'],
     write('bad.jsonl', b'{"text": "caf\xe9", "lang": "fr"}\n'), '{w}/bad.jsonl, line 1: byte 14 is not UTF-8'),
    ('parse: duplicate key', ['parse', '{w}/bad.jsonl', '--out', '{w}/new/p.jsonl'],
     write('bad.jsonl', '{"text": "ok", "lang": "en", "lang": "de"}\n'), "{w}/bad.jsonl, line 1: duplicate key 'lang'"),
    ('parse: numeric text', ['parse', '{w}/bad.jsonl', '--out', '{w}/new/p.jsonl'],
     write('bad.jsonl', '{"text": 42, "lang": "en"}\n'), '{w}/bad.jsonl, line 1: "text" must be a string'),
    ('parse: NaN title', ['parse', '{w}/bad.jsonl', '--out', '{w}/new/p.jsonl'],
     write('bad.jsonl', '{"text": "ok", "lang": "en", "title": NaN}\n'), '{w}/bad.jsonl, line 1: "title" must be a string'),
    ('parse: lang zz', ['parse', '{w}/bad.jsonl', '--out', '{w}/new/p.jsonl'],
     write('bad.jsonl', '{"text": "ok", "lang": "zz"}\n'), "{w}/bad.jsonl, line 1: \"lang\" 'zz' is not one of the 24"),
    ('parse: year 9999', ['parse', '{w}/bad.jsonl', '--out', '{w}/new/p.jsonl'],
     write('bad.jsonl', '{"text": "ok", "lang": "en", "date": "9999-12-31"}\n'), "{w}/bad.jsonl, line 1: date '9999-12-31'"),
    ('parse: --out is its input', ['parse', '{w}/parsed.jsonl', '--out', '{w}/parsed.jsonl'], nothing,
     '--out {w}/parsed.jsonl is also an input'),
    ('parse: missing input', ['parse', '{w}/nowhere', '--out', '{w}/new/p.jsonl'], nothing, '{w}/nowhere: no such file'),
    ('parse: not a document file', ['parse', '{w}/notes.txt', '--out', '{w}/new/p.jsonl'], write('notes.txt', 'hello'),
     '{w}/notes.txt: expected a folder, a .jsonl file or a Formex .xml file'),
    ('parse: deep XML', ['parse', '{w}/deep', '--out', '{w}/new/p.jsonl'],
     write('deep/act.xml', '<ACT><BIB.INSTANCE><LG.DOC>EN</LG.DOC></BIB.INSTANCE><ENACTING.TERMS>' + '<P>' * 1000 + 'x'
           + '</P>' * 1000 + '</ENACTING.TERMS></ACT>'), '{w}/deep/act.xml: elements nested too deeply'),
    ('parse: malformed XML', ['parse', '{w}/broken', '--out', '{w}/new/p.jsonl'],
     write('broken/act.xml', '<ACT>\n<P>x</ACT>'), '{w}/broken/act.xml, line 2'),
    ('select: --out is its input', ['select', '{w}/parsed.jsonl', '--out', '{w}/parsed.jsonl', '--target-tokens', '1M'],
     nothing, '--out {w}/parsed.jsonl is also an input'),
    ('select: --report is its input', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--report', '{w}/parsed.jsonl',
                                        '--target-tokens', '1M'], nothing, '--report {w}/parsed.jsonl is also an input'),
    ('select: --report is --out', ['select', '{w}/parsed.jsonl', '--out', '{w}/selected.jsonl', '--report',
                                    '{w}/selected.jsonl', '--target-tokens', '1M'], nothing, '--report {w}/selected.jsonl'),
    ('select: --target-tokens inf', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', 'inf'],
     nothing, '--target-tokens'),
    ('select: --target-tokens eight', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', 'eight'],
     nothing, '--target-tokens'),
    ('select: --target-tokens -5', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '-5'],
     nothing, '--target-tokens'),
    ('select: --target-tokens 0', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '0'],
     nothing, '--target-tokens'),
    ('select: no --target-tokens', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl'], nothing,
     '--target-tokens is required'),
    ('select: --threshold high', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '1M',
                                   '--threshold', 'high'], nothing, '--threshold'),
    ('select: missing input', ['select', '{w}/nowhere.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '1M'], nothing,
     '{w}/nowhere.jsonl: no such file'),
    ('select: rules file bad YAML', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '1M',
                                      '--rules', '{w}/rules.yaml'], write('rules.yaml', 'threshold: [1,\n'), '{w}/rules.yaml'),
    ('select: rules file unknown rule', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '1M',
                                          '--rules', '{w}/rules.yaml'], write('rules.yaml', 'treshold: 50\n'),
     "{w}/rules.yaml: unknown rule 'treshold'"),
    ('select: missing tokenizer', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '1M',
                                    '--tokenizer', '{w}/nope.json'], nothing, '{w}/nope.json: no such tokenizer file'),
    ('select: duplicate key', ['select', '{w}/bad.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '1M'],
     write('bad.jsonl', '{"text": "ok", "lang": "en", "text": "again"}\n'), "{w}/bad.jsonl, line 1: duplicate key 'text'"),
    ('select: numeric text', ['select', '{w}/bad.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '1M'],
     write('bad.jsonl', '{"text": 42, "lang": "en"}\n'), '{w}/bad.jsonl, line 1: "text" must be a string'),
    ('select: report cannot be written', ['select', '{w}/parsed.jsonl', '--out', '{w}/selected.jsonl', '--report',
                                           '{w}/file/r.json', '--target-tokens', '1M'], write('file', ''), '{w}/file/r.json'),
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
