"""One GPU check: every CUDA path of legalnb exercised and measured in eight minutes (`make gpu-check`).

On one GPU, one command tells what works, how fast, and how far the calculator is off. It writes
`gpu-check/report.md` (for people) and `gpu-check/report.json` (for `legalnb estimate --calibration`): the GPU,
driver, torch/CUDA and library versions, and for each check pass, fail, skip or timeout, its numbers and its own
time cap. Each check runs in its own process with its cap as a timeout: a check over its cap is stopped (with the
processes it started) and reported, and the others still run. The whole command keeps to `--budget` seconds
(480, imports included): a check is given at most what is left, and one that cannot start in time is reported as
not run. The checks, in the order they run (the slowest to compile last):

| check | what runs | numbers |
|---|---|---|
| environment | a bf16 matrix product | GPU, driver, torch/CUDA, library versions, TFLOP/s |
| train-resonance, train-gpt | `legalnb.train.train`, the small size, bf16, rows of 2,048 tokens | tokens/s, MFU, peak memory / the calculator's, loss falling |
| long-{resonance,gpt}-{8k,32k} | the same, one row of 8,192 or 32,768 tokens | tokens/s, peak memory / prediction, ResonanceNet ÷ GPT |
| generate | ResonanceNet's recurrent state after an 8,192-token prompt (`bench/generate.py`) | ms per token against recomputing the context, same tokens |
| evaluate | `legalnb.evaluate.score_documents` (`bench/evaluate.py`) | tokens/s against the bare forward pass |
| hf-full, hf-lora, hf-qlora | `legalnb finetune` on a Llama built from a config (~110M parameters, nothing downloaded): full fine-tuning of packed shards, LoRA and QLoRA (bitsandbytes) on packed examples, bf16 and tf32 | tokens/s, peak memory / the calculator's |
| torchrun-ddp, torchrun-fsdp | `torchrun --nproc_per_node 1 -m legalnb.cli train --strategy ddp` / `fsdp` (FSDP2) | 5 steps, a checkpoint, a resumed run to step 7 |
| deepspeed-zero3 | `accelerate launch` (ZeRO-3 flags of `legalnb.hf.launch_flags`) `legalnb finetune` | the same, DeepSpeed's checkpoint |
| recall-1k, recall-4k | MQAR (`bench/recall.py`), resonance against gpt, 16 pairs, a short run | accuracy, the ratio |
| compile-resonance, compile-gpt | `train` with `compile=True` | compile seconds, speed-up over the eager check |

Peak memory is `torch.cuda.max_memory_allocated()` against `legalnb.calculator.estimate_memory` of the same plan;
MFU is the trainer's (matrix-product FLOPs ÷ the GPU's dense bf16 peak). The report's calibration entries give the
calculator the measured MFU and activation bytes per architecture and sequence length:
`legalnb estimate --calibration gpu-check/report.json ...`.

## Where it runs: a GPU machine, offline, from the checkout

    make gpu-check                         # = PYTHONPATH=. python3 bench/gpu_check.py (no install, no venv)
    make gpu-check WHEELS=wheels           # = ... --wheels wheels: install carried wheels first (see below)
    python bench/gpu_check.py --only train-resonance hf-lora   # some checks (each still in its own process)
    python bench/gpu_check.py --cap compile-resonance=180      # another cap for a check (a slower GPU)
    python bench/gpu_check.py --dry-run    # every check at toy size on the CPU (the test suite's), see below

It needs PyTorch, numpy, transformers, peft, accelerate, tokenizers, safetensors, tqdm and pyyaml, which GPU images
carry. Nothing is downloaded: models are built from configs, tokenizers trained here, data generated. A check whose
optional package is missing is skipped, naming it: bitsandbytes (hf-qlora), deepspeed (deepspeed-zero3).

**Carrying wheels to a machine without internet.** legalnb imports fastcore, which GPU images lack; the script
says so in one line and stops unless it can import it. On a machine with pip and internet, download the wheels
(fastcore is pure Python: any platform; take the versions `requirements.lock` pins), copy the folder next to the
checkout, and pass it with `--wheels DIR` (`make gpu-check WHEELS=DIR`): they are installed with
`pip install --no-index --no-deps --target` a temporary folder (removed when the command ends), nothing is
fetched, and every check process (torchrun and accelerate workers too) finds them through PYTHONPATH:

    python -m pip download --no-deps --only-binary=:all: -d wheels fastcore==1.14.5
    # optional checks: a bitsandbytes wheel for the GPU machine's Python and platform, e.g.
    python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_24_x86_64 -d wheels bitsandbytes==0.50.2
    # deepspeed has no wheel on PyPI: build one where pip works (pip wheel --no-deps deepspeed==0.19.8 -w wheels)

Each wheel's own requirements are not installed (--no-deps): `unzip -p wheels/NAME-*.whl '*/METADATA' | grep
^Requires-Dist` lists them; carry those the machine lacks too.

## What the dry run is for

`--dry-run` runs the same code at toy size on the CPU (fp32, tiny models, a few steps): every check present, with
pass or skip and its numbers, so the script cannot rot between the rare GPU sessions. Its numbers are a CPU's:
peak memory is the process's resident-set growth, MFU is not measured, and torch.compile uses the `aot_eager`
backend (dynamo and AOTAutograd trace the model as on a GPU, without inductor's C++ code generation, which takes
minutes on a CPU). `tests/test_gpu_check.py` runs it; `tests/fixtures/gpu_check_dry_run.json` is such a report,
the calculator notebook's example (clearly a CPU's figures, not a GPU's).

It takes longer than the minute it was meant to: 167 s on the shared 2-core development machine (load 7), 250-330 s
under heavier load (at load 10 one `accelerate launch` with DeepSpeed took 2.5 minutes, so a dry run's caps are
generous: 120 s a check, 240 s per torchrun check, 420 s for ZeRO-3, 1,500 s in all). DeepSpeed on a CPU builds its
shared-memory op with the C++ compiler at every start (a minute the first time; then ninja finds it built); a check
ended in the middle of that leaves torch's build lock, on which every later DeepSpeed start on the machine would wait,
so a check over its cap has the build locks made while it ran removed (and the report says which). The checks themselves take seconds: the six launcher starts (torchrun twice per FSDP and DDP
check, `accelerate launch` twice for ZeRO-3) each start fresh interpreters that import torch (and DeepSpeed,
transformers, peft), 28-58 s per launcher check there, and the one-time import of torch, transformers and peft
by the process that forks the checks is 19 s. Everything else is preloaded once and forked, a few seconds in all.

## Its folder is written like every legalnb command's

`--out` is a new folder or one this script wrote: it is locked while the checks run, what the script writes there
is recorded in `.legalnb-owned.json`, and a folder holding anything else (a `report.md`, `logs/`, `work/` of the
user's, a file instead of a folder) is refused in one line before anything is deleted or written. Its own earlier
`logs/` and `work/` are deleted only when the records say it wrote every file in them (`legalnb.locks.remove_owned`).
"""
from __future__ import annotations
import time

T0 = time.monotonic()   # the budget counts from here: interpreter start and imports are seconds before it
import argparse, atexit, functools, importlib.util, json, math, multiprocessing as mp, os, platform, re, resource
import shutil, signal, statistics, subprocess, sys, tempfile, traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for p in (str(ROOT), str(BENCH)):   # the checkout's legalnb and the bench helpers, as `PYTHONPATH=.` gives
    if p not in sys.path: sys.path.insert(0, p)


def install_wheels(folder: Path) -> tuple[Path, list[str]]:
    "Install the wheels in `folder` into a new temporary folder, removed at exit (offline: no index, no dependencies), "
    "and put it first on the path; that folder and the wheels' names. Nothing of --out is touched before it is checked."
    wheels = sorted(folder.glob('*.whl'))
    if not folder.is_dir() or not wheels:
        sys.exit(f'bench/gpu_check.py: error: --wheels {folder}: no .whl files there; download them where pip works '
                 '(see the docstring: "Carrying wheels")')
    site = Path(tempfile.mkdtemp(prefix='legalnb-gpu-check-site-'))
    atexit.register(shutil.rmtree, site, True)
    r = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps', '--no-compile',
                        '--disable-pip-version-check', '--target', str(site), *map(str, wheels)],
                       capture_output=True, text=True)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ['?'])[-1]
        sys.exit(f'bench/gpu_check.py: error: --wheels {folder}: pip could not install them ({last})')
    sys.path.insert(0, str(site.resolve()))
    return site.resolve(), [w.name for w in wheels]


def missing(needs: tuple) -> list[str]:
    "The packages of `needs` that cannot be imported here."
    def absent(name):
        try: return importlib.util.find_spec(name) is None
        except (ImportError, ValueError): return True
    return [n for n in needs if absent(n)]


def bootstrap(argv: list[str]) -> list[str]:
    "Before legalnb is imported: --wheels DIR installed, fastcore importable, the environment offline."
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument('--wheels')
    known, _ = pre.parse_known_args(argv)
    site, installed = install_wheels(Path(known.wheels)) if known.wheels else (None, [])
    if installed: os.environ['LEGALNB_GPU_CHECK_SITE'] = str(site)   # for the report
    first = [str(site)] * bool(installed) + [str(ROOT)]   # for every process started
    os.environ['PYTHONPATH'] = os.pathsep.join(dict.fromkeys(
        first + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]))
    if missing(('fastcore',)):
        sys.exit('bench/gpu_check.py: error: legalnb needs fastcore, which is not installed here; carry its wheel '
                 '(python -m pip download --no-deps fastcore==1.14.5 -d wheels, where pip works) and pass '
                 '--wheels wheels')
    return installed


OFFLINE = dict(HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1', HF_DATASETS_OFFLINE='1', TOKENIZERS_PARALLELISM='false',
               PYTORCH_NVML_BASED_CUDA_CHECK='1')   # nothing downloads; the preloading server never initialises CUDA
if __name__ == '__main__':
    os.environ.update(OFFLINE)
    WHEELS = bootstrap(sys.argv[1:])

from common import cpu_name, hardware, markdown_table, memory_gib, run   # noqa: E402  (after the wheels)
from legalnb.core import LegalnbError, atomic_write, format_duration   # noqa: E402
from legalnb.locks import output_folder, remove_owned   # noqa: E402

GIB = 2 ** 30
PACKAGES = ('torch', 'numpy', 'transformers', 'peft', 'accelerate', 'tokenizers', 'safetensors', 'fastcore',
            'bitsandbytes', 'deepspeed', 'datasets', 'triton', 'flash_attn')   # versions in the report
VERSION_NAMES = {'flash_attn': 'flash-attn'}


# -- sizes: the GPU check's, and the dry run's toy ones ------------------------------------------------------------

GPU_SIZE = dict(vocab=32768, shape={}, train_seq=2048, train_batch=8, train_steps=30, train_log=5,
                compile_steps=16, long=(8192, 32768), long_steps=6, long_log=2, workers=2,
                gen=dict(dim=768, layers=6, frequencies=64, vocab=32768, prompt=8192, new=(64, 8)),
                eval=dict(docs=48, vocab=4096, dim=768, layers=6, context=2048, batch_tokens=32768, repeats=3),
                llama=dict(hidden=768, layers=12, heads=12, kv_heads=4, vocab=32000), hf_seq=2048, hf_batch=4,
                hf_steps=10, dist_steps=(5, 7), dist_batch=4,
                recall=dict(lengths=(1024, 4096), pairs=16, steps=300, batch=32, dim=128, layers=2, lr=3e-3))
DRY_SIZE = dict(vocab=256, shape=dict(resonance=dict(dim=32, num_layers=1, num_frequencies=4),
                                      gpt=dict(dim=32, num_layers=1, num_heads=2)),
                train_seq=64, train_batch=2, train_steps=6, train_log=2, compile_steps=4, long=(128, 256),
                long_steps=4, long_log=2, workers=0,
                gen=dict(dim=32, layers=1, frequencies=4, vocab=256, prompt=128, new=(8, 3)),
                eval=dict(docs=2, vocab=300, dim=32, layers=1, context=64, batch_tokens=512, repeats=1),
                llama=dict(hidden=32, layers=2, heads=4, kv_heads=2, vocab=384), hf_seq=64, hf_batch=2,
                hf_steps=3, dist_steps=(2, 3), dist_batch=2,
                recall=dict(lengths=(64, 128), pairs=4, steps=4, batch=4, dim=16, layers=1, lr=3e-3))


@dataclass
class Ctx:
    "What a check sees: toy or GPU sizes, its own folder, the folder the checks share, the device."
    dry: bool
    work: Path     # this check's own folder
    shared: Path   # built once, used by several checks: splits, the Llama folder, its data
    size: dict = field(init=False)
    def __post_init__(self): self.size = DRY_SIZE if self.dry else GPU_SIZE

    @functools.cached_property
    def device(self):
        import torch
        return torch.device('cpu' if self.dry else 'cuda')

    @functools.cached_property
    def precision(self) -> str:
        "The precision the trainer resolves 'auto' to here: bf16 on cc >= 8.0, fp16 below, fp32 on the CPU."
        from legalnb.machine import cuda_capability, resolve_precision
        return resolve_precision('auto', None if self.dry else cuda_capability())

    @functools.cached_property
    def gpu_name(self) -> str | None:
        import torch
        return None if self.dry else torch.cuda.get_device_name()

    def shape(self, model: str) -> dict: return dict(self.size['shape'].get(model, {}))


class Skip(Exception):
    "A check that cannot run here, and why (a missing package)."


# -- measuring helpers ----------------------------------------------------------------------------------------------

def rss_bytes() -> int:
    "This process's resident memory now (Linux), for the CPU dry run's peak."
    try: return int(Path('/proc/self/statm').read_text().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except (OSError, ValueError, IndexError): return 0


class PeakMemory:
    "Peak memory of a block: CUDA's allocator on a GPU; on the CPU the growth of the resident set (a dry run's)."
    def __init__(self, device): self.cuda, self.bytes = device.type == 'cuda', 0
    def __enter__(self):
        import torch
        if self.cuda: torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        self.base = 0 if self.cuda else rss_bytes()
        return self
    def __exit__(self, *exc):
        import torch
        if self.cuda: torch.cuda.synchronize(); self.bytes = torch.cuda.max_memory_allocated()
        else: self.bytes = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base)
    @property
    def source(self) -> str:
        return 'torch.cuda.max_memory_allocated' if self.cuda else 'resident-set growth (CPU dry run)'


def zipf_split(ctx: Ctx, seq_len: int, rows: int) -> Path:
    "A split of rows whose ids follow Zipf's law (weight 1/(rank + 10)), built once per row length: the loss falls as "
    "the model learns the unigram, and the rows cost what real ones do."
    import numpy as np
    from legalnb.data import split
    vocab, folder = ctx.size['vocab'], ctx.shared/f'split-{seq_len}'
    if folder.is_dir(): return folder
    w = 1 / (np.arange(vocab) + 10.0)
    ids = np.random.default_rng(seq_len).choice(vocab, size=(rows, seq_len + 1), p=w / w.sum())
    corpus = ctx.shared/f'corpus-{seq_len}'; shutil.rmtree(corpus, ignore_errors=True); corpus.mkdir(parents=True)
    np.save(corpus/'shard_00000.npy', ids.astype(np.uint16 if vocab <= 65536 else np.uint32))
    (corpus/'manifest.json').write_text(json.dumps({'vocab_size': vocab}))
    tmp = folder.with_name(folder.name + '.tmp'); shutil.rmtree(tmp, ignore_errors=True)
    split(corpus, tmp, val_ratio=0.1, seed=0, by='rows')
    tmp.rename(folder)
    return folder


def native_plan(ctx: Ctx, model: str, seq_len: int, batch: int, steps: int) -> dict:
    "The calculator's plan fields for a native run of the small size (the dry run's toy shape) as the trainer runs it."
    from legalnb.calculator import model_plan_fields
    f = model_plan_fields('small', seq_len, ctx.size['vocab'], model, **ctx.shape(model))
    return dict(task='scratch', steps=steps, seq_len=seq_len, micro_batch=batch, precision=ctx.precision,
                gpu=known_gpu(ctx.gpu_name), **f)


def known_gpu(name: str | None) -> str | None:
    "The device name when the calculator's GPU table knows it (for peak FLOP/s and capacity), else None."
    from legalnb.presets import find_gpu
    if not name: return None
    try: find_gpu(name); return name
    except LegalnbError: return None


def against_calculator(plan_fields: dict, peak: float, params: int) -> dict:
    "Peak memory beside `estimate_memory` of the plan, and the activation constant that would have predicted it."
    from legalnb.calculator import Plan, estimate_memory, measured_activation_bytes
    plan = Plan(**plan_fields)
    predicted = estimate_memory(plan).total
    return dict(peak_gib=peak / GIB, predicted_gib=predicted / GIB, memory_ratio=peak / predicted,
                activation_bytes=measured_activation_bytes(plan, peak, params))


def native_run(ctx: Ctx, model: str, seq_len: int, batch: int, steps: int, log_every: int,
               compile: bool = False, falling: bool = True) -> dict:
    "Train `model` with legalnb's trainer on a Zipf split: speed, MFU, loss, peak memory against the calculator; "
    "`falling`: the check fails unless the loss fell (a long-context run is too short to say)."
    from legalnb.metrics import read_metrics
    from legalnb.train import TrainConfig, train
    split = zipf_split(ctx, seq_len, rows=max(16, batch * (steps + 2)))
    cfg = TrainConfig(data=str(split), out=str(ctx.work/'run'), model=model, size='small',
                      model_overrides=ctx.shape(model), batch_size=batch, max_steps=steps, warmup_steps=1, lr=2e-3,
                      eval_every=0, eval_batches=1, save_every=10**6, log_every=log_every, num_workers=ctx.size['workers'],
                      progress=False, compile=compile, seed=0, cpu_threads=1 if ctx.dry else None)
    with PeakMemory(ctx.device) as mem: summary = train(cfg)
    recs = read_metrics(ctx.work/'run'/'metrics.jsonl')
    steady = recs[1:] or recs   # the first interval pays for warm-up (and compiling)
    mfus = [r['mfu'] for r in steady if r.get('mfu') is not None]
    plan = native_plan(ctx, model, seq_len, batch, steps)
    n = dict(model=model, seq_len=seq_len, batch=batch, steps=steps, precision=summary['precision'],
             params=summary['params'], tokens_per_sec=statistics.median(r['tokens_per_sec'] for r in steady),
             mfu=statistics.median(mfus) if mfus else None, step_ms=statistics.median(r['step_ms'] for r in steady),
             loss_first=recs[0]['loss'], loss_last=recs[-1]['loss'], peak_source=mem.source,
             **against_calculator(plan, mem.bytes, summary['params']))
    if compile:   # the first step holds the compilation: its time beyond a steady step
        n['compile_s'] = (recs[0]['step_ms'] - statistics.median(r['step_ms'] for r in recs[2:] or recs)) / 1000
    ok = math.isfinite(n['loss_last']) and (n['loss_last'] < n['loss_first'] or not falling)
    notes = [] if ok else [f"the loss did not fall: {n['loss_first']:.3f} -> {n['loss_last']:.3f}"]
    cal = dict(model=model, plan=plan, params=summary['params'], peak_bytes=mem.bytes,
               tokens_per_sec=n['tokens_per_sec'], mfu=n['mfu'])
    return dict(status='pass' if ok else 'fail', numbers=n, notes=notes, calibration=None if compile else cal)


# -- the checks -----------------------------------------------------------------------------------------------------

def check_environment(ctx: Ctx) -> dict:
    "Versions, the GPU and its driver, and a bf16 matrix product's TFLOP/s (fp32 on the CPU)."
    import torch
    from importlib.metadata import PackageNotFoundError, version
    def ver(name):
        try: return version(VERSION_NAMES.get(name, name))
        except PackageNotFoundError: return None
    cuda = torch.cuda.is_available() and not ctx.dry   # a dry run on a GPU machine is still the CPU's
    env = dict(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
               cudnn=torch.backends.cudnn.version() if cuda else None, cpu=cpu_name(), cores=os.cpu_count(),
               memory_gib=round(memory_gib(), 1), os=f'{platform.system()} {platform.release()}', hardware=hardware(),
               packages={p: ver(p) for p in PACKAGES}, gpu=None)
    if site := os.environ.get('LEGALNB_GPU_CHECK_SITE'):   # what --wheels installed, importable in a check's process?
        env['wheel_modules'] = {m.name: importlib.util.find_spec(m.name) is not None for m in Path(site).iterdir()
                                if m.is_dir() and m.name.isidentifier()}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        smi = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'], capture_output=True,
                             text=True) if shutil.which('nvidia-smi') else None
        env.update(gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(),
                   capability=list(torch.cuda.get_device_capability(0)), gpu_memory_gib=props.total_memory / GIB,
                   driver=smi.stdout.strip().splitlines()[0] if smi and smi.returncode == 0 and smi.stdout.strip()
                   else None, bf16=torch.cuda.is_bf16_supported(), precision=ctx.precision,
                   in_calculator_table=known_gpu(torch.cuda.get_device_name(0)) is not None)
    elif not ctx.dry:
        return dict(status='fail', numbers=env, notes=['no CUDA GPU is visible: the GPU checks cannot run here '
                                                       '(--dry-run runs them at toy size on the CPU)'])
    n, dtype = (256, torch.float32) if ctx.dry else (8192, torch.bfloat16 if env.get('bf16') else torch.float16)
    a = torch.randn(n, n, device=ctx.device, dtype=dtype); b = torch.randn(n, n, device=ctx.device, dtype=dtype)
    for _ in range(3): a @ b
    if cuda: torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10): a @ b
    if cuda: torch.cuda.synchronize()
    env['matmul_tflops'] = 10 * 2 * n ** 3 / (time.perf_counter() - t) / 1e12
    env['matmul'] = f'{n}x{n}x{n} {str(dtype).removeprefix("torch.")}'
    return dict(status='pass', numbers=env, notes=[])


def check_train(model: str) -> Callable:
    def check(ctx: Ctx) -> dict:
        s = ctx.size
        return native_run(ctx, model, s['train_seq'], s['train_batch'], s['train_steps'], s['train_log'])
    check.__doc__ = f'{model}: the small size trained by legalnb.train in bf16 on rows of 2,048 tokens'
    return check


def check_long(model: str, which: int) -> Callable:
    def check(ctx: Ctx) -> dict:
        s = ctx.size
        return native_run(ctx, model, s['long'][which], 1, s['long_steps'], s['long_log'], falling=False)
    check.__doc__ = f'{model}: one row of {GPU_SIZE["long"][which]:,} tokens per step'
    return check


def check_compile(model: str) -> Callable:
    def check(ctx: Ctx) -> dict:
        import torch
        if ctx.dry:   # dynamo and AOTAutograd as on a GPU; inductor's C++ code generation takes minutes on a CPU
            torch.compile = functools.partial(torch.compile, backend='aot_eager')
        s = ctx.size
        return native_run(ctx, model, s['train_seq'], s['train_batch'], s['compile_steps'], 1, compile=True)
    check.__doc__ = f'{model}: train-{model} with torch.compile'
    return check


def bench_module(name: str):
    "bench/NAME.py as a module (its own name prefixed: bench/evaluate.py is not the `evaluate` package)."
    spec = importlib.util.spec_from_file_location(f'bench_{name}', BENCH/f'{name}.py')
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    return module


def check_generate(ctx: Ctx) -> dict:
    "ResonanceNet's recurrent generation after an 8,192-token prompt against recomputing the context (greedy, fp32)."
    import torch
    worker, g = bench_module('generate').worker, ctx.size['gen']
    base = dict(device=ctx.device.type, dim=g['dim'], layers=g['layers'], frequencies=g['frequencies'],
                vocab=g['vocab'], threads=1, prompt=g['prompt'])
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False   # fp32 on both paths
    rec = worker({**base, 'path': 'recurrent', 'new': g['new'][0]})
    if ctx.device.type == 'cuda': torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    full = worker({**base, 'path': 'recompute', 'new': g['new'][1]})
    k = len(full['tokens'])
    same = rec['tokens'][:k] == full['tokens']
    n = dict(prompt=g['prompt'], recurrent_ms_per_token=rec['ms_per_token'], prefill_s=rec['prefill_s'],
             recompute_ms_per_token=full['ms_per_token'], speedup=full['ms_per_token'] / rec['ms_per_token'],
             recurrent_tokens_per_sec=1000 / rec['ms_per_token'], recompute_tokens_per_sec=1000 / full['ms_per_token'],
             same_tokens=same, compared_tokens=k, recurrent_peak_mib=rec['peak_mib'], recompute_peak_mib=full['peak_mib'])
    notes = [] if same else [f'the recurrent tokens differ from the recomputed ones within the first {k}']
    return dict(status='pass' if same else 'fail', numbers=n, notes=notes)


def check_evaluate(ctx: Ctx) -> dict:
    "legalnb.evaluate.score_documents' tokens/s against the bare forward pass on the same batches (bench/evaluate.py)."
    e = ctx.size['eval']
    m = bench_module('evaluate').measure(e['docs'], e['vocab'], e['dim'], e['layers'], e['context'],
                                         e['batch_tokens'], e['repeats'], ctx.device, ctx.precision)
    secs, tokens = m['seconds'], m['tokens']
    n = dict(tokens=tokens, documents=m['documents'], context=e['context'], precision=ctx.precision,
             forward_tokens_per_sec=tokens / secs['forward'], evaluate_tokens_per_sec=tokens / secs['evaluate'],
             forward_loss_tokens_per_sec=tokens / secs['forward + mean loss'],
             ratio=secs['forward'] / secs['evaluate'])
    notes = [f"evaluation at {n['ratio']:.2f} of the forward pass (target >= 0.80: "
             f"{'met' if n['ratio'] >= 0.8 else 'missed'})"]
    return dict(status='pass', numbers=n, notes=notes)


# -- the Hugging Face path ------------------------------------------------------------------------------------------

def llama_folder(ctx: Ctx) -> Path:
    "A Llama built from a config (~110M parameters; a toy one in the dry run) with a tokenizer trained here, saved as "
    "a user's save_pretrained folder; made once for the checks that use it."
    folder = ctx.shared/'llama'
    if folder.is_dir(): return folder
    import torch
    from transformers import AutoModelForCausalLM
    from legalnb.hf import legal_sentences, tiny_config, train_tiny_tokenizer
    c = ctx.size['llama']
    tok = train_tiny_tokenizer(legal_sentences(300))
    cfg = tiny_config('llama', max(c['vocab'], len(tok)), hidden=c['hidden'], layers=c['layers'], max_len=4096)
    cfg.num_attention_heads, cfg.num_key_value_heads = c['heads'], c['kv_heads']   # heads of 64 channels
    cfg.head_dim = c['hidden'] // c['heads']   # set from the config's own 4 heads when it was made
    torch.manual_seed(0)
    tmp = folder.with_name('llama.tmp'); shutil.rmtree(tmp, ignore_errors=True)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp); tok.save_pretrained(tmp)
    tmp.rename(folder)
    return folder


def llama_corpus(ctx: Ctx) -> Path:
    "Packed shards of generated legal sentences (documents restart their positions), for continued pretraining."
    folder = ctx.shared/'llama-corpus'
    if folder.is_dir(): return folder
    from legalnb.hf import load_hf_model, write_demo_shards
    _, tok = load_hf_model(llama_folder(ctx), tokenizer_only=True)
    s = ctx.size
    tmp = folder.with_name('llama-corpus.tmp'); shutil.rmtree(tmp, ignore_errors=True)
    write_demo_shards(tmp, tok, rows=s['hf_batch'] * (max(s['hf_steps'], s['dist_steps'][1]) + 2), seq_len=s['hf_seq'],
                      shards=1)
    tmp.rename(folder)
    return folder


def llama_examples(ctx: Ctx) -> Path:
    "Prompt/response pairs, every second one long (~1,100 words), as a JSONL file: packed rows for LoRA."
    path = ctx.shared/'sft.jsonl'
    if path.exists(): return path
    from legalnb.hf import demo_examples
    s = ctx.size
    n = s['hf_batch'] * s['hf_steps'] * (2 if ctx.dry else 3)
    with atomic_write(path) as tmp:
        tmp.write_text(''.join(json.dumps(e) + '\n' for e in demo_examples(n, long_every=2, long_words=1100)))
    return path


def finetune_args(ctx: Ctx, data: Path, out: Path, steps: int, *extra) -> list[str]:
    "`legalnb finetune` flags of a short run (one process, no evaluation, a log line per step)."
    s = ctx.size
    return ['finetune', '--model', str(llama_folder(ctx)), '--data', str(data), '--out', str(out), '--max-steps',
            str(steps), '--batch-size', str(s['hf_batch']), '--grad-accum', '1', '--logging-steps', '1',
            '--workers', str(s['workers']), '--eval-share', '0', '--warmup-steps', '1', '--lr', '1e-4',
            '--force-single', *extra]


def check_hf(mode: str) -> Callable:
    def check(ctx: Ctx) -> dict:
        from legalnb.cli import main as legalnb
        from legalnb.hf import qlora_unavailable
        from legalnb.metrics import read_metrics
        if mode == 'qlora' and (why := qlora_unavailable()): raise Skip(why)
        s, out = ctx.size, ctx.work/'run'
        data = llama_corpus(ctx) if mode == 'full' else llama_examples(ctx)
        flags = {'full': ['--full'], 'lora': ['--lora', '--max-length', str(s['hf_seq'])],
                 'qlora': ['--qlora', '--max-length', str(s['hf_seq'])]}[mode]
        with PeakMemory(ctx.device) as mem: code = legalnb(finetune_args(ctx, data, out, s['hf_steps'], *flags))
        if code: return dict(status='fail', numbers={}, notes=[f'legalnb finetune exited {code} (see the log)'])
        summary = json.loads((out/'finetune.json').read_text())
        recs = read_metrics(out/'metrics.jsonl')
        steady = recs[2:] or recs
        cfg = json.loads((llama_folder(ctx)/'config.json').read_text())
        params, lora_params = hf_params(llama_folder(ctx), out/'final')
        seq = s['hf_seq']
        plan = dict(task='cpt' if mode == 'full' else 'lora', steps=s['hf_steps'], seq_len=seq,
                    micro_batch=s['hf_batch'], precision=ctx.precision, gpu=known_gpu(ctx.gpu_name), params=params,
                    layers=cfg['num_hidden_layers'], d_model=cfg['hidden_size'], vocab=cfg['vocab_size'],
                    checkpointing=ctx.device.type == 'cuda', lora_params=lora_params, qlora=mode == 'qlora')
        tps = statistics.median(r['tokens_per_sec'] for r in steady)
        n = dict(mode=mode, params=params, lora_params=lora_params, steps=summary['steps'], tokens=summary['tokens'],
                 batches=summary['batches'], dtype=summary['dtype'], precision=ctx.precision,
                 tf32=ctx.device.type == 'cuda' and torch_tf32(), tokens_per_sec=tps, seconds=summary['seconds'],
                 loss_first=summary['losses'][0], loss_last=summary['losses'][-1], peak_source=mem.source,
                 **against_calculator(plan, mem.bytes, params))
        ok = summary['steps'] == s['hf_steps'] and all(map(math.isfinite, summary['losses']))
        cal = dict(model='hf-llama', plan=plan, params=params, peak_bytes=mem.bytes, tokens_per_sec=tps, mfu=None)
        return dict(status='pass' if ok else 'fail', numbers=n, notes=[] if ok else ['losses not finite'],
                    calibration=cal)
    check.__doc__ = {'full': 'full fine-tuning of packed shards (continued pretraining)',
                     'lora': 'a LoRA adapter on packed examples', 'qlora': 'LoRA on a 4-bit NF4 base'}[mode]
    return check


def torch_tf32() -> bool:
    import torch
    return bool(torch.backends.cuda.matmul.allow_tf32)


def hf_params(model: Path, final: Path) -> tuple[int, int | None]:
    "Parameters of the saved Llama, and of the LoRA adapter in `final` (None for full fine-tuning)."
    from safetensors import safe_open
    def count(path):
        with safe_open(str(path), 'pt') as f: return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    adapter = final/'adapter_model.safetensors'
    return count(model/'model.safetensors'), count(adapter) if adapter.exists() else None


# -- launchers: torchrun and accelerate -----------------------------------------------------------------------------

def launch(cmd: list[str], ctx: Ctx) -> tuple[int, float]:
    "Run a launcher command from the checkout (its output into this check's log); exit code and seconds."
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
    if ctx.dry: env['OMP_NUM_THREADS'] = '1'
    t = time.perf_counter()
    code = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    return code, time.perf_counter() - t


def check_torchrun(strategy: str) -> Callable:
    def check(ctx: Ctx) -> dict:
        s, out = ctx.size, ctx.work/'run'
        first, last = s['dist_steps']
        split = zipf_split(ctx, s['train_seq'], rows=max(16, s['dist_batch'] * (last + 2)))
        shape = [f'{k}={v}' for k, v in ctx.shape('resonance').items()]
        argv = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '1', '-m',
                'legalnb.cli', 'train', '--data', str(split), '--out', str(out), '--model', 'resonance',
                '--size', 'small', *(['--model-overrides', *shape] if shape else []), '--strategy', strategy,
                '--batch-size', str(s['dist_batch']), '--warmup-steps', '1', '--save-every', str(first),
                '--eval-every', '0', '--eval-batches', '1', '--log-every', '1', '--num-workers', str(s['workers']),
                '--no-progress', '--seed', '0']
        code1, t1 = launch(argv + ['--max-steps', str(first)], ctx)
        ck = out/'checkpoints'/f'step-{first:08d}'
        saved = ck.is_dir()
        code2, t2 = launch(argv + ['--max-steps', str(last), '--resume'], ctx) if saved else (None, 0.0)
        summary = json.loads((out/'summary.json').read_text()) if (out/'summary.json').exists() else {}
        n = dict(strategy=strategy, world_size=summary.get('world_size'), first_exit=code1, resume_exit=code2,
                 checkpoint=saved, sharded=(ck/'sharded').is_dir(), resumed_from=summary.get('resumed_from'),
                 step=summary.get('step'), first_s=t1, resume_s=t2, tokens_per_sec=summary.get('tokens_per_sec'),
                 loss=summary.get('loss'))
        want_sharded = strategy == 'fsdp'
        ok = (code1 == 0 and saved and code2 == 0 and n['resumed_from'] == first and n['step'] == last
              and n['sharded'] == want_sharded)
        notes = [] if ok else [f'expected exit 0, a checkpoint at step {first} ({"sharded" if want_sharded else "whole"})'
                               f' and a resumed run to step {last}; got {n}']
        return dict(status='pass' if ok else 'fail', numbers=n, notes=notes)
    check.__doc__ = f'torchrun --nproc_per_node 1 legalnb train --strategy {strategy}: 5 steps, a checkpoint, resumed'
    return check


def check_deepspeed(ctx: Ctx) -> dict:
    "accelerate launch with DeepSpeed ZeRO-3 (legalnb.hf.launch_flags), legalnb finetune: 5 steps, saved, resumed."
    from legalnb.hf import launch_flags
    s, out = ctx.size, ctx.work/'run'
    first, last = s['dist_steps']
    head = [sys.executable, '-m', 'accelerate.commands.launch', *launch_flags('deepspeed-zero3', 1, ctx.precision).split(),
            '--main_process_port', '0', '-m', 'legalnb.cli']   # a free port: on 29500 it may join another job's store
    flags = finetune_args(ctx, llama_corpus(ctx), out, first, '--full', '--save-steps', str(first))
    code1, t1 = launch(head + flags, ctx)
    saved = (out/f'checkpoint-{first}').is_dir()
    resume = finetune_args(ctx, llama_corpus(ctx), out, last, '--full', '--save-steps', str(first), '--resume')
    code2, t2 = launch(head + resume, ctx) if saved else (None, 0.0)
    summary = json.loads((out/'finetune.json').read_text()) if (out/'finetune.json').exists() else {}
    n = dict(first_exit=code1, resume_exit=code2, checkpoint=saved, distributed=summary.get('distributed'),
             world_size=summary.get('world_size'), zero3_sharded_at_load=summary.get('zero3_sharded_at_load'),
             resumed_from=summary.get('resumed_from'), steps=summary.get('steps'), first_s=t1, resume_s=t2,
             tokens=summary.get('tokens'))
    ok = (code1 == 0 and saved and code2 == 0 and n['distributed'] == 'DEEPSPEED' and n['steps'] == last
          and n['resumed_from'] == f'checkpoint-{first}')
    notes = [] if ok else [f'expected exit 0, checkpoint-{first}, DeepSpeed, a resumed run to step {last}; got {n}']
    return dict(status='pass' if ok else 'fail', numbers=n, notes=notes)


def check_recall(which: int) -> Callable:
    def check(ctx: Ctx) -> dict:
        r = ctx.size['recall']
        score = bench_module('recall').train_and_score
        L = r['lengths'][which]
        got = {m: score(m, 'mqar', L, r['pairs'], r['lr'], r['steps'], r['batch'], r['dim'], r['layers'], 16,
                        device=ctx.device.type) for m in ('resonance', 'gpt')}
        n = dict(seq_len=L, pairs=r['pairs'], steps=r['steps'], batch=r['batch'], dim=r['dim'], layers=r['layers'],
                 chance=1 / 64, **{f'{m}_acc': g['acc'] for m, g in got.items()},
                 **{f'{m}_s': g['seconds'] for m, g in got.items()},
                 resonance_over_gpt=got['resonance']['acc'] / got['gpt']['acc'] if got['gpt']['acc'] else None)
        ok = all(math.isfinite(g['loss']) for g in got.values())
        return dict(status='pass' if ok else 'fail', numbers=n, notes=[
            f'a short run ({r["steps"]} steps): far from converged, a first look at recall at this length'])
    check.__doc__ = f'MQAR recall at {GPU_SIZE["recall"]["lengths"][which]:,} tokens: resonance against gpt'
    return check


@dataclass
class Check:
    "One check: its name, its time cap on a GPU (seconds), the optional packages it needs, and what it runs."
    name: str
    cap_s: float
    run: Callable[[Ctx], dict]
    needs: tuple = ()
    dry_cap_s: float = 120  # its cap in a dry run: seconds at toy size on a shared CPU, more for the launchers

CHECKS = [Check('environment', 30, check_environment),
          Check('train-resonance', 45, check_train('resonance')), Check('train-gpt', 45, check_train('gpt')),
          Check('long-resonance-8k', 30, check_long('resonance', 0)), Check('long-gpt-8k', 30, check_long('gpt', 0)),
          Check('long-resonance-32k', 40, check_long('resonance', 1)), Check('long-gpt-32k', 40, check_long('gpt', 1)),
          Check('generate', 30, check_generate), Check('evaluate', 40, check_evaluate, ('tokenizers',)),
          Check('hf-full', 45, check_hf('full'), ('transformers', 'accelerate')),
          Check('hf-lora', 40, check_hf('lora'), ('transformers', 'peft', 'accelerate')),
          Check('hf-qlora', 40, check_hf('qlora'), ('transformers', 'peft', 'accelerate', 'bitsandbytes')),
          Check('torchrun-ddp', 60, check_torchrun('ddp'), dry_cap_s=240),
          Check('torchrun-fsdp', 60, check_torchrun('fsdp'), dry_cap_s=240),
          Check('deepspeed-zero3', 60, check_deepspeed, ('transformers', 'accelerate', 'deepspeed'), dry_cap_s=420),
          Check('recall-1k', 40, check_recall(0)), Check('recall-4k', 50, check_recall(1)),
          Check('compile-resonance', 90, check_compile('resonance')), Check('compile-gpt', 90, check_compile('gpt'))]
BY_NAME = {c.name: c for c in CHECKS}
PRELOAD = ['__main__', 'numpy', 'torch', 'legalnb.train', 'legalnb.data', 'legalnb.calculator', 'legalnb.resonance',
           'legalnb.gpt', 'legalnb.evaluate', 'legalnb.cli', 'transformers', 'accelerate', 'legalnb.hf', 'peft']


HF_MODULES = {'transformers', 'accelerate', 'legalnb.hf', 'peft'}

def preload(dry: bool, names: list[str]) -> list[str]:
    "What the process that starts the checks `names` imports once, so that each starts in milliseconds: never CUDA "
    "(peft imports bitsandbytes where it is installed, which probes the GPU: then peft loads in each check)."
    skip = {'peft'} if not dry and not missing(('bitsandbytes',)) else set()
    if not any(n.startswith(('hf-', 'deepspeed')) for n in names): skip |= HF_MODULES   # nothing of theirs runs
    if set(names) <= {'environment'}: skip |= {m for m in PRELOAD if m.startswith('legalnb.')}   # torch's matmul only
    return [m for m in PRELOAD if m == '__main__' or (m not in skip and not missing((m.split('.')[0],)))]


# -- running a check in its own process -----------------------------------------------------------------------------

def child(name: str, dry: bool, work: str, shared: str, result: str, log: str):
    "The check's process: its own session (a timeout ends it and what it started), its output into its log."
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1); os.dup2(fd, 2)
    sys.stdout = open(1, 'w', buffering=1, closefd=False); sys.stderr = open(2, 'w', buffering=1, closefd=False)
    ctx = Ctx(dry, Path(work), Path(shared))
    try: out = BY_NAME[name].run(ctx)
    except Skip as e: out = dict(status='skip', numbers={}, notes=[str(e)])
    except BaseException as e:   # a failure is a result: its last line in the report, the traceback in the log
        traceback.print_exc()
        out = dict(status='fail', numbers={}, notes=[f'{type(e).__name__}: {(str(e).strip().splitlines() or [""])[-1]}'])
    with atomic_write(result) as tmp: tmp.write_text(json.dumps(out, default=str))
    sys.stdout.flush(); sys.stderr.flush()


def descendants(pid: int) -> list[int]:
    "Every process below `pid` (from /proc): torchrun starts its workers in sessions of their own, so a process "
    "group does not hold them."
    children = {}
    for d in Path('/proc').iterdir():
        if not d.name.isdigit(): continue
        try: ppid = int((d/'stat').read_text().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError): continue
        children.setdefault(ppid, []).append(int(d.name))
    found, todo = [], [pid]
    while todo: kids = children.get(todo.pop(), []); found += kids; todo += kids
    return found


def end_tree(pid: int):
    "Stop `pid` and everything below it (stopped, none can start another or be orphaned), then kill them all."
    def signal_(p, sig):
        try: os.kill(p, sig)
        except (ProcessLookupError, PermissionError): pass
    stopped = set()
    for _ in range(10):   # until no new process appears below the stopped ones
        new = [p for p in [pid, *descendants(pid)] if p not in stopped]
        if not new: break
        for p in new: signal_(p, signal.SIGSTOP); stopped.add(p)
    for p in stopped: signal_(p, signal.SIGKILL)
    try: os.killpg(pid, signal.SIGKILL)   # and the check's own session, in case /proc could not be read
    except (ProcessLookupError, PermissionError): pass


def build_locks_since(t: float) -> list[Path]:
    "Locks of torch's C++ extension builds made since `t` (DeepSpeed builds its CPU ops on first use, and a process "
    "ended mid-build leaves its lock behind: every later DeepSpeed start on the machine would wait for it forever)."
    root = Path(os.environ.get('TORCH_EXTENSIONS_DIR') or Path.home()/'.cache'/'torch_extensions')
    try: return [p for p in root.glob('*/*/lock') if p.stat().st_mtime >= t - 1]
    except OSError: return []


def run_check(check: Check, dry: bool, out: Path, timeout: float, starter, keep_work: bool = False) -> dict:
    "Run one check in a fresh process with `timeout`; its result, or why there is none (timeout, crash). Its runs "
    "(checkpoints of GBs on a GPU) are deleted after it unless `keep_work`."
    work, logs = out/'work'/check.name, out/'logs'
    shutil.rmtree(work, ignore_errors=True); work.mkdir(parents=True); logs.mkdir(exist_ok=True)
    result, log = work/'result.json', logs/f'{check.name}.log'
    t, wall = time.monotonic(), time.time()
    p = starter.Process(target=child, args=(check.name, dry, str(work), str(out/'work'/'shared'), str(result),
                                            str(log)))
    p.start(); p.join(timeout)
    if p.is_alive():   # over its cap: the check and everything it started (torchrun, workers) are ended
        end_tree(p.pid); p.join()
        got = dict(status='timeout', numbers={}, notes=[f'stopped at its cap of {timeout:.0f} s'])
        for lock in build_locks_since(wall):   # a JIT build cut short leaves its lock: every later build would wait
            lock.unlink(missing_ok=True); got['notes'].append(f'removed the build lock it left: {lock}')
    elif result.exists(): got = json.loads(result.read_text())
    else:
        tail = log.read_text(errors='replace').strip().splitlines()[-1:] if log.exists() else []
        got = dict(status='fail', numbers={}, notes=[f'the process ended with exit code {p.exitcode} and no result'
                                                     + (f': {tail[0][:200]}' if tail else '')])
    got['seconds'] = time.monotonic() - t
    if not keep_work: shutil.rmtree(work, ignore_errors=True)
    return got


# -- the report -----------------------------------------------------------------------------------------------------

def cross_numbers(checks: dict):
    "Numbers that compare two checks: compile speed-up over eager, ResonanceNet ÷ GPT at long context."
    def num(name, key):
        c = checks.get(name, {})
        return c.get('numbers', {}).get(key) if c.get('status') == 'pass' else None
    for m in ('resonance', 'gpt'):
        a, b = num(f'compile-{m}', 'tokens_per_sec'), num(f'train-{m}', 'tokens_per_sec')
        if a and b: checks[f'compile-{m}']['numbers']['speedup'] = a / b
    for k in ('8k', '32k'):
        r, g = f'long-resonance-{k}', f'long-gpt-{k}'
        for key, what in (('tokens_per_sec', 'tokens_per_sec'), ('peak_gib', 'peak')):
            a, b = num(r, key), num(g, key)
            if a and b: checks[r]['numbers'][f'{what}_over_gpt'] = a / b


def fmt(v, spec: str = '') -> str:
    "A number for the report ('-' when unknown)."
    if v is None: return '-'
    if isinstance(v, bool): return 'yes' if v else 'NO'
    if isinstance(v, float) and not spec: spec = ',.3g' if abs(v) < 100 else ',.0f'
    return format(v, spec) if spec else str(v)


KEY_NUMBERS = {   # what the summary table shows per check
    'environment': [('matmul_tflops', 'matmul TFLOP/s', '.0f')],
    'train': [('tokens_per_sec', 'tok/s', ',.0f'), ('mfu', 'MFU', '.1%'), ('memory_ratio', 'peak/pred', '.2f')],
    'long': [('tokens_per_sec', 'tok/s', ',.0f'), ('memory_ratio', 'peak/pred', '.2f'),
             ('tokens_per_sec_over_gpt', 'vs gpt tok/s', '.2f')],
    'compile': [('compile_s', 'compile s', '.0f'), ('speedup', 'speed-up', '.2f')],
    'generate': [('speedup', 'speed-up', ',.0f'), ('same_tokens', 'same tokens', '')],
    'evaluate': [('ratio', 'eval/forward', '.2f')],
    'hf': [('tokens_per_sec', 'tok/s', ',.0f'), ('memory_ratio', 'peak/pred', '.2f')],
    'torchrun': [('resumed_from', 'resumed from', ''), ('sharded', 'sharded', '')],
    'deepspeed': [('resumed_from', 'resumed from', ''), ('distributed', 'engine', '')],
    'recall': [('resonance_acc', 'resonance', '.1%'), ('gpt_acc', 'gpt', '.1%')],
}


def key_numbers(name: str, numbers: dict) -> str:
    "The summary table's cell of a check's main numbers."
    family = next((k for k in KEY_NUMBERS if name.startswith(k)), None)
    return '; '.join(f'{label} {fmt(numbers.get(key), spec)}' for key, label, spec in KEY_NUMBERS.get(family, [])
                     if key in numbers)


def markdown(report: dict) -> str:
    "report.md: the machine, one row per check, the calculator's predictions against the measurements, failures."
    env, checks = report['environment'], report['checks']
    what = 'DRY RUN on the CPU: toy sizes, a CPU\'s numbers (not a GPU\'s)' if report['dry_run'] else 'GPU check'
    pk = env.get('packages', {})
    lines = [f"# legalnb GPU check ({what})", '',
             f"{report['date']}, {fmt(report['elapsed_s'], '.0f')} s of a {report['budget_s']:.0f} s budget; "
             f"`{report['command']}`", '',
             f"- GPU: {env.get('gpu') or 'none'}" + (f" ({env.get('gpu_memory_gib', 0):.0f} GiB, compute capability "
             f"{'.'.join(map(str, env.get('capability', [])))}, driver {env.get('driver') or '?'}, "
             f"{env.get('precision')})" if env.get('gpu') else ''),
             f"- torch {env.get('torch')}, CUDA {env.get('cuda') or '-'}, cuDNN {env.get('cudnn') or '-'}; Python "
             f"{env.get('python')}",
             '- ' + ', '.join(f'{k} {v or "not installed"}' for k, v in pk.items() if k != 'torch'),
             f"- {env.get('hardware', '')}",
             f"- wheels installed from --wheels: {', '.join(report['wheels']) or 'none'}", '',
             markdown_table(['check', 'status', 'seconds', 'cap', 'numbers', 'notes'],
                            [[name, c['status'], fmt(c.get('seconds'), '.0f'), fmt(c['cap_s'], '.0f'),
                              key_numbers(name, c.get('numbers', {})), ' '.join(c.get('notes', []))[:160]]
                             for name, c in checks.items()], 'llrrll')]
    rows = [[name, c['numbers'].get('model', 'hf-llama'), fmt(c['numbers'].get('seq_len') or c['calibration']['plan']
             ['seq_len'], ','), fmt(c['numbers']['predicted_gib'], '.2f'), fmt(c['numbers']['peak_gib'], '.2f'),
             fmt(c['numbers']['memory_ratio'], '.2f'), fmt(c['numbers']['activation_bytes'], '.1f'),
             fmt(c['numbers'].get('mfu'), '.1%')]
            for name, c in checks.items() if c.get('calibration') and c['status'] == 'pass']
    if rows:
        lines += ['', '## The calculator against the measurements', '',
                  'Predicted: `estimate_memory` of the same plan with the Hugging Face Llama activation constant '
                  '(45.6 B per token, width and layer in bf16). Measured activation bytes: the constant that would have '
                  'predicted the peak; `legalnb estimate --calibration report.json` uses it, and the measured MFU.', '',
                  markdown_table(['check', 'model', 'tokens', 'predicted GiB', 'measured GiB', 'measured / predicted',
                                  'measured activation B', 'MFU'], rows, 'llrrrrrr')]
    bad = [(n, c) for n, c in checks.items() if c['status'] in ('fail', 'timeout')]
    if bad:
        lines += ['', '## Failures', '']
        for n, c in bad:
            lines += [f"- **{n}** ({c['status']}): {' '.join(c.get('notes', []))} (log: `{c.get('log', '')}`)"]
    lines += ['', '## Every number', '', '```json', json.dumps({n: c.get('numbers', {}) for n, c in checks.items()},
                                                               indent=1, default=str), '```', '']
    return '\n'.join(lines)


def parse_cap(text: str) -> tuple[str, float]:
    "('compile-gpt', 180.0) from --cap compile-gpt=180; one line naming the flag otherwise."
    name, eq, secs = text.partition('=')
    try: value = float(secs)
    except ValueError: value = float('nan')
    if not eq or name not in BY_NAME or not value > 0:
        raise LegalnbError(f'--cap {text}: expected NAME=SECONDS with a check name ({", ".join(BY_NAME)}) and '
                           'seconds > 0, e.g. compile-gpt=180')
    return name, value


def ours(rel: Path) -> bool:
    "Files a gpu check writes into its --out folder."
    return rel.parts[0] in ('report.md', 'report.json', 'logs', 'work')


def open_out(out: str) -> Path:
    "The --out folder, checked before anything is written: a new folder or one this script wrote (by its records)."
    if os.path.lexists(out) and not Path(out).is_dir():
        raise LegalnbError(f'--out {out} is not a folder; expected a folder for report.md, report.json and logs/: '
                           'choose a new folder')
    return output_folder(out, 'bench/gpu_check.py', ours, what='the GPU check writes report.md, report.json, logs/ '
                         'and work/ there, and replaces its own')


def main(dry_run: bool = False,       # every check at toy size on the CPU: the test suite's
         out: str = 'gpu-check',      # folder for report.md, report.json and logs/ (and work/ while it runs)
         only: list[str] = None,      # run only these checks (names as in the report)
         skip: list[str] = None,      # leave these checks out
         budget: float = None,        # seconds for the whole command, imports included (480; a dry run 1,500)
         cap: list[str] = None,       # NAME=SECONDS: another cap for a check (a slower GPU, a longer compile)
         wheels: str = None,          # a folder of .whl files installed first, offline (fastcore, bitsandbytes, ...)
         keep_work: bool = False):    # keep work/ (runs, checkpoints, data) after the report
    "Exercise every CUDA path of legalnb on this GPU and measure it; write OUT/report.md and OUT/report.json."
    for n in (only or []) + (skip or []):
        if n not in BY_NAME: raise LegalnbError(f'unknown check {n!r}; the checks: {", ".join(BY_NAME)}')
    caps = dict(parse_cap(c) for c in cap or [])
    with open_out(out) as out_dir:   # locked; a file or a folder of others' refused; what it writes recorded
        for name in ('work', 'logs'): remove_owned(out_dir, name)   # an earlier check's: only what it wrote
        (out_dir/'work'/'shared').mkdir(parents=True)
        return run_checks(dry_run, out_dir, only, skip, budget or (1500 if dry_run else 480), caps, keep_work)


def run_checks(dry_run: bool, out_dir: Path, only: list[str] | None, skip: list[str] | None, budget: float,
               caps: dict, keep_work: bool) -> int:
    "Run the selected checks, each in its own process, into `out_dir`; write the report; 1 when there is no GPU."
    deadline = T0 + budget
    selected = [c for c in CHECKS if (not only or c.name in only or c.name == 'environment')
                and c.name not in (skip or [])]
    starter = mp.get_context('forkserver')
    starter.set_forkserver_preload(preload(dry_run, [c.name for c in selected if not missing(c.needs)]))
    checks, gpu_missing = {}, False
    for c in selected:
        cap = caps.get(c.name, c.dry_cap_s if dry_run else c.cap_s)
        entry = dict(cap_s=cap, about=(c.run.__doc__ or '').strip().splitlines()[0], log=str(out_dir/'logs'/f'{c.name}.log'))
        left = deadline - time.monotonic() - 5   # five seconds for the report
        if gpu_missing: got = dict(status='not run', numbers={}, notes=['no CUDA GPU'])
        elif (absent := missing(c.needs)):
            got = dict(status='skip', numbers={}, notes=[f'{", ".join(absent)} not installed'])
        elif left < 5: got = dict(status='not run', numbers={}, notes=[f'the {budget:.0f} s budget is spent'])
        else:
            entry['timeout_s'] = min(cap, left)
            print(f'{c.name:<20} cap {entry["timeout_s"]:3.0f} s ...', end=' ', flush=True)
            got = run_check(c, dry_run, out_dir, entry['timeout_s'], starter, keep_work)
            if c.name == 'environment' and not dry_run and 'CUDA' in ' '.join(got.get('notes', [])) and \
                    got['status'] != 'pass':   # CUDA refused a process forked from the preloading one: start afresh
                starter = mp.get_context('spawn')
                got = run_check(c, dry_run, out_dir, entry['timeout_s'], starter)
                if got['status'] == 'pass': got['notes'].append('checks started by spawn: CUDA failed after a fork')
            print(f"{got['status']} in {got['seconds']:.0f} s  {key_numbers(c.name, got.get('numbers', {}))}", flush=True)
        checks[c.name] = {**entry, **got}
        if c.name == 'environment' and not dry_run and not got.get('numbers', {}).get('gpu'): gpu_missing = True
    cross_numbers(checks)
    counts = {s: sum(c['status'] == s for c in checks.values()) for s in ('pass', 'fail', 'skip', 'timeout', 'not run')}
    report = dict(kind='gpu-check', schema=1, dry_run=dry_run, date=f'{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC',
                  command=' '.join(['python bench/gpu_check.py', *sys.argv[1:]]), budget_s=budget,
                  elapsed_s=time.monotonic() - T0, wheels=WHEELS if __name__ == '__main__' else [],
                  environment=checks.get('environment', {}).get('numbers', {}), summary=counts, checks=checks)
    with atomic_write(out_dir/'report.json') as tmp: tmp.write_text(json.dumps(report, indent=1, default=str))
    with atomic_write(out_dir/'report.md') as tmp: tmp.write_text(markdown(report))
    if not keep_work: shutil.rmtree(out_dir/'work', ignore_errors=True)
    print(f"\n{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped, {counts['timeout']} over their "
          f"cap, {counts['not run']} not run, in {format_duration(report['elapsed_s'])}; "
          f"{out_dir/'report.md'}, {out_dir/'report.json'}")
    return 1 if gpu_missing else 0


if __name__ == '__main__': sys.exit(run(main))
