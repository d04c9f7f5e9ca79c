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
    ('parse: a line that is not JSON', ['parse', '{w}/bad.jsonl', '--out', '{w}/new/p.jsonl', '--strict'],
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
    ('parse: --out is a Formex file it reads', ['parse', '{w}/pubs', '--out', '{w}/pubs/act.xml'],
     write('pubs/act.xml', '<ACT><BIB.INSTANCE><LG.DOC>EN</LG.DOC></BIB.INSTANCE><FINAL><P>Done.</P></FINAL></ACT>'),
     '--out {w}/pubs/act.xml is a Formex file of an input folder'),
    ('parse: missing input', ['parse', '{w}/nowhere', '--out', '{w}/new/p.jsonl'], nothing, '{w}/nowhere: no such file'),
    ('parse: not a document file', ['parse', '{w}/notes.txt', '--out', '{w}/new/p.jsonl'], write('notes.txt', 'hello'),
     '{w}/notes.txt: a text file (neither XML, HTML nor JSON); expected a folder, a JSON-lines file, a Formex XML file or an '
     'XHTML/HTML page'),
    ('parse: deep XML', ['parse', '{w}/deep', '--out', '{w}/new/p.jsonl'],
     write('deep/act.xml', '<ACT><BIB.INSTANCE><LG.DOC>EN</LG.DOC></BIB.INSTANCE><ENACTING.TERMS>' + '<P>' * 1000 + 'x'
           + '</P>' * 1000 + '</ENACTING.TERMS></ACT>'), '{w}/deep/act.xml: elements nested too deeply'),
    ('parse: malformed XML', ['parse', '{w}/broken', '--out', '{w}/new/p.jsonl'],
     write('broken/act.xml', '<ACT>\n<P>x</ACT>'), '{w}/broken/act.xml, line 2'),
    ('parse: --num-proc 0', ['parse', '{w}/sample', '--out', '{w}/new/p.jsonl', '--num-proc', '0'], nothing,
     '--num-proc must be at least 1, got 0'),
    ('parse: --num-proc all', ['parse', '{w}/sample', '--out', '{w}/new/p.jsonl', '--num-proc', 'all'], nothing,
     '--num-proc'),
    ('parse: --strict and one broken publication', ['parse', '{w}/sample', '--out', '{w}/new/p.jsonl', '--strict'],
     write('sample/zz-broken/act.xml', '<ACT>\n<P>x</ACT>'), '{w}/sample/zz-broken/act.xml, line 2'),
    ('parse: only a publication in Catalan', ['parse', '{w}/ca', '--out', '{w}/new/p.jsonl'],
     write('ca/act.xml', '<ACT><BIB.INSTANCE><LG.DOC>CA</LG.DOC></BIB.INSTANCE><FINAL><P>Fet.</P></FINAL></ACT>'),
     "{w}/ca/act.xml: LG.DOC: \"lang\" 'CA' is not one of the 24"),
    ('parse: CONS.ACT without INFO.CONSLEG', ['parse', '{w}/cons', '--out', '{w}/new/p.jsonl'],
     write('cons/act.xml', '<CONS.ACT><CONS.DOC><BIB.INSTANCE><LG.DOC>PL</LG.DOC></BIB.INSTANCE><FINAL><P>x</P></FINAL>'
           '</CONS.DOC></CONS.ACT>'), '{w}/cons/act.xml: a consolidated text (CONS.ACT) needs INFO.CONSLEG'),
    ('parse: --out is the report', ['parse', '{w}/sample', '--out', '{w}/parse_report.json'], nothing,
     '--out {w}/parse_report.json'),
    ('select: --prefer newest', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '1M',
                                 '--prefer', 'newest'], nothing, '--prefer'),
    ('select: --strict and a bad line 2', ['select', '{w}/bad.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '1M',
                                           '--strict'],
     write('bad.jsonl', '{"text": "ok", "lang": "en"}\n{"text": "cut\n'), '{w}/bad.jsonl, line 2: not JSON'),
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
    ('select: neither --target-tokens nor --top', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl'], nothing,
     '--target-tokens or --top is required'),
    ('select: --top 0', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--top', '0'], nothing,
     "--top: expected a whole number of documents of at least 1, such as 10000 or 10K, got '0'"),
    ('select: --top -3', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--top', '-3'], nothing,
     "--top: expected a whole number of documents of at least 1, such as 10000 or 10K, got '-3'"),
    ('select: --top x', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--top', 'x', '--target-tokens', '1M'],
     nothing, "--top: expected a number such as"),
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
    ('build-corpus: rebuild with --shards 5000 keeps the corpus',
     ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/corpus', '--seq-len', '32', '--shards', '5000',
      '--train-tokenizer', '300', '--no-progress'], nothing, '{w}/corpus/shard_'),
    ('build-corpus: rebuild from a broken selection keeps the corpus',
     ['build-corpus', '{w}/bad.jsonl', '--out', '{w}/corpus', '--seq-len', '32', '--shards', '2', '--tokenizer',
      '{w}/corpus', '--no-progress'], write('bad.jsonl', '{"text": "ok", "lang": "en"}\n{"text": "cut\n'),
     '{w}/bad.jsonl, line 2: not JSON'),
    ('build-corpus: all texts empty', ['build-corpus', '{w}/blank.jsonl', '--out', '{w}/new', '--train-tokenizer', '300'],
     write('blank.jsonl', '{"text": "", "lang": "en"}\n' * 3), '{w}/blank.jsonl: no text to tokenize'),
    ('build-corpus: numeric text', ['build-corpus', '{w}/bad.jsonl', '--out', '{w}/new', '--train-tokenizer', '300'],
     write('bad.jsonl', '{"text": 42, "lang": "en"}\n'), '{w}/bad.jsonl, line 1: the document has "text": 42'),
    ('build-corpus: --out is its input',
     ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/selected.jsonl', '--train-tokenizer', '300'], nothing,
     '--out {w}/selected.jsonl is also an input'),
    ('build-corpus: --out holds a shard of the user',
     ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/mine', '--train-tokenizer', '300'],
     write('mine/shard_00007.npy', b'mine'), '--out {w}/mine holds files legalnb did not write (shard_00007.npy)'),
    ('build-corpus: --out holds a manifest of the user',
     ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/mine', '--train-tokenizer', '300'],
     write('mine/manifest.json', '{"mine": 1}'), '--out {w}/mine holds files legalnb did not write (manifest.json)'),
    ('build-corpus: notes added to the corpus',
     ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/corpus', '--seq-len', '16', '--train-tokenizer', '300'],
     write('corpus/notes.txt', 'my notes'), '--out {w}/corpus holds files legalnb did not write (notes.txt)'),
    ('build-corpus: --out is a file',
     ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/parsed.jsonl', '--train-tokenizer', '300'], nothing,
     '--out {w}/parsed.jsonl is a file'),
    ('build-corpus: both tokenizer flags', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new', '--tokenizer',
      '{w}/corpus', '--train-tokenizer', '300'], nothing, '--tokenizer and --train-tokenizer exclude each other'),
    ('build-corpus: no tokenizer flag', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new'], nothing,
     '--tokenizer PATH or --train-tokenizer VOCAB is required'),
    ('build-corpus: no --out', ['build-corpus', '{w}/selected.jsonl', '--train-tokenizer', '300'], nothing,
     '--out is required'),
    ('build-corpus: --train-tokenizer -5',
     ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new', '--train-tokenizer', '-5'], nothing,
     '--train-tokenizer must be at least 258'),
    ('build-corpus: --seq-len 1', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new', '--seq-len', '1',
      '--train-tokenizer', '300'], nothing, '--seq-len must be at least 2'),
    ('build-corpus: --seq-len abc', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new', '--seq-len', 'abc',
      '--train-tokenizer', '300'], nothing, "--seq-len: expected a whole number, got 'abc'"),
    ('build-corpus: --shards 0', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new', '--shards', '0',
      '--train-tokenizer', '300'], nothing, '--shards must be at least 1'),
    ('build-corpus: missing tokenizer', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new', '--tokenizer',
      '{w}/nowhere'], nothing, '{w}/nowhere: no tokenizer there'),
    ('validate: corrupt manifest.json', ['validate', '{w}/corpus'],
     write('corpus/manifest.json', '{"vocab_size": 300, "shards": ['), '{w}/corpus/manifest.json: not valid JSON'),
    ('validate: shard entry without file', ['validate', '{w}/corpus'],
     write('corpus/manifest.json', '{"shards": [{"rows": 3}]}'), '{w}/corpus/manifest.json: shards[0] has no "file"'),
    ('validate: rows.json is a list', ['validate', '{w}/split/train'], write('split/train/rows.json', '[]'),
     '{w}/split/train/rows.json: expected a rows.json index'),
    ('validate: rows.json with rows as text', ['validate', '{w}/split/train'],
     write('split/train/rows.json', '{"segments": [{"file": "x.npy", "start": "0", "stop": 2}]}'),
     '{w}/split/train/rows.json: segments[0] "start" must be a whole number of rows'),
    ('validate: --vocab-size -5', ['validate', '{w}/corpus', '--vocab-size', '-5'], nothing,
     '--vocab-size must be at least 1, got -5'),
    ('validate: unfinished build', ['validate', '{w}/corpus'],
     lambda w: (w/'corpus'/'manifest.json').rename(w/'corpus'/'manifest.partial.json'),
     '{w}/corpus: an unfinished build (manifest.partial.json, no manifest.json)'),
    ('validate: no such folder', ['validate', '{w}/nowhere'], nothing, '{w}/nowhere: no such file or folder'),
    ('split: unfinished build', ['split', '{w}/corpus', '--out', '{w}/s2'],
     lambda w: (w/'corpus'/'manifest.json').rename(w/'corpus'/'manifest.partial.json'), '{w}/corpus: an unfinished build'),
    ('split: --out is its input', ['split', '{w}/corpus', '--out', '{w}/corpus'], nothing,
     '--out {w}/corpus is also an input'),
    ('split: --out not empty', ['split', '{w}/corpus', '--out', '{w}/sample'], nothing,
     '--out {w}/sample exists and is not empty'),
    ('split: no --out', ['split', '{w}/corpus'], nothing, '--out is required'),
    ('split: --val-ratio 2', ['split', '{w}/corpus', '--out', '{w}/s2', '--val-ratio', '2'], nothing,
     '--val-ratio must be between 0 and 1'),
    ('build-corpus: --val-docs 2.5', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new', '--train-tokenizer', '300',
      '--val-docs', '2.5'], nothing, '--val-docs must be a share of the acts below 1 (0.01 = 1%) or a whole number'),
    ('build-corpus: --val-docs -1', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new', '--train-tokenizer', '300',
      '--val-docs', '-1'], nothing, '--val-docs must be a share of the acts below 1 (0.01 = 1%) or a whole number'),
    ('build-corpus: --val-docs holds out every act', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/corpus',
      '--seq-len', '32', '--shards', '2', '--train-tokenizer', '300', '--val-docs', '1000'], nothing,
     '--val-docs 1000 holds out all'),
    ('build-corpus: --val-docs abc', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new', '--train-tokenizer', '300',
      '--val-docs', 'abc'], nothing, "--val-docs: expected a number, got 'abc'"),
    ('split: --by documents without held-out acts', ['split', '{w}/corpus', '--out', '{w}/s2', '--by', 'documents'],
     nothing, '{w}/corpus: --by documents needs a corpus with held-out acts'),
    ('split: --val-ratio on a corpus with held-out acts', ['split', '{w}/held', '--out', '{w}/s2', '--val-ratio', '0.1'],
     lambda w: main(['build-corpus', str(w/'selected.jsonl'), '--out', str(w/'held'), '--seq-len', '32', '--shards', '1',
                     '--train-tokenizer', '300', '--val-docs', '1', '--val-min-acts', '0', '--no-progress']),
     '--val-ratio does not apply to {w}/held: its held-out acts'),
    ('split: --by shards', ['split', '{w}/corpus', '--out', '{w}/s2', '--by', 'shards'], nothing,
     "--by: invalid choice: 'shards'"),
    ('split: negative shape in a .npy header', ['split', '{w}/neg.npy', '--out', '{w}/s2'],
     write('neg.npy', b"\x93NUMPY\x01\x00v\x00" + b"{'descr': '<u2', 'fortran_order': False, 'shape': (-2, 33), }"
           .ljust(117) + b'\n' + bytes(132)), '{w}/neg.npy: the header gives a negative shape (-2, 33)'),
    ('split: object dtype .npy', ['split', '{w}/obj.npy', '--out', '{w}/s2'],
     write('obj.npy', b"\x93NUMPY\x01\x00v\x00" + b"{'descr': '|O', 'fortran_order': False, 'shape': (1, 2), }"
           .ljust(117) + b'\n\x80\x04N.'), '{w}/obj.npy: object dtype: expected integer token ids'),
]

# train (and resonance)
TRAIN_CASES = [  # TRAIN_RUN: the flags of the base's run/ (set by the walrus in the first case), to resume it
    ('train into a finished run', ['train', *(TRAIN_RUN := [
        '--data', '{w}/split', '--out', '{w}/run', '--dim', '16', '--num-layers', '1', '--num-frequencies', '4',
        '--batch-size', '2', '--save-every', '1', '--eval-every', '0', '--eval-batches', '1', '--num-workers', '0',
        '--device', 'cpu', '--cpu-threads', '1', '--no-progress']), '--max-steps', '4'], nothing,
     '--out {w}/run holds an earlier run (checkpoints/step-00000002); continue it with --resume'),
    ('train lr negative', ['train', '--data', '{w}/split', '--out', '{w}/new', '--lr', '-1e-3'], nothing,
     '--lr must be > 0, got -0.001'),
    ('train lr not a number', ['train', '--data', '{w}/split', '--out', '{w}/new', '--lr', 'abc'], nothing,
     "--lr: expected a number, got 'abc'"),
    ('train batch size 0', ['train', '--data', '{w}/split', '--out', '{w}/new', '--batch-size', '0'], nothing,
     '--batch-size must be > 0, got 0'),
    ('train epochs negative', ['train', '--data', '{w}/split', '--out', '{w}/new', '--epochs', '-1'], nothing,
     '--epochs must be > 0'),
    ('train precision fp8', ['train', '--data', '{w}/split', '--out', '{w}/new', '--precision', 'fp8'], nothing,
     "--precision: invalid choice: 'fp8'"),
    ('train config missing', ['train', '--config', '{w}/none.yaml', '--out', '{w}/new'], nothing,
     '{w}/none.yaml: cannot be read'),
    ('train config lr text', ['train', '--config', '{w}/bad.yaml', '--out', '{w}/new'], write('bad.yaml', 'lr: abc\n'),
     "{w}/bad.yaml: lr: expected a number, got 'abc'"),
    ('train config batch size eight', ['train', '--config', '{w}/bad.yaml', '--out', '{w}/new'],
     write('bad.yaml', 'data: split\nbatch_size: eight\n'), "{w}/bad.yaml: batch_size: expected a number, got 'eight'"),
    ('train config lr negative', ['train', '--config', '{w}/bad.yaml', '--out', '{w}/new'],
     write('bad.yaml', 'lr: -1.0e-3\n'), '{w}/bad.yaml: lr must be > 0, got -0.001'),
    ('train config unknown field', ['train', '--config', '{w}/bad.yaml', '--out', '{w}/new'],
     write('bad.yaml', 'learning_rate: 0.001\n'), '{w}/bad.yaml: unknown TrainConfig field(s) learning_rate'),
    ('train config not yaml', ['train', '--config', '{w}/bad.yaml', '--out', '{w}/new'], write('bad.yaml', 'lr: [0.1\n'),
     '{w}/bad.yaml: not valid YAML'),
    ('train config a list', ['train', '--config', '{w}/bad.yaml', '--out', '{w}/new'], write('bad.yaml', '- lr\n'),
     '{w}/bad.yaml: expected a mapping, got list; --config expects a YAML mapping of TrainConfig fields'),
    ('train config alias bomb', ['train', '--config', '{w}/bad.yaml', '--out', '{w}/new'],
     write('bad.yaml', 'x: [&a [1, 1, 1, 1, 1, 1, 1, 1, 1], ' + ', '.join(f'&{b} [{", ".join([f"*{a}"] * 9)}]'
                                                             for a, b in zip('abcdefgh', 'bcdefghi')) + ']\n'),
     '{w}/bad.yaml: line 1: its aliases (*name) expand to more than 10,000 values'),
    ('train config bool as text', ['train', '--config', '{w}/bad.yaml', '--out', '{w}/new'],
     write('bad.yaml', 'progress: maybe\n'), "{w}/bad.yaml: progress: expected true or false, got 'maybe'"),
    ('train data missing', ['train', '--data', '{w}/nowhere', '--out', '{w}/new'], nothing, '{w}/nowhere: no such folder'),
    ('train data is a corpus', ['train', '--data', '{w}/corpus', '--out', '{w}/new'], nothing,
     '{w}/corpus/train: missing; --data must be a folder written by `legalnb split'),
    ('train resume with another dim', ['train', *TRAIN_RUN, '--max-steps', '4', '--dim', '32', '--resume'], nothing,
     'step-00000002: checkpoint is from another model (dim 16 != 32)'),
    ('train resume with another lr', ['train', *TRAIN_RUN, '--max-steps', '4', '--lr', '1e-3', '--resume'], nothing,
     'step-00000002: checkpoint of a run with other settings (lr 0.0003 != 0.001)'),
    ('train resume a finished run', ['train', *TRAIN_RUN, '--max-steps', '2', '--resume'], nothing,
     'the run is already at step 2 of 2; raise --max-steps'),
    ('train preset fast on rows shorter than its warm-up', ['train', '--data', '{w}/split', '--out', '{w}/new',
     '--preset', 'fast'], nothing, '--seq-warmup-start 1,024: the rows of --data {w}/split have 32 tokens'),
    ('train seq warmup start not a divisor', ['train', '--data', '{w}/split', '--out', '{w}/new', '--seq-warmup-steps',
     '5', '--seq-warmup-start', '12'], nothing, 'pass --seq-warmup-start 8 (a divisor of 32), or --seq-warmup-steps 0'),
    ('train seq warmup without a start', ['train', '--data', '{w}/split', '--out', '{w}/new', '--seq-warmup-steps', '5'],
     nothing, '--seq-warmup-steps 5 needs seq_warmup_start'),
    ('train batch tokens zero', ['train', '--data', '{w}/split', '--out', '{w}/new', '--batch-tokens', '0'],
     nothing, '--batch-tokens must be >= 1, got 0'),
    ('train batch schedule not from step 0', ['train', '--data', '{w}/split', '--out', '{w}/new', '--batch-schedule',
     '10:4,20:2'], nothing, "--batch-schedule '10:4,20:2': the first pair must start at step 0, e.g. 0:4"),
    ('train batch schedule not pairs', ['train', '--data', '{w}/split', '--out', '{w}/new', '--batch-schedule', '0-4'],
     nothing, "pair 1 '0-4' is not FROM_STEP:GRAD_ACCUM; write e.g. 0:64,500:32,1500:16"),
    ('train batch schedule and batch tokens', ['train', '--data', '{w}/split', '--out', '{w}/new', '--batch-schedule',
     '0:4', '--batch-tokens', '256'], nothing, '--batch-schedule and batch_tokens both set the accumulation'),
    ('train init from nowhere', ['train', '--data', '{w}/split', '--out', '{w}/new', '--init-from', '{w}/nowhere'],
     nothing, '--init-from {w}/nowhere: not a model folder (RUN/model) nor a checkpoint folder'),
    ('train init optimizer from a model folder', ['train', *TRAIN_RUN[:3], '{w}/new', *TRAIN_RUN[4:], '--init-from',
     '{w}/run/model', '--init-optimizer'], nothing, '{w}/run/model is a model folder without optimizer state'),
    ('train resume without a checkpoint', ['train', '--data', '{w}/split', '--out', '{w}/new', '--resume'], nothing,
     '{w}/new/checkpoints: no checkpoint to resume from'),
    ('train resume a folder that is no checkpoint', ['train', *TRAIN_RUN, '--max-steps', '4', '--resume', '{w}/split'],
     nothing, '{w}/split: not a checkpoint folder'),
    ('train resume and overwrite', ['train', *TRAIN_RUN, '--max-steps', '4', '--resume', '--overwrite'], nothing,
     '--resume continues the run in --out and --overwrite deletes it'),
    ('train resume with a stray step-final', ['train', *TRAIN_RUN, '--max-steps', '4', '--resume'],
     lambda w: (w/'run'/'checkpoints'/'step-final').mkdir(), '{w}/run/checkpoints/step-final: not a checkpoint legalnb wrote'),
    ('train resume damaged metrics', ['train', *TRAIN_RUN, '--max-steps', '4', '--resume'],
     lambda w: (w/'run'/'metrics.jsonl').write_text('{"event": "st\n' + (w/'run'/'metrics.jsonl').read_text()),
     "{w}/run/metrics.jsonl, line 1: not a JSON record"),
    ('train resume a pickled trainer.pt', ['train', *TRAIN_RUN, '--max-steps', '4', '--resume'],  # it would create w/pwned
     lambda w: (w/'run'/'checkpoints'/'step-00000002'/'trainer.pt').write_bytes(
         b"cbuiltins\nopen\n(S'" + str(w/'pwned').encode() + b"'\nS'w'\ntR."),
     '{w}/run/checkpoints/step-00000002/trainer.pt: holds Python objects besides tensors, numbers and text'),
    ('train resume a damaged latest checkpoint', ['train', *TRAIN_RUN, '--max-steps', '4', '--resume'],
     write('run/checkpoints/step-00000002/model.pt', b'half a checkpoint'),
     'the newest checkpoint that loads is {w}/run/checkpoints/step-00000001'),
    ('train resume a damaged config.json', ['train', *TRAIN_RUN, '--max-steps', '4', '--resume'],
     write('run/checkpoints/step-00000002/config.json', '{"step": 2,'),
     '{w}/run/checkpoints/step-00000002/config.json: not valid JSON'),
    ('train out is the split', ['train', '--data', '{w}/split', '--out', '{w}/split'], nothing,
     '--out {w}/split is also an input'),
    ('train out is a file', ['train', '--data', '{w}/split', '--out', '{w}/selected.jsonl'], nothing,
     '--out {w}/selected.jsonl is a file'),
    ('train unknown model', ['train', '--data', '{w}/split', '--out', '{w}/new', '--model', 'mamba'], nothing,
     "--model must be one of resonance, gpt, got 'mamba'"),
    ('train gpt with num-frequencies', ['train', '--data', '{w}/split', '--out', '{w}/new', '--model', 'gpt',
                                        '--num-frequencies', '4'], nothing,
     "--num-frequencies: model 'gpt' has no field num_frequencies (its fields: vocab_size, dim"),
    ('train unknown size of gpt', ['train', '--data', '{w}/split', '--out', '{w}/new', '--model', 'gpt', '--size',
                                   'tiny'], nothing, "--size must be one of small, medium, large, xlarge"),
    ('train model override not field=value', ['train', '--data', '{w}/split', '--out', '{w}/new', '--model-overrides',
                                              'heads'], nothing, "expected FIELD=VALUE such as num_heads=4, got 'heads'"),
    ('train model override unknown field', ['train', '--data', '{w}/split', '--out', '{w}/new', '--model-overrides',
                                            'heads=4'], nothing, "--model-overrides: model 'resonance' has no field heads"),
    ('train model override vocab', ['train', '--data', '{w}/split', '--out', '{w}/new', '--model-overrides',
                                    'vocab_size=9'], nothing, '--model-overrides: vocab_size: set by TrainConfig.vocab_size'),
    ('train strategy zero', ['train', '--data', '{w}/split', '--out', '{w}/new', '--strategy', 'zero3'], nothing,
     "--strategy: invalid choice: 'zero3'"),
    ('train config gpt with num_frequencies', ['train', '--config', '{w}/bad.yaml', '--out', '{w}/new'],
     write('bad.yaml', 'model: gpt\nnum_frequencies: 8\n'),
     "{w}/bad.yaml: num_frequencies: model 'gpt' has no field num_frequencies"),
]

# hf, presets, calculator: finetune, estimate
CALCULATOR_CASES = [
    ('estimate tokens inf', ['estimate', '--tokens', 'inf', '--seq-len', '1024', '--sec-per-step', '1'], nothing,
     "--tokens: expected a finite number"),
    ('estimate steps 1e400', ['estimate', '--steps', '1e400', '--sec-per-step', '1'], nothing,
     '--steps: expected a finite'),
    ('estimate params inf', ['estimate', '--steps', '100', '--seq-len', '1024', '--params', 'inf', '--gpu', 'h100-sxm',
                             '--mfu', '40'], nothing, '--params: expected a finite number'),
    ('estimate params nan', ['estimate', '--steps', '100', '--params', 'nan'], nothing, '--params: expected a finite'),
    ('estimate negative examples', ['estimate', '--examples', '-100', '--sec-per-step', '1'], nothing,
     '--examples: expected a count of 0 or more'),
    ('estimate mfu -5', ['estimate', '--steps', '10', '--mfu', '-5'], nothing, '--mfu is a percent of the dense peak'),
    ('estimate mfu as a fraction', ['estimate', '--steps', '10', '--mfu', '0.4'], nothing, '--mfu is a percent'),
    ('estimate batch size eight', ['estimate', '--steps', '10', '--batch-size', 'eight'], nothing,
     "--batch-size: expected a whole number, got 'eight'"),
    ('estimate unknown gpu', ['estimate', '--steps', '10', '--gpu', 'tpu-v5'], nothing, "--gpu: unknown GPU 'tpu-v5'"),
    ('estimate preset nope', ['estimate', '--preset', 'nope', '--params', '7B'], nothing, '--preset nope: unknown'),
    ('estimate preset nope/x', ['estimate', '--preset', 'nope/x'], nothing, '--preset nope/x: unknown'),
    ('estimate two speeds', ['estimate', '--steps', '10', '--sec-per-step', '1', '--tokens-per-sec', '5k'], nothing,
     'give one speed: --sec-per-step, --tokens-per-sec or --mfu'),
    ('estimate steps and epochs', ['estimate', '--steps', '10', '--epochs', '2', '--examples', '100'], nothing,
     'give --epochs or --steps, not both'),
    ('estimate overflow', ['estimate', '--steps', '1e300', '--seq-len', '1e9', '--params', '1e200', '--gpu', 'h100-sxm',
                           '--mfu', '40'], nothing, 'overflow'),
    ('estimate qlora without lora', ['estimate', '--params', '8B', '--steps', '10', '--qlora'], nothing,
     'plan: qlora (--qlora) quantises the frozen base of a LoRA run'),
    ('estimate lora preset without examples', ['estimate', '--preset', 'lora/fast', '--params', '7B'], nothing,
     'plan: a LoRA plan counts examples: give examples (or steps)'),
    ('finetune missing model folder', ['finetune', '--model', '{w}/no-model', '--data', '{w}/sft.jsonl', '--out',
                                       '{w}/ft'],
     write('sft.jsonl', '{"prompt": "a", "response": "b"}\n'), '{w}/no-model: not a model folder (no config.json)'),
    ('finetune model without model_type', ['finetune', '--model', '{w}/model', '--data', '{w}/sft.jsonl', '--out',
                                           '{w}/ft'],
     lambda w: (write('model/config.json', '{}')(w), write('sft.jsonl', '{"prompt": "a", "response": "b"}\n')(w)),
     '{w}/model/config.json: no "model_type"'),
    ('finetune data missing', ['finetune', '--model', '{w}/model', '--data', '{w}/nope.jsonl', '--out', '{w}/ft'],
     nothing,
     '--data {w}/nope.jsonl: no such file or folder'),
    ('finetune bad data line', ['finetune', '--model', '{w}/no-model', '--data', '{w}/sft.jsonl', '--out', '{w}/ft'],
     write('sft.jsonl', '{"prompt": "a", "response": "b"}\n{oops\n'), '{w}/sft.jsonl, line 2: not JSON'),
    ('finetune out same as data', ['finetune', '--model', '{w}/model', '--data', '{w}/selected.jsonl', '--out',
                                   '{w}/selected.jsonl'], nothing, '--out {w}/selected.jsonl is also an input'),
    ('finetune out holds user files', ['finetune', '--model', '{w}/model', '--data', '{w}/selected.jsonl', '--out',
                                       '{w}/sample'], nothing, '--out {w}/sample holds files legalnb did not write'),
    ('finetune preset bogus', ['finetune', '--model', '{w}/model', '--data', '{w}/selected.jsonl', '--out', '{w}/ft',
                               '--preset', 'bogus'], nothing, "--preset: invalid choice: 'bogus'"),
    ('finetune negative lr', ['finetune', '--model', '{w}/model', '--data', '{w}/selected.jsonl', '--out', '{w}/ft',
                              '--lr', '-1e-3'], nothing, '--lr must be more than 0'),
    ('finetune lora and full', ['finetune', '--model', '{w}/model', '--data', '{w}/selected.jsonl', '--out', '{w}/ft',
                                '--lora', '--full'], nothing, '--full: not allowed with argument --lora'),
    ('finetune no out', ['finetune', '--model', '{w}/model', '--data', '{w}/selected.jsonl'], nothing,
     '--out is required'),
    ('finetune data folder not a corpus', ['finetune', '--model', '{w}/model', '--data', '{w}/sample', '--out',
                                           '{w}/ft'], nothing, '{w}/sample: no .npy or .pt files'),
    ('finetune deepspeed not json', ['finetune', '--model', '{w}/model', '--data', '{w}/selected.jsonl', '--out',
                                     '{w}/ft', '--deepspeed', '{w}/selected.jsonl'], nothing,
     '{w}/selected.jsonl: not valid JSON'),
]

# cli: the command itself and quickstart
CLI_CASES = [
    ('unknown command', ['trian', '--data', '{w}/split'], nothing, "unknown command 'trian'"),
    ('quickstart into a folder of the user', ['quickstart', '--workdir', '{w}/sample', '--docs', '5'], nothing, 'sample'),
    ('quickstart --steps not a number', ['quickstart', '--workdir', '{w}/qs', '--steps', 'many'], nothing, '--steps'),
    ('quickstart --steps 0', ['quickstart', '--workdir', '{w}/qs', '--steps', '0'], nothing, '--steps'),
    ('quickstart --docs -3', ['quickstart', '--workdir', '{w}/qs', '--docs', '-3'], nothing, '--docs'),
    ('quickstart --device tpu', ['quickstart', '--workdir', '{w}/qs', '--device', 'tpu'], nothing, '--device'),
    ('quickstart unknown flag', ['quickstart', '--workdir', '{w}/qs', '--fast'], nothing, '--fast'),
    ('quickstart --seq-len 1e400', ['quickstart', '--workdir', '{w}/qs', '--seq-len', '1e400'], nothing, '--seq-len'),
    ('evaluate a missing model', ['evaluate', '{w}/nope', '--data', '{w}/selected.jsonl', '--out', '{w}/ev'], nothing, 'nope'),
    ('evaluate missing held-out data', ['evaluate', '{w}/run', '--data', '{w}/none.jsonl', '--out', '{w}/ev'], nothing,
     'none.jsonl'),
    ('evaluate held-out data not JSON', ['evaluate', '{w}/run', '--data', '{w}/bad.jsonl', '--out', '{w}/ev'],
     write('bad.jsonl', '{"text": "a", "lang": "en"\n'), 'bad.jsonl'),
    ('generate without a prompt', ['generate', '{w}/run'], nothing, '--prompt'),
    ('generate --temperature -1', ['generate', '{w}/run', '--prompt', 'Article 1', '--temperature', '-1'], nothing,
     '--temperature'),
    ('generate --max-new-tokens many', ['generate', '{w}/run', '--prompt', 'x', '--max-new-tokens', 'many'], nothing,
     '--max-new-tokens'),
    ('run a missing plan', ['run', '{w}/nope.yaml', '--yes'], nothing, '{w}/nope.yaml: cannot be read'),
    ('run a plan that is not YAML', ['run', '{w}/plan.yaml', '--yes'], write('plan.yaml', 'input: [a\n'), 'not valid YAML'),
    ('run --deadline soon', ['run', '--input', '{w}/sample', '--out', '{w}/work', '--deadline', 'soon'], nothing,
     '--deadline soon'),
    ('run --max-cost 0', ['run', '--input', '{w}/sample', '--out', '{w}/work', '--max-cost', '0'], nothing, '--max-cost'),
    ('run an unknown flag', ['run', '--input', '{w}/sample', '--out', '{w}/work', '--sequence-length', '5'], nothing,
     '--sequence-length'),
    ('run into a folder of the user', ['run', '--input', '{w}/sample', '--out', '{w}/corpus', '--yes'], nothing,
     '--out {w}/corpus holds files legalnb did not write'),
    ('run without held-out acts', ['run', '--input', '{w}/sample', '--out', '{w}/work', '--build-corpus.val-docs', '0', '--yes'],
     nothing, 'build-corpus.val_docs is 0'),
    ('run a bad stage value', ['run', '--input', '{w}/sample', '--out', '{w}/work', '--train.lr', '0', '--yes'], nothing,
     '--lr must be > 0'),
    ('run an unknown stage flag', ['run', '--input', '{w}/sample', '--out', '{w}/work', '--train.lrr', '1', '--yes'],
     nothing, 'unrecognized arguments: --train.lrr 1; see legalnb run --help'),
    ('run a stage flag of a stage the plan lacks', ['run', '--input', '{w}/sample', '--out', '{w}/work',
     '--export.private', '--yes'], nothing, '--export.private: the plan has no export: section; add one to the plan'),
    ('run --resume with nothing to resume', ['run', '--input', '{w}/sample', '--out', '{w}/work', '--resume', '--yes'],
     nothing, '--resume continues a stopped or interrupted training'),
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


# ---------------------------------------------------------------- issue 31: nothing lost, nothing executed, round two
# One class per list, through the same harness (exit 2, one line, no traceback, every file unchanged); the classes
# that need two processes, a training compared bit for bit or a command that succeeds follow as tests of their own.
from conftest import ENV, ROOT, tree
import json, signal, subprocess, sys, time

def planted_model(rel: str, marker: str = 'pwned'):
    "A setup step: a Hugging Face folder whose config.json names legalnb's exported code files, which hold code that "
    "writes `w/marker` when it runs (nothing may run it without --trust-remote-code)."
    def setup(w: Path):
        f = w/rel; f.mkdir(parents=True)
        run = f'open({str(w/marker)!r}, "w").write("ran")\n'
        (f/'configuration_legalnb_resonance.py').write_text(run + 'from transformers import PretrainedConfig\n'
            'class LegalnbResonanceConfig(PretrainedConfig):\n    model_type = "legalnb_resonance"\n')
        (f/'modeling_legalnb_resonance.py').write_text(run)
        auto = {'AutoConfig': 'configuration_legalnb_resonance.LegalnbResonanceConfig',
                'AutoModelForCausalLM': 'modeling_legalnb_resonance.LegalnbResonanceForCausalLM'}
        (f/'config.json').write_text(json.dumps(dict(model_type='legalnb_resonance', auto_map=auto,
                                                     architectures=['LegalnbResonanceForCausalLM'])))
        shutil.copy(w/'corpus'/'tokenizer.json', f/'tokenizer.json')
        (f/'tokenizer_config.json').write_text(json.dumps(dict(tokenizer_class='PreTrainedTokenizerFast',
                                                               eos_token='<|endoftext|>')))
    return setup

def exported(rel: str, change=None):
    "A setup step: `legalnb export` of the base run into `w/rel`; `change(folder)` then alters it."
    def setup(w: Path):
        assert main(['export', str(w/'run'), '--out', str(w/rel)]) == 0
        if change: change(w/rel)
    return setup

def edited_model(rel: str, **config):
    "A setup step: a copy of the base run's model/ in `w/rel` whose config.json has `config` changed."
    def setup(w: Path):
        shutil.copytree(w/'run'/'model', w/rel)
        cfg = json.loads((w/rel/'config.json').read_text())
        (w/rel/'config.json').write_text(json.dumps({**cfg, **config}))
    return setup

def poisoned(rel: str, value: float = float('nan')):
    "A setup step: a copy of the base run (its model/ and checkpoints) in `w/rel` with one weight set to `value`."
    def setup(w: Path):
        from safetensors.torch import load_file, save_file
        shutil.copytree(w/'run', w/rel, symlinks=True)
        state = load_file(str(w/rel/'model'/'model.safetensors'))
        state['backbone.blocks.0.mlp.0.weight'][0, 0] = value
        save_file(state, str(w/rel/'model'/'model.safetensors'))
    return setup

def both(*steps):
    def setup(w: Path):
        for s in steps: s(w)
    return setup

CODE_CASES = [  # 1. no code from data: a folder's Python runs only if legalnb wrote it, byte for byte, or when asked
    ('evaluate a folder whose code only has the name of legalnb\'s',
     ['evaluate', '{w}/hf', '--data', '{w}/selected.jsonl', '--out', '{w}/ev', '--device', 'cpu'], planted_model('hf'),
     '{w}/hf/configuration_legalnb_resonance.py: not the code legalnb export writes'),
    ('finetune a folder whose code only has the name of legalnb\'s',
     ['finetune', '--model', '{w}/hf', '--data', '{w}/corpus', '--out', '{w}/ft', '--max-steps', '1', '--workers', '0',
      '--force-single'], planted_model('hf'), "{w}/hf/config.json: its auto_map names Python code (AutoConfig, "
     'AutoModelForCausalLM); finetune runs no code from a model folder'),
    ('generate from a folder whose code only has the name of legalnb\'s',
     ['generate', '{w}/hf', '--prompt', 'Article 1', '--device', 'cpu'], planted_model('hf'), '--trust-remote-code'),
    ('generate from an export with one line of code added',
     ['generate', '{w}/exp', '--prompt', 'Article 1', '--device', 'cpu'],
     exported('exp', lambda f: (f/'modeling_legalnb_resonance.py').write_text(
         (f/'modeling_legalnb_resonance.py').read_text() + f'\nopen({str(f.parent/"pwned")!r}, "w")\n')),
     '{w}/exp/modeling_legalnb_resonance.py: not the code legalnb export writes (sha256'),
    ('generate from a folder whose auto_map names other code',
     ['generate', '{w}/hf', '--prompt', 'Article 1', '--device', 'cpu'],
     both(planted_model('hf'), lambda w: (w/'hf'/'config.json').write_text(json.dumps(dict(
         model_type='x', auto_map={'AutoModelForCausalLM': 'modeling_legalnb_resonance_v2.M'}))),
          lambda w: (w/'hf'/'modeling_legalnb_resonance_v2.py').write_text((w/'hf'/'modeling_legalnb_resonance.py')
                                                                           .read_text())),
     '{w}/hf/config.json: its auto_map {{"AutoModelForCausalLM": "modeling_legalnb_resonance_v2.M"}} names modelling '
     'code legalnb did not write; loading it would run that code: pass --trust-remote-code'),
    ('evaluate an export whose tokenizer names code',
     ['evaluate', '{w}/exp', '--data', '{w}/selected.jsonl', '--out', '{w}/ev', '--device', 'cpu'],
     exported('exp', lambda f: (f/'tokenizer_config.json').write_text(json.dumps(
         {**json.loads((f/'tokenizer_config.json').read_text()), 'auto_map': {'AutoTokenizer': ['tok.T', None]}}))),
     '{w}/exp/tokenizer_config.json: its auto_map names tokenizer code legalnb did not write'),
]

OWNED_CASES = [  # 2. output folders owned: no command deletes or replaces a file it did not write
    ('run: user files under the work folder\'s split/', ['run', '--input', '{w}/sample', '--out', '{w}/work', '--yes'],
     write('work/split/mine.txt', 'my notes'), '--out {w}/work holds files legalnb did not write (split/mine.txt)'),
    ('train --overwrite: a model/ of the user', ['train', *TRAIN_RUN[:3], '{w}/mine', *TRAIN_RUN[4:], '--overwrite'],
     both(write('mine/model/config.json', '{"model_type": "llama"}'), write('mine/summary.json', '{}')),
     '--out {w}/mine holds files legalnb did not write (model/config.json, summary.json); train writes '
     'checkpoints/, metrics.jsonl, summary.json, model/ and tb/ there, and --overwrite deletes them'),
    ('train --overwrite: a file of the user inside the run\'s model/', ['train', *TRAIN_RUN, '--overwrite'],
     write('run/model/README.md', 'my model card'), '--out {w}/run holds files legalnb did not write (model/README.md)'),
    ('export --out over another Hugging Face model', ['export', '{w}/run', '--out', '{w}/hf'],
     both(write('hf/config.json', '{"model_type": "llama"}'), write('hf/model.safetensors', b'weights'),
          write('hf/generation_config.json', '{}')),
     '--out {w}/hf holds files legalnb did not write (config.json, generation_config.json, model.safetensors)'),
    ('evaluate --export-lm-eval over a citations.jsonl of the user',
     ['evaluate', '--data', '{w}/selected.jsonl', '--export-lm-eval', '{w}/tasks'],
     write('tasks/citations.jsonl', '{"mine": 1}\n'), '--export-lm-eval {w}/tasks holds files legalnb did not write '
                                                     '(citations.jsonl)'),
    ('evaluate --out over an eval.json of the user', ['evaluate', '{w}/run', '--data', '{w}/selected.jsonl', '--out',
     '{w}/ev', '--device', 'cpu'], write('ev/eval.json', '{}'), '--out {w}/ev holds files legalnb did not write (eval.json)'),
    ('quickstart: its own folder names, the user\'s files', ['quickstart', '--workdir', '{w}/qs'],
     both(write('qs/.legalnb-quickstart', ''), write('qs/corpus/mine.npy', b'mine')),
     '--workdir {w}/qs: corpus/mine.npy was not written by legalnb, and corpus/ would be deleted with it'),
]

STAGE_CASES = [  # 4. staged data is the data: a staging folder holds only copies legalnb made, checked first
    ('run --stage-to: a shard of the user in the copy', ['run', '--input', '{w}/sample', '--out', '{w}/work', '--yes',
     '--stage-to', '{w}/local'], write('local/split/train/shard_00000.npy', b'not the data'),
     '--stage-to {w}/local/split holds files legalnb did not write (train/shard_00000.npy)'),
]

LINK_CASES = [  # 5. links followed: the folder a link leads to is the folder checked (and written)
    ('train --overwrite through a link to a folder with a model/ of the user',
     ['train', *TRAIN_RUN[:3], '{w}/link', *TRAIN_RUN[4:], '--overwrite'],
     both(write('theirs/model/config.json', '{"model_type": "llama"}'),
          lambda w: (w/'link').symlink_to(w/'theirs', target_is_directory=True)),
     '--out {w}/link (-> {w}/theirs) holds files legalnb did not write (model/config.json)'),
    ('build-corpus through a link to a folder of the user',
     ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/link', '--train-tokenizer', '300'],
     both(write('theirs/notes.txt', 'mine'), lambda w: (w/'link').symlink_to(w/'theirs', target_is_directory=True)),
     '--out {w}/theirs holds files legalnb did not write (notes.txt)'),   # the corpus's check names the folder it leads to
]

SIZE_CASES = [  # 6. sizes and numbers checked before use
    ('evaluate a config.json of a million-wide model', ['evaluate', '{w}/big', '--data', '{w}/selected.jsonl', '--out',
     '{w}/ev', '--device', 'cpu', '--tokenizer', '{w}/corpus/tokenizer.json'], edited_model('big', dim=10**6),
     '{w}/big/config.json: 12,'),
    ('generate from a config.json of 100,000 layers', ['generate', '{w}/big', '--prompt', 'x', '--device', 'cpu',
     '--tokenizer', '{w}/corpus/tokenizer.json'], edited_model('big', num_layers=100_000),
     '{w}/big/config.json: num_layers 100,000 is beyond 1,024 layers'),
    ('generate from a model that needs more memory than is free', ['generate', '{w}/big', '--prompt', 'x', '--device',
     'cpu', '--tokenizer', '{w}/corpus/tokenizer.json'], edited_model('big', dim=2**16, vocab_size=2**20),
     'GiB are free in memory; check its sizes'),
    ('export a config.json with a context of 10^12 tokens', ['export', '{w}/big', '--out', '{w}/hf', '--tokenizer',
     '{w}/corpus/tokenizer.json'], edited_model('big', max_seq_len=10**12),
     '{w}/big/config.json: max_seq_len 1,000,000,000,000 is beyond 16,777,216 tokens'),
    ('train --init-from a config.json of a million-wide model', ['train', *TRAIN_RUN[:3], '{w}/new', *TRAIN_RUN[4:],
     '--init-from', '{w}/big'], edited_model('big', dim=10**6), '{w}/big/config.json: 12,'),
    ('evaluate NaN weights', ['evaluate', '{w}/nan', '--data', '{w}/selected.jsonl', '--out', '{w}/ev', '--device', 'cpu',
     '--tokenizer', '{w}/corpus/tokenizer.json'], poisoned('nan'),
     '{w}/nan/model/model.safetensors: tensor backbone.blocks.0.mlp.0.weight holds 1 NaN or infinite value(s)'),
    ('generate from infinite weights', ['generate', '{w}/inf', '--prompt', 'Article', '--device', 'cpu', '--temperature',
     '0', '--tokenizer', '{w}/corpus/tokenizer.json'], poisoned('inf', float('inf')),
     'tensor backbone.blocks.0.mlp.0.weight holds 1 NaN or infinite'),
    ('export NaN weights', ['export', '{w}/nan', '--out', '{w}/hf', '--tokenizer', '{w}/corpus/tokenizer.json'],
     poisoned('nan'), '{w}/nan/model/model.safetensors: tensor backbone.blocks.0.mlp.0.weight holds 1 NaN'),
]

ROUND_TWO = CODE_CASES + OWNED_CASES + STAGE_CASES + LINK_CASES + SIZE_CASES   # 3. locks: two processes, below

def refused_in_one_line(argv, setup, expect, base, tmp_path, capsys) -> Path:
    "Run `argv` on a copy `w` of `base` that `setup` prepared: exit 2, one line holding `expect`, every file unchanged."
    w = tmp_path/'w'
    shutil.copytree(base, w, symlinks=True)
    setup(w)
    before, files = snapshot(w), tree(w)
    capsys.readouterr()
    code = main([a.format(w=w) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and 'Traceback' not in err, (code, err)
    assert expect.format(w=w) in lines[0], (expect, lines[0])
    assert snapshot(w) == before and tree(w) == files, 'files changed or appeared'
    return w

@pytest.mark.parametrize('name,argv,setup,expect', ROUND_TWO, ids=[c[0] for c in ROUND_TWO])
def test_round_two(name, argv, setup, expect, base, tmp_path, capsys):
    "The harness above, with `tree()` (every file's bytes, links followed) beside `snapshot()`, and nothing run."
    w = refused_in_one_line(argv, setup, expect, base, tmp_path, capsys)
    assert not (w/'pwned').exists(), 'code of the model folder ran'
    assert not list(tmp_path.rglob('*.legalnb-lock')), 'a lock was left behind'


def legalnb(*argv, timeout: int = 300) -> subprocess.CompletedProcess:
    "`legalnb ARGV` in a process of its own (this checkout, one thread)."
    return subprocess.run([sys.executable, '-m', 'legalnb.cli', *map(str, argv)], env=ENV, capture_output=True,
                          text=True, timeout=timeout)

def lock_holder(folder: Path, command: str) -> subprocess.Popen:
    "A process that takes the lock of `folder` through legalnb and holds it until it is killed."
    code = (f'import time\nfrom legalnb.locks import folder_lock\nwith folder_lock({str(folder)!r}, {command!r}):\n'
            '    print("locked", flush=True); time.sleep(600)')
    p = subprocess.Popen([sys.executable, '-c', code], env=ENV, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == 'locked\n'
    return p

def one_line(p: subprocess.CompletedProcess) -> str:
    "The one stderr line of a refused command (exit 2, no traceback)."
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and 'Traceback' not in p.stderr, (p.returncode, p.stderr[-2000:])
    return lines[0]

def test_a_folder_being_written_is_refused_and_a_killed_writers_lock_is_taken_over(base, tmp_path):
    "3. Locked: two build-corpus runs on one --out (the first killed with -9 while it holds the lock)."
    w = tmp_path/'w'
    shutil.copytree(base, w, symlinks=True)
    argv = ['build-corpus', w/'selected.jsonl', '--out', w/'corpus', '--seq-len', '16', '--shards', '2',
            '--train-tokenizer', '300', '--no-progress']
    holder = lock_holder(w/'corpus', f'legalnb build-corpus --out {w/"corpus"}')
    try:
        files = tree(w)
        line = one_line(legalnb(*argv))
        assert f'--out {w/"corpus"} is being written by pid {holder.pid} on ' in line and 'legalnb build-corpus' in line
        line = one_line(legalnb('split', w/'selected.jsonl', '--out', w/'corpus'/'split'))   # a folder inside it
        assert f'is inside {w/"corpus"}, which is being written by pid {holder.pid}' in line, line
        line = one_line(legalnb('quickstart', '--workdir', w, '--docs', '3'))                 # a folder around it
        assert f'holds {w/"corpus"}, which is being written by pid {holder.pid}' in line, line
        assert tree(w) == files, 'the refused commands changed nothing'
    finally: holder.kill(); holder.wait()
    assert (w/'.corpus.legalnb-lock').exists(), 'kill -9: the lock file stays (its flock went with the process)'
    p = legalnb(*argv)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f'took over the lock of pid {holder.pid} on ' in p.stdout, p.stdout
    assert not (w/'.corpus.legalnb-lock').exists(), 'released'
    from legalnb.corpus import file_sha256
    man = json.loads((w/'corpus'/'manifest.json').read_text())
    assert man['seq_len'] == 16 and all(file_sha256(w/'corpus'/r['file']) == r['sha256'] for r in man['shards'])

def test_two_trainings_of_one_folder_the_second_is_refused_and_resume_takes_over_after_kill_9(base, tmp_path):
    "3. Locked, with two real `legalnb train` processes: one metrics.jsonl, written by one process at a time."
    out = tmp_path/'run'
    args = ['train', '--data', base/'split', '--out', out, '--dim', '16', '--num-layers', '1', '--num-frequencies', '4',
            '--batch-size', '2', '--save-every', '5', '--eval-every', '0', '--log-every', '1', '--num-workers', '0',
            '--device', 'cpu', '--cpu-threads', '1', '--no-progress']
    a = subprocess.Popen([sys.executable, '-m', 'legalnb.cli', *map(str, args), '--max-steps', '100000'], env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not list((out/'checkpoints').glob('step-*')):   # training: the lock is held, a checkpoint is written
            assert a.poll() is None, a.stderr.read()
            assert time.time() < deadline, 'no checkpoint in 240 s'
            time.sleep(0.2)
        os.kill(a.pid, signal.SIGSTOP)   # alive and holding the lock, without taking a core while the others start
        line = one_line(legalnb(*args, '--max-steps', '10'))
        assert f'--out {out} is being written by pid {a.pid} on ' in line and '(legalnb train, since ' in line, line
        line = one_line(legalnb(*args, '--max-steps', '10', '--overwrite'))
        assert f'is being written by pid {a.pid}' in line, '--overwrite does not break a lock'
    finally: a.kill(); a.wait()
    step = max(int(p.name.split('-')[1]) for p in (out/'checkpoints').glob('step-*'))
    c = legalnb(*args, '--max-steps', step + 3, '--resume')
    assert c.returncode == 0, c.stderr[-2000:]
    assert f'took over the lock of pid {a.pid} on ' in c.stdout, c.stdout
    from legalnb.metrics import read_metrics
    steps = [r['step'] for r in read_metrics(out/'metrics.jsonl')]
    assert steps == list(range(1, step + 4)), 'one writer at a time: every step once, in order'
    assert not (tmp_path/'.run.legalnb-lock').exists()

def short_documents(path: Path, n: int = 400):
    "Held-out-able acts of a dozen tokens each: every row of a 32-token corpus holds several documents."
    path.write_text(''.join(json.dumps(dict(celex=f'3202{i % 10}R{i:04d}', lang='en', doc_type='regulation',
                                            date='2020-01-01', text=f'Article {i}. This applies to item {i * 7}.'))
                            + '\n' for i in range(n)))

def test_training_from_the_staged_copy_is_training_from_the_original(tmp_path, capsys):
    "4. Staged data is the data: the copy holds the document starts, and the weights trained on it are the same bytes."
    from legalnb.run import stage_split
    short_documents(tmp_path/'sel.jsonl')
    assert main(['build-corpus', tmp_path/'sel.jsonl', '--out', tmp_path/'corpus', '--seq-len', '32', '--shards', '2',
                 '--train-tokenizer', '300', '--val-docs', '0.1', '--no-progress']) == 0
    assert main(['split', tmp_path/'corpus', '--out', tmp_path/'split']) == 0
    staged = stage_split(tmp_path/'split', tmp_path/'local', progress=False)
    assert 'every checksum verified' in capsys.readouterr().out
    assert sorted(p.name for p in (staged/'train'/'doc_starts').iterdir()) == ['shard_00000.npy', 'shard_00001.npy']
    assert not [p for p in staged.rglob('*') if p.is_symlink()], 'copies, not links into the corpus'
    tiny = ['--dim', '16', '--num-layers', '1', '--num-frequencies', '4', '--batch-size', '4', '--max-steps', '6',
            '--save-every', '6', '--eval-every', '3', '--eval-batches', '2', '--num-workers', '0', '--device', 'cpu',
            '--cpu-threads', '1', '--no-progress', '--seed', '3']
    for data, out in ((tmp_path/'split', 'from-original'), (staged, 'from-copy')):
        assert main(['train', '--data', data, '--out', tmp_path/out, *tiny]) == 0
    a, b = ((tmp_path/o/'model'/'model.safetensors').read_bytes() for o in ('from-original', 'from-copy'))
    assert a == b, 'the same weights, bit for bit'
    s = [json.loads((tmp_path/o/'summary.json').read_text())['val_loss'] for o in ('from-original', 'from-copy')]
    assert s[0] == s[1]
    # a staged file of the right size (and time) but other content is not "verified": it is copied again
    f = staged/'train'/'doc_starts'/'shard_00000.npy'
    st, data = f.stat(), bytearray(f.read_bytes())
    data[-1] ^= 1; f.write_bytes(bytes(data)); os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    capsys.readouterr()
    stage_split(tmp_path/'split', staged, progress=False)
    assert 'copied 1 of ' in capsys.readouterr().out
    assert f.read_bytes() == (tmp_path/'corpus'/'doc_starts'/'shard_00000.npy').read_bytes()

def test_every_out_may_be_a_link_and_rebuilds_go_through_it(base, tmp_path, capsys):
    "5. Links work: a build and a rebuild through a linked --out, and every other command's folder as a link."
    w = tmp_path/'w'
    shutil.copytree(base, w, symlinks=True)
    def link(name: str) -> Path:
        (w/f'{name}-real').mkdir(); (w/name).symlink_to(w/f'{name}-real', target_is_directory=True); return w/name
    c = link('c')
    for seq in (16, 24):   # a build, then a rebuild (another row length) through the link
        assert main(['build-corpus', w/'selected.jsonl', '--out', c, '--seq-len', seq, '--shards', '2',
                     '--train-tokenizer', '300', '--no-progress']) == 0
        assert c.is_symlink() and json.loads((w/'c-real'/'manifest.json').read_text())['seq_len'] == seq
    train = ['--dim', '16', '--num-layers', '1', '--num-frequencies', '4', '--batch-size', '2', '--max-steps', '2',
             '--eval-every', '0', '--eval-batches', '1', '--num-workers', '0', '--device', 'cpu', '--cpu-threads', '1',
             '--no-progress']
    s, r, h, e, smp = (link(n) for n in ('s', 'r', 'h', 'e', 'smp'))
    assert main(['split', c, '--out', s, '--val-ratio', '0.25', '--by', 'rows']) == 0
    assert main(['train', '--data', s, '--out', r, *train]) == 0
    assert main(['train', '--data', s, '--out', r, *train, '--overwrite']) == 0
    assert main(['export', r, '--out', h]) == 0 and main(['export', r, '--out', h]) == 0
    assert main(['evaluate', r, '--data', w/'selected.jsonl', '--out', e, '--device', 'cpu', '--samples', '0',
                 '--citations', '5', '--no-progress']) == 0
    assert main(['sample', smp, '--docs', '3']) == 0 and main(['sample', smp, '--docs', '4']) == 0
    for name, made in (('c', 'manifest.json'), ('s', 'split.json'), ('r', 'summary.json'), ('h', 'config.json'),
                       ('e', 'eval.json'), ('smp', 'sample.json')):
        assert (w/name).is_symlink() and (w/f'{name}-real'/made).is_file(), name
    assert not [p.name for p in w.iterdir() if p.name.startswith('.')], 'no .trash, .rebuild, .old or lock left'

def test_trust_remote_code_is_asked_for_and_legalnb_s_own_export_needs_none(base, tmp_path, capsys):
    "1. No code from data: the flag the refusals name runs the folder's code; legalnb's own export runs unasked."
    w = tmp_path/'w'
    shutil.copytree(base, w, symlinks=True)
    exported('exp')(w)
    assert main(['generate', w/'exp', '--prompt', 'Article 1', '--max-new-tokens', '5', '--device', 'cpu']) == 0
    planted_model('hf')(w)
    try: main(['generate', w/'hf', '--prompt', 'x', '--device', 'cpu', '--trust-remote-code'])
    except Exception: pass   # the planted code is no model; the point is that it ran because the user said so
    assert (w/'pwned').read_text() == 'ran'

def test_overwrite_deletes_what_its_help_says_and_nothing_else(base, tmp_path, capsys):
    "2. Owned: `train --overwrite` deletes the earlier run's outputs as its help lists them, and keeps the user's files."
    from legalnb.train import RUN_OUTPUTS, train_parser
    help = ' '.join(train_parser().format_help().split())
    said = help.split('--overwrite, --no-overwrite', 1)[1][:120]
    assert all(n in said for n in RUN_OUTPUTS), said
    w = tmp_path/'w'
    shutil.copytree(base, w, symlinks=True)
    (w/'run'/'notes.md').write_text('mine'); (w/'run'/'tb-mine').mkdir(); (w/'run'/'tb-mine'/'x').write_text('mine')
    before = {p.relative_to(w/'run') for p in (w/'run').rglob('*') if p.is_file()}
    assert main(['train', *[a.format(w=w) for a in TRAIN_RUN], '--max-steps', '1', '--overwrite']) == 0
    after = {p.relative_to(w/'run') for p in (w/'run').rglob('*') if p.is_file()}
    assert (w/'run'/'notes.md').read_text() == 'mine' and (w/'run'/'tb-mine'/'x').read_text() == 'mine'
    gone = before - after
    assert gone and all(p.parts[0] in RUN_OUTPUTS for p in gone), gone   # step-00000002 of the earlier run
    assert (w/'run'/'checkpoints'/'step-00000001').is_dir() and not (w/'run'/'checkpoints'/'step-00000002').exists()

def test_a_run_folder_from_before_the_records_is_refused_with_the_way_out_then_resumes(base, tmp_path, capsys):
    "2. Owned: a run an older legalnb wrote (no records) is refused by `train --resume`; `legalnb own` lets it resume."
    from legalnb.locks import OWNED
    w = tmp_path/'w'
    shutil.copytree(base, w, symlinks=True)
    for record in (w/'run').rglob(OWNED): record.unlink()            # as every run folder was before the records
    resume = ['train', *[a.format(w=w) for a in TRAIN_RUN], '--max-steps', '3', '--resume']
    before = snapshot(w/'run')
    capsys.readouterr()
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert f'holds files legalnb did not write' in err and f'`legalnb own {w/"run"}` marks them as its own' in err, err
    assert snapshot(w/'run') == before                               # refused: nothing touched
    assert main(['own', str(w/'run')]) == 0
    assert "files recorded as legalnb's" in capsys.readouterr().out
    assert main(resume) == 0                                         # the run continues from its step 2
    from legalnb.metrics import read_metrics
    assert [r['step'] for r in read_metrics(w/'run'/'metrics.jsonl')][-1] == 3


# ---------------------------------------------------------------- issue 39: locks and records that cannot be aimed
# A symbolic link at a lock path (to a user's file, or dangling) is refused in one line and never followed; a record
# lists only relative paths inside its folder; `legalnb own` refuses folders it cannot vouch for. Same harness, and
# the planted link's target keeps every byte (tree() follows links) while nothing appears outside the folder.
PRECIOUS = 'my thesis, chapter 3\n'

def lock_link(lock_rel: str, target_rel: str = 'precious.txt'):
    "A setup step: `w/lock_rel` is a symbolic link to `w/target_rel` (the user's file, or a path that does not exist)."
    def setup(w: Path):
        (w/'precious.txt').write_text(PRECIOUS); (w/'outside').mkdir(exist_ok=True)
        (w/lock_rel).symlink_to(w/target_rel)
    return setup

def record_listing(rel: str, entry: str):
    "A setup step: the ownership record of `w/rel` also lists `entry` ('{w}' is the case's folder)."
    def setup(w: Path):
        from legalnb.locks import OWNED
        (w/'precious.txt').write_text(PRECIOUS)
        rec = json.loads((w/rel/OWNED).read_text())
        rec['files'][entry.format(w=w)] = 'legalnb train'
        (w/rel/OWNED).write_text(json.dumps(rec))
    return setup

LOCK_CASES = [  # 1. a link at the lock path: refused, its target byte for byte, nothing made outside the folder
    ('train with a link at its lock path', ['train', *TRAIN_RUN, '--max-steps', '3', '--resume'],
     lock_link('.run.legalnb-lock'), '--out {w}/run: its lock {w}/.run.legalnb-lock is a symbolic link (to '
     '{w}/precious.txt); legalnb never writes through one: remove the link and run again'),
    ('export with a link at its lock path', ['export', '{w}/run', '--out', '{w}/hf'], lock_link('.hf.legalnb-lock'),
     '--out {w}/hf: its lock {w}/.hf.legalnb-lock is a symbolic link (to {w}/precious.txt)'),
    ('own with a dangling link at its lock path', ['own', '{w}/run'],
     lock_link('.run.legalnb-lock', 'outside/made.txt'), '{w}/run: its lock {w}/.run.legalnb-lock is a symbolic link '
     '(to {w}/outside/made.txt)'),
    ('build-corpus with a link at its lock path', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/corpus',
     '--seq-len', '16', '--shards', '2', '--train-tokenizer', '300', '--no-progress'],
     lock_link('.corpus.legalnb-lock'), '--out {w}/corpus: its lock {w}/.corpus.legalnb-lock is a symbolic link'),
    ('parse with a link at its lock path', ['parse', '{w}/sample', '--out', '{w}/p.jsonl'], lock_link('.p.jsonl.lock'),
     'legalnb parse: its lock {w}/.p.jsonl.lock is a symbolic link (to {w}/precious.txt)'),
]

def listed_around(entry: str):
    "A setup step: the user's file `w/proj/entry` (in a folder of theirs) is listed by a record in `w/proj`."
    def setup(w: Path):
        from legalnb.locks import OWNED
        (w/'proj'/entry).parent.mkdir(parents=True); (w/'proj'/entry).write_text(PRECIOUS)
        (w/'proj'/OWNED).write_text(json.dumps(dict(format='legalnb.owned/1', files={entry: 'legalnb run'})))
    return setup

RECORD_CASES = [  # 2. records that vouch too much: one line, nothing deleted
    ('train --overwrite into the user\'s folder that a record around it lists',
     ['train', *[a.replace('{w}/run', '{w}/proj/mine') for a in TRAIN_RUN], '--max-steps', '3', '--overwrite'],
     listed_around('mine/summary.json'), '--out {w}/proj/mine holds files legalnb did not write (summary.json)'),
    ('train --overwrite: a record listing an absolute path', ['train', *TRAIN_RUN, '--max-steps', '3', '--overwrite'],
     record_listing('run', '{w}/precious.txt'), "{w}/run/.legalnb-owned.json: a damaged record of legalnb (it lists "
     "'{w}/precious.txt', not a relative path inside {w}/run); delete it"),
    ('train --overwrite: a record listing ../', ['train', *TRAIN_RUN, '--max-steps', '3', '--overwrite'],
     record_listing('run', '../precious.txt'), "a damaged record of legalnb (it lists '../precious.txt'"),
    ('export over an export whose record lists an absolute path', ['export', '{w}/run', '--out', '{w}/hf'],
     both(exported('hf'), record_listing('hf', '{w}/precious.txt')),
     "{w}/hf/.legalnb-owned.json: a damaged record of legalnb (it lists '{w}/precious.txt'"),
    ('own /', ['own', '/'], nothing, '/: the root or home folder (or one above it) holds the files of every program'),
    ('own the home folder', ['own', '{w}/home'], write('home/.bashrc', 'alias ll="ls -l"\n'),
     '{w}/home: the root or home folder'),
    ('own a folder holding another program\'s files', ['own', '{w}/proj'],
     both(write('proj/.git/HEAD', 'ref: refs/heads/main\n'), write('proj/notes.md', 'mine')),
     '{w}/proj holds files of other programs (.git); name those legalnb wrote: legalnb own {w}/proj --files NAME...'),
    ('own a folder of plain user files (issue 48.7)', ['own', '{w}/docs'],
     both(write('docs/thesis.pdf', '%PDF-1.7'), write('docs/photos/beach.jpg', 'JFIF'), write('docs/notes.md', 'mine')),
     '{w}/docs holds files of other programs (photos/beach.jpg, thesis.pdf); name those legalnb wrote: legalnb own '
     '{w}/docs --files NAME...'),
]

def linked_tb(w: Path):
    "A setup step: run/tb is a link to the user's folder outside/tb, recorded as legalnb's (as `legalnb own` would)."
    from legalnb.locks import record_as
    (w/'outside'/'tb').mkdir(parents=True); (w/'outside'/'tb'/'events.out').write_text(PRECIOUS)
    (w/'run'/'tb').symlink_to(w/'outside'/'tb'); record_as(w/'run', ['tb'], 'legalnb own')

RECORD_CASES += [  # issue 48: --overwrite checks every link before it deletes anything
    ('train --overwrite with a linked tb/ that a record lists', ['train', *TRAIN_RUN, '--max-steps', '3', '--overwrite'],
     linked_tb, '--out {w}/run: tb is a symbolic link (to {w}/outside/tb); --overwrite deletes only what a run wrote'),
]

ROUND_THREE = LOCK_CASES + RECORD_CASES

@pytest.mark.parametrize('name,argv,setup,expect', ROUND_THREE, ids=[c[0] for c in ROUND_THREE])
def test_round_three_locks_and_records(name, argv, setup, expect, base, tmp_path, capsys, monkeypatch):
    "The round-two harness; the home folder is `w/home` here. A planted link stays, and its target is unchanged."
    monkeypatch.setenv('HOME', str(tmp_path/'w'/'home'))
    w = refused_in_one_line(argv, setup, expect, base, tmp_path, capsys)
    if (w/'precious.txt').exists(): assert (w/'precious.txt').read_text() == PRECIOUS
    assert not (w/'outside'/'made.txt').exists(), 'a file was made through a dangling link'

def test_own_lists_only_the_files_named_in_a_folder_that_holds_others(base, tmp_path, capsys):
    "2. `legalnb own F --files ...` records only those, so the user's files there stay theirs."
    from legalnb.locks import owned_files
    run = tmp_path/'run'
    shutil.copytree(base/'run', run, symlinks=True)
    for record in run.rglob('.legalnb-owned.json'): record.unlink()
    (run/'.ipynb_checkpoints').mkdir(); (run/'.ipynb_checkpoints'/'x.ipynb').write_text('{}')
    (run/'notes.md').write_text('mine')
    assert main(['own', run]) == 2
    assert main(['own', run, '--files', 'checkpoints', 'summary.json', 'model']) == 0
    owned = owned_files(run)
    assert Path('summary.json') in owned and Path('model/model.safetensors') in owned
    assert Path('notes.md') not in owned and not any(p.parts[0] == '.ipynb_checkpoints' for p in owned)

# ---------------------------------------------------------------- issue 39: a resumed parse verifies what it trusts
# A parse stopped after three batches leaves their files and markers; one of them is then damaged the way a disk, a
# copy or a hand can damage it. The resumed parse reads that batch again, says so in one line, and writes the bytes an
# uninterrupted parse writes.
def cut_last_line(parts: Path):
    "Batch 1's file loses its last document (a write that stopped short: 144 of 146)."
    lines = (parts/'0000001.jsonl').read_bytes().splitlines(keepends=True)
    (parts/'0000001.jsonl').write_bytes(b''.join(lines[:-1]))

def swap_files(parts: Path):
    "Batch 1's file is batch 0's (documents written twice, others missing)."
    shutil.copyfile(parts/'0000000.jsonl', parts/'0000001.jsonl')

def empty_marker(parts: Path):
    "Batch 1's marker lists no documents (its documents would be dropped from the output)."
    marker = json.loads((parts/'0000001.json').read_text()); marker['docs'] = []
    (parts/'0000001.json').write_text(json.dumps(marker))

TAMPERED = [('a truncated batch file', cut_last_line, 'its file holds {n} of {m} documents'),
            ("a batch file swapped for another batch's", swap_files, 'its file '),
            ('a marker listing no documents', empty_marker, 'its marker lists 0 of {m} documents')]

@pytest.fixture(scope='module')
def sample12(tmp_path_factory):
    "12 sample publications and their uninterrupted parse, in batches of 3 files."
    d = tmp_path_factory.mktemp('resume-parse')
    assert main(['sample', str(d/'sample'), '--docs', '12']) == 0
    assert main(['parse', str(d/'sample'), '--out', str(d/'whole.jsonl'), '--batch-files', '3', '--num-proc', '1']) == 0
    return d

@pytest.mark.parametrize('name,tamper,expect', TAMPERED, ids=[c[0] for c in TAMPERED])
def test_round_three_a_tampered_parse_batch_is_parsed_again(name, tamper, expect, sample12, tmp_path, capsys):
    "3. The damaged batch is read again (one line naming it); the output is the uninterrupted parse byte for byte."
    from legalnb.sources import parse_documents, parts_folder
    def stop_after_3(marker):
        if marker['batch'] == 2: raise KeyboardInterrupt
    out = tmp_path/'parsed.jsonl'
    with pytest.raises(KeyboardInterrupt):
        parse_documents([sample12/'sample'], out, False, num_proc=1, batch_files=3, on_batch=stop_after_3)
    parts = parts_folder(out)
    m = len(json.loads((parts/'0000001.json').read_text())['docs'])
    assert m >= 2 and (parts/'0000000.jsonl').read_bytes() != (parts/'0000001.jsonl').read_bytes()
    tamper(parts)
    capsys.readouterr()
    assert main(['parse', str(sample12/'sample'), '--out', str(out), '--batch-files', '3', '--num-proc', '1']) == 0
    said = [l for l in capsys.readouterr().out.splitlines() if 'read again:' in l]
    assert len(said) == 1 and said[0].startswith('legalnb parse: batch 1 of the earlier run read again: '), said
    assert expect.format(n=m - 1, m=m) in said[0], said
    assert out.read_bytes() == (sample12/'whole.jsonl').read_bytes()

# ---------------------------------------------------------------- issue 39: smaller cases
def test_round_three_a_lock_held_by_a_killed_unreaped_process_is_taken_over(tmp_path):
    "A writer killed but not yet reaped by its parent (a zombie: `kill(pid, 0)` still succeeds) holds no lock."
    import socket
    from legalnb.locks import folder_lock, lock_path
    zombie = subprocess.Popen(['sleep', '60']); zombie.kill()
    state = lambda: Path(f'/proc/{zombie.pid}/stat').read_text().rsplit(')', 1)[1].split()[0]
    for _ in range(500):
        if state() == 'Z': break
        time.sleep(0.01)
    try:
        assert state() == 'Z'
        os.kill(zombie.pid, 0)   # what made the lock look held
        rec = dict(pid=zombie.pid, host=socket.gethostname(), command='legalnb train', started=time.time())
        lock_path(tmp_path/'run').write_text(json.dumps(rec))
        with folder_lock(tmp_path/'run', 'legalnb train') as stale: assert stale['pid'] == zombie.pid
    finally: zombie.wait()

def test_round_three_a_utf16_formex_act_is_read_as_its_utf8_twin(sample12, tmp_path):
    "A valid UTF-16 Formex act (byte-order mark, encoding declared) gives the document its UTF-8 copy gives."
    from legalnb.sources import parse_documents
    act = next(p for p in sorted((sample12/'sample').rglob('*.xml')) if b'<ACT' in p.read_bytes()[:200])
    text = act.read_text(encoding='utf-8')
    (tmp_path/'utf8').mkdir(); (tmp_path/'utf16').mkdir()
    (tmp_path/'utf8'/act.name).write_text(text, encoding='utf-8')
    (tmp_path/'utf16'/act.name).write_bytes(text.replace('encoding="UTF-8"', 'encoding="UTF-16"', 1).encode('utf-16'))
    assert (tmp_path/'utf16'/act.name).read_bytes()[:2] in (b'\xff\xfe', b'\xfe\xff')
    docs = {}
    for enc in ('utf8', 'utf16'):
        counts = parse_documents([tmp_path/enc], tmp_path/f'{enc}.jsonl', False, num_proc=1)
        assert counts['documents'] == 1, (enc, counts)
        docs[enc] = json.loads((tmp_path/f'{enc}.jsonl').read_text()); docs[enc].pop('source')
    assert docs['utf16'] == docs['utf8'] and len(docs['utf8']['text']) > 100

KILL_IN_SELECT = ('import os, signal, sys; import legalnb.scoring as s; '
                  's._spill_versions = lambda *a: os.kill(os.getpid(), signal.SIGKILL); '
                  'from legalnb.cli import main; main(sys.argv[1:])')

def test_round_three_the_temporary_folders_of_a_killed_select_are_removed_by_the_next(sample12, tmp_path):
    "A select killed half-way leaves its `.select-*` folder; the next select removes it, and only what legalnb left."
    import socket
    from legalnb.scoring import SELECT_RECORD
    argv = ['select', str(sample12/'whole.jsonl'), '--out', str(tmp_path/'selected.jsonl'), '--target-tokens', '1M']
    killed = subprocess.run([sys.executable, '-c', KILL_IN_SELECT, *argv], env=ENV, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    left = sorted(tmp_path.glob('.select-*'))
    assert len(left) == 1 and (left[0]/SELECT_RECORD).is_file() and len(list(left[0].iterdir())) > 1, left
    (tmp_path/'.select-mine').mkdir(); (tmp_path/'.select-mine'/'notes.md').write_text('mine')   # the user's
    (tmp_path/'.select-notes.txt').write_text('mine too')
    running = tmp_path/'.select-running'; running.mkdir()   # a select still running here (this process)
    (running/SELECT_RECORD).write_text(json.dumps(dict(pid=os.getpid(), host=socket.gethostname(),
                                                       command='legalnb select', started=time.time())))
    assert main(argv) == 0
    left = sorted(p.name for p in tmp_path.glob('.select-*'))
    assert left == ['.select-mine', '.select-notes.txt', '.select-running'], left
    assert (tmp_path/'.select-mine'/'notes.md').read_text() == 'mine' and (running/SELECT_RECORD).is_file()


# ---------------------------------------------------------------- issue 39: plans parsed with limits, numbers bounded
# A plan's YAML is read with bounds (nesting, aliases expanded) before anything is built, and every value is checked
# against the flag it sets; numeric flags are bounded before any work; reports and records are checked by their
# schema. Each is one line through the round-two harness.
def plan(text: str):
    "A setup step: `w/plan.yaml` holds `text` (paths in it start from `w`)."
    return write('plan.yaml', text)

PLAN = 'input: sample\nout: work\n'
BOMB = 'select:\n  languages: [&a [lol, lol, lol, lol, lol, lol, lol, lol, lol], ' + ', '.join(
    f'&{b} [{", ".join([f"*{a}"] * 9)}]' for a, b in zip('abcdefgh', 'bcdefghi')) + ']\n'

def calibration(edit):
    "A setup step: `w/report.json` is the committed GPU check's report with `edit(report, its first passed check)`."
    def setup(w: Path):
        r = json.loads((ROOT/'tests'/'fixtures'/'gpu_check_dry_run.json').read_text())
        edit(r, r['checks']['train-resonance']['calibration'])
        (w/'report.json').write_text(json.dumps(r))
    return setup

def stage_record(stage: str, rec: dict):
    "A setup step: the work folder of `legalnb run` (legalnb's: recorded by `legalnb own`) holds `rec` for `stage`."
    def setup(w: Path):
        write(f'work/.legalnb-run/{stage}.json', json.dumps(rec))(w)
        assert main(['own', str(w/'work')]) == 0
    return setup

ESTIMATE = ['estimate', '--steps', '10', '--seq-len', '256', '--model-size', 'small', '--calibration', '{w}/report.json']

PLAN_CASES = [  # 4. plans parsed with limits, every value checked against its flag
    ('run a YAML alias bomb', ['run', '{w}/plan.yaml', '--yes'], plan(PLAN + BOMB),
     '{w}/plan.yaml: line 4: its aliases (*name) expand to more than 10,000 values'),
    ('run a plan nested 100,000 deep', ['run', '{w}/plan.yaml', '--yes'], plan('input: ' + '[' * 100_000 + '\n'),
     '{w}/plan.yaml: line 1: nested deeper than 32 levels'),
    ('run a plan whose input holds nested lists', ['run', '{w}/plan.yaml', '--yes'],
     plan('input: [[sample, parsed.jsonl]]\nout: work\n'),
     '{w}/plan.yaml: input: expected a path or a list of paths, got a list holding a list'),
    ('run a plan whose out is a list', ['run', '{w}/plan.yaml', '--yes'], plan('input: sample\nout: [a, b]\n'),
     '{w}/plan.yaml: out: expected a path, got a list'),
    ('run a plan with a list for a number', ['run', '{w}/plan.yaml', '--yes'],
     plan(PLAN + 'train: {max_steps: [1, 2]}\n'), 'train.max_steps: expected one value, got a list'),
    ('run a plan with a word for a number', ['run', '{w}/plan.yaml', '--yes'],
     plan(PLAN + 'train: {max_steps: many}\n'), "{w}/plan.yaml: train.max_steps: expected a whole number, got 'many'"),
    ('run a plan with a mapping for a path', ['run', '{w}/plan.yaml', '--yes'],
     plan(PLAN + 'evaluate: {general: {path: x}}\n'),
     'evaluate.general: expected a value or a list of values, got a mapping'),
    ('run a plan with a number for a switch', ['run', '{w}/plan.yaml', '--yes'],
     plan(PLAN + 'select: {strict: 3}\n'), 'select.strict: expected true or false, got 3'),
    ('run a plan with a value outside its choices', ['run', '{w}/plan.yaml', '--yes'],
     plan(PLAN + 'split: {by: pages}\n'), 'split.by: expected one of auto, documents, files, rows, got pages'),
]

FLAG_CASES = [  # 5. numbers bounded before any work, files and records checked by what they must hold
    ('select --near-dup 1', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '1M',
     '--near-dup', '1'], nothing, '--near-dup must be a Jaccard similarity above 0 and at most 0.99'),
    ('evaluate --bootstrap 1000000000', ['evaluate', '{w}/run', '--data', '{w}/selected.jsonl', '--out', '{w}/ev',
     '--device', 'cpu', '--bootstrap', '1000000000'], nothing, '--bootstrap must be at most 100,000, got 1,000,000,000 (the default is 1,000)'),
    ('evaluate --max-new-tokens 1000000000', ['evaluate', '{w}/run', '--data', '{w}/selected.jsonl', '--out', '{w}/ev',
     '--device', 'cpu', '--max-new-tokens', '1000000000'], nothing,
     '--max-new-tokens must be at most 100,000 (tokens per continuation), got 1,000,000,000'),
    ('generate --max-new-tokens 1000000000', ['generate', '{w}/run', '--prompt', 'Article 1', '--max-new-tokens',
     '1000000000'], nothing, '--max-new-tokens must be at most 100,000'),
    ('select --num-proc 100000', ['select', '{w}/parsed.jsonl', '--out', '{w}/new/s.jsonl', '--target-tokens', '1M',
     '--num-proc', '100000'], nothing, '--num-proc 100,000 would start 100,000 processes'),
    ('build-corpus --num-proc 100000', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new/c', '--seq-len', '32',
     '--train-tokenizer', '300', '--num-proc', '100000'], nothing, '--num-proc 100,000 would start 100,000 processes'),
    ('parse --num-proc 100000', ['parse', '{w}/sample', '--out', '{w}/new/p.jsonl', '--num-proc', '100000'], nothing,
     '--num-proc 100,000 would start 100,000 processes'),
    ('build-corpus --num-proc 0', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new/c', '--seq-len', '32',
     '--train-tokenizer', '300', '--num-proc', '0'], nothing, '--num-proc must be at least 1, got 0'),
    ('build-corpus a binary --val-acts', ['build-corpus', '{w}/selected.jsonl', '--out', '{w}/new/c', '--seq-len', '32',
     '--train-tokenizer', '300', '--val-acts', '{w}/acts.txt'], write('acts.txt', b'\x89PNG\r\n\x1a\n\x00\xff\xfe'),
     '--val-acts {w}/acts.txt: not UTF-8 text; expected a manifest.json or a list of CELEX'),
    ('run a stage record whose argv is not a list of words', ['run', '--input', '{w}/sample', '--out', '{w}/work',
     '--yes'], stage_record('parse', dict(stage='parse', argv=[1, 2], inputs=[], finished=True)),
     '{w}/work/.legalnb-run/parse.json: a damaged stage record (argv: expected a list of strings)'),
    ('run a stage record whose finished is a word', ['run', '--input', '{w}/sample', '--out', '{w}/work', '--yes'],
     stage_record('parse', dict(stage='parse', argv=['x'], inputs=[None], finished='yes')),
     '{w}/work/.legalnb-run/parse.json: a damaged stage record (finished: expected true or false); delete it'),
    ('estimate: a calibration report whose environment is a word', ESTIMATE,
     calibration(lambda r, c: r.update(environment='h100')),
     '{w}/report.json: environment: expected an object, got a string; expected the report.json'),
    ('estimate: a calibration whose gpu is a number', ESTIMATE,
     calibration(lambda r, c: c['plan'].update(gpu=5)),
     '{w}/report.json: checks.train-resonance.calibration.plan.gpu: expected a string or null, got a number'),
    ('estimate: a calibration whose speed is a list', ESTIMATE,
     calibration(lambda r, c: c.update(tokens_per_sec=[1])),
     '{w}/report.json: checks.train-resonance.calibration.tokens_per_sec: expected a number, got a list'),
    ('estimate: a calibration whose peak is true', ESTIMATE, calibration(lambda r, c: c.update(peak_bytes=True)),
     'checks.train-resonance.calibration.peak_bytes: expected a number, got true'),
    ('estimate: a calibration whose model is a number', ESTIMATE, calibration(lambda r, c: c.update(model=5)),
     'checks.train-resonance.calibration.model: expected a string, got a number'),
    ('estimate: a calibration whose dry_run is a word', ESTIMATE, calibration(lambda r, c: r.update(dry_run='no')),
     '{w}/report.json: dry_run: expected true or false, got a string'),
]

LIMIT_CASES = PLAN_CASES + FLAG_CASES

@pytest.mark.parametrize('name,argv,setup,expect', LIMIT_CASES, ids=[c[0] for c in LIMIT_CASES])
def test_round_three_limits(name, argv, setup, expect, base, tmp_path, capsys):
    "The round-two harness: exit 2, one line naming the key, flag or field, and every file unchanged."
    test_round_two(name, argv, setup, expect, base, tmp_path, capsys)

def test_a_yaml_alias_bomb_is_refused_in_under_a_second_and_a_few_mb(tmp_path):
    "4. 9^9 strings by aliases: refused while composing, before anything is built (time and peak memory measured)."
    import tracemalloc
    from legalnb.core import LegalnbError
    from legalnb.run import build_stages, read_plan
    (tmp_path/'plan.yaml').write_text(PLAN + BOMB)
    tracemalloc.start(); t0 = time.perf_counter()
    with pytest.raises(LegalnbError, match='expand to more than 10,000 values') as e:
        build_stages(read_plan(tmp_path/'plan.yaml'))
    seconds, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
    assert seconds < 1 and peak < 20 * 2**20, (seconds, peak)
    assert str(e.value).startswith(f'{tmp_path}/plan.yaml: line 4:'), e.value

# ---------------------------------------------------------------- issue 39: model folders and lm-eval suites
# Weights that are not safetensors are refused before any loader opens them (the pickle below would write `pwned`);
# an export without its auto_map, another model's weights and another run's export are one line; lm-eval task names
# are checked before anything is scored, and a task folder's `!function` code runs only with --trust-remote-code.
class _Pwn:
    "Unpickled, it writes the file `path` (what a hostile pytorch_model.bin does)."
    def __init__(self, path: str): self.path = path
    def __reduce__(self): return (open, (self.path, 'w'))

def hf_folder(rel: str, weights: str | None = None):
    "A setup step: a tiny Llama config.json and the corpus's tokenizer in `w/rel`; `weights`: a hostile pickle there."
    def setup(w: Path):
        from legalnb.hf import tiny_config
        f = w/rel; f.mkdir(parents=True)
        tiny_config('llama', 300, hidden=16, layers=1).to_json_file(f/'config.json')
        shutil.copy(w/'corpus'/'tokenizer.json', f/'tokenizer.json')
        (f/'tokenizer_config.json').write_text(json.dumps(dict(tokenizer_class='PreTrainedTokenizerFast',
                                                               eos_token='<|endoftext|>')))
        if weights: torch.save({'model': _Pwn(str(w/'pwned'))}, f/weights)
    return setup

def lora_folder(rel: str, base: str):
    "A setup step: a LoRA finetune output in `w/rel` on the model `w/base`, its adapter a hostile pickle."
    def setup(w: Path):
        (w/rel).mkdir(parents=True)
        (w/rel/'adapter_config.json').write_text(json.dumps(dict(peft_type='LORA', base_model_name_or_path=str(w/base),
                                                                 r=2, lora_alpha=4, target_modules=['q_proj'])))
        torch.save({'model': _Pwn(str(w/'pwned'))}, w/rel/'adapter_model.bin')
    return setup

def wider_gpt_weights(rel: str):
    "A setup step: a copy of the base run in `w/rel` whose model.safetensors holds a GPT of twice its width."
    def setup(w: Path):
        from safetensors.torch import save_file
        from legalnb.gpt import GPTConfig, GPTLanguageModel
        shutil.copytree(w/'run', w/rel, symlinks=True)
        gpt = GPTLanguageModel(GPTConfig(vocab_size=300, dim=32, num_layers=1, num_heads=2, max_seq_len=32))
        save_file({k: v.contiguous() for k, v in gpt.state_dict().items() if k != 'lm_head.weight'},
                  str(w/rel/'model'/'model.safetensors'))
    return setup

def task_folder(rel: str):
    "A setup step: an lm-eval task folder whose YAML names `!function utils.docs` (utils.py would write `pwned`)."
    def setup(w: Path):
        (w/rel).mkdir(parents=True)
        (w/rel/'mine.yaml').write_text(f'task: mine\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: '
                                       f'{w/"selected.jsonl"}\ntest_split: test\noutput_type: loglikelihood_rolling\n'
                                       'doc_to_text: ""\ndoc_to_target: "{{text}}"\nprocess_docs: !function utils.docs\n'
                                       'metric_list:\n  - metric: bits_per_byte\n')
        (w/rel/'utils.py').write_text(f'open({str(w/"pwned")!r}, "w")\ndef docs(d): return d\n')
    return setup

def without_auto_map(f: Path):
    cfg = json.loads((f/'config.json').read_text()); del cfg['auto_map']
    (f/'config.json').write_text(json.dumps(cfg))

EVALUATE = ['--data', '{w}/selected.jsonl', '--out', '{w}/ev', '--device', 'cpu']
MODEL_FOLDER_CASES = [  # 5. one line for every model folder that is not what it says
    ('evaluate a pickled pytorch_model.bin', ['evaluate', '{w}/hf', *EVALUATE], hf_folder('hf', 'pytorch_model.bin'),
     '{w}/hf/pytorch_model.bin: pickled weights, not safetensors; legalnb reads and writes only safetensors'),
    ('generate from a pickled pytorch_model.bin', ['generate', '{w}/hf', '--prompt', 'x', '--device', 'cpu'],
     hf_folder('hf', 'pytorch_model.bin'), 'safetensors.torch.save_file(state, "model.safetensors")'),
    ('finetune a pickled pytorch_model.bin', ['finetune', '--model', '{w}/hf', '--data', '{w}/corpus', '--out',
     '{w}/ft', '--max-steps', '1', '--workers', '0', '--force-single'], hf_folder('hf', 'pytorch_model.bin'),
     '{w}/hf/pytorch_model.bin: pickled weights, not safetensors'),
    ('evaluate a LoRA adapter_model.bin', ['evaluate', '{w}/lora', *EVALUATE],
     both(hf_folder('hf'), lora_folder('lora', 'hf')), '{w}/lora/adapter_model.bin: pickled weights, not safetensors'),
    ('generate from an export whose auto_map was removed', ['generate', '{w}/exp', '--prompt', 'x', '--device', 'cpu'],
     exported('exp', without_auto_map), "{w}/exp/config.json: model_type 'legalnb_resonance' without the auto_map "
     'legalnb export writes'),
    ('evaluate gpt weights of another width in a resonance run', ['evaluate', '{w}/mixed', *EVALUATE],
     wider_gpt_weights('mixed'), '{w}/mixed/model/model.safetensors: tensor norm.weight is (32,), '
     '{w}/mixed/model/config.json makes it (16,): these are the weights of another model'),
    ('export one run over the export of another', ['export', '{w}/run2', '--out', '{w}/hf'],
     both(exported('hf'), lambda w: shutil.copytree(w/'run', w/'run2', symlinks=True)),
     '--out {w}/hf holds the export of {w}/run/model, not of {w}/run2/model: pass --overwrite'),
    ('evaluate --lm-eval-tasks a folder whose YAML names code', ['evaluate', '{w}/hf', *EVALUATE, '--lm-eval-tasks',
     '{w}/tasks'], both(hf_folder('hf'), task_folder('tasks')), '--lm-eval-tasks {w}/tasks: {w}/tasks/mine.yaml '
     'names Python code (!function utils.docs) that lm-eval would run; legalnb runs no code from a data folder'),
    ('evaluate --lm-eval-tasks an unknown name', ['evaluate', '{w}/hf', *EVALUATE, '--lm-eval-tasks',
     'belebele_deu_latn'], hf_folder('hf'), '--lm-eval-tasks belebele_deu_latn: no such lm-eval task; close names: '
     'belebele_deu_Latn'),
]

@pytest.mark.parametrize('name,argv,setup,expect', MODEL_FOLDER_CASES, ids=[c[0] for c in MODEL_FOLDER_CASES])
def test_round_three_model_folders(name, argv, setup, expect, base, tmp_path, capsys, monkeypatch):
    "The round-three harness; no pickle is opened, no task code runs."
    test_round_three_locks_and_records(name, argv, setup, expect, base, tmp_path, capsys, monkeypatch)
    assert not (tmp_path/'w'/'pwned').exists(), 'a pickle was opened or a task\'s code ran'

# ---------------------------------------------------------------- issue 48: one line for every damaged file
def not_json(rel: str, text: str = '{"version": "1.0", "model": {'):
    "A setup step: the file `w/rel` cut short (not JSON any more)."
    def setup(w: Path): (w/rel).write_text(text)
    return setup

SLURM_JOB = ['slurm', 'train', '-o', '{w}/job.slurm', '--', '--config', '{w}/train.yaml']
DAMAGED_CASES = [  # 4. a damaged file or a config refused in one line, before anything is written
    ('evaluate an export whose tokenizer.json is not JSON', ['evaluate', '{w}/exp', *EVALUATE],
     exported('exp', not_json('tokenizer.json')),
     '{w}/exp/tokenizer.json: not valid JSON (Expecting property name enclosed in double quotes at line 1, column 30)'),
    ('generate from an export whose tokenizer.json is not JSON', ['generate', '{w}/exp', '--prompt', 'x', '--device',
     'cpu'], exported('exp', not_json('tokenizer.json', 'Article 1')),
     '{w}/exp/tokenizer.json: not valid JSON (Expecting value at line 1, column 1); expected the JSON save_pretrained '
     'writes: save the tokenizer again'),
    ('slurm train --config with a bad value', SLURM_JOB, write('train.yaml', 'data: split\nout: run\nlr: 0\n'),
     '{w}/train.yaml: lr must be > 0, got 0.0'),
    ('slurm train --config with an unknown field', SLURM_JOB, write('train.yaml', 'data: split\nlearning_rate: 1\n'),
     '{w}/train.yaml: unknown TrainConfig field(s) learning_rate'),
    ('slurm train --config without data', SLURM_JOB, write('train.yaml', 'out: run\n'), 'legalnb train needs --data'),
    ('slurm train --config not found', SLURM_JOB, nothing, '{w}/train.yaml: cannot be read'),
]

@pytest.mark.parametrize('name,argv,setup,expect', DAMAGED_CASES, ids=[c[0] for c in DAMAGED_CASES])
def test_round_four_damaged_files(name, argv, setup, expect, base, tmp_path, capsys, monkeypatch):
    "The round-three harness: exit 2, one line, no traceback, every file as it was (no job written)."
    test_round_three_locks_and_records(name, argv, setup, expect, base, tmp_path, capsys, monkeypatch)

def test_export_replaces_its_own_run_s_export_and_another_s_with_overwrite(base, tmp_path, capsys):
    "5. Exporting the same run again needs no flag; another run's needs --overwrite, then the record names it."
    from legalnb.locks import recorded_by
    run2 = tmp_path/'run2'
    shutil.copytree(base/'run', run2, symlinks=True)
    hf = tmp_path/'hf'
    assert main(['export', str(base/'run'), '--out', str(hf)]) == 0
    assert main(['export', str(base/'run'), '--out', str(hf)]) == 0
    assert main(['export', str(run2), '--out', str(hf)]) == 2
    assert recorded_by(hf, 'model.safetensors') == f'legalnb export {os.path.realpath(base/"run"/"model")}'
    assert main(['export', str(run2), '--out', str(hf), '--overwrite']) == 0
    assert recorded_by(hf, 'model.safetensors') == f'legalnb export {os.path.realpath(run2/"model")}'
    assert main(['export', str(run2), '--out', str(hf)]) == 0
