"""Shared helpers of the trainer tests (imported as `from conftest import ...`): one split maker, one file-tree snapshot,
the tiny shape of each architecture, and the multi-process runs that several test files compare."""
import io, json, os, subprocess, sys, tempfile
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from legalnb.data import split
from legalnb.models import MODELS, get_model

ROOT = Path(__file__).resolve().parents[1]
# `evaluate --against` keeps reference evaluations in $LEGALNB_CACHE: the tests' own folder, never the user's cache
os.environ.setdefault('LEGALNB_CACHE', tempfile.mkdtemp(prefix='legalnb-test-cache-'))
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': str(ROOT)}  # child processes: one thread, this checkout
ARCHITECTURES = tuple(MODELS)  # every registered model goes through the same trainer tests
FLAGS = ('dim', 'num_layers', 'num_frequencies')   # given as flags, the other tiny fields as --model-overrides (as the
                                                   # tests always called it: the describe line keeps their order)

def shape(model: str) -> list[str]:
    "`legalnb train` flags for the tiny shape the registry gives architecture `model` (`ModelSpec.tiny`)."
    tiny = get_model(model).tiny
    flags = [x for k, v in tiny.items() if k in FLAGS for x in (f'--{k.replace("_", "-")}', str(v))]
    rest = [f'{k}={v}' for k, v in tiny.items() if k not in FLAGS]
    return ['--model', model, *flags, *(['--model-overrides', *rest] if rest else [])]

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    "`--dist loadfile` (make test), but each notebook of test_run_all.py is a unit of its own, not the whole file."
    # a file's module fixtures are still made once; the notebooks, run one per test in fresh kernels, spread over the
    # workers instead of all running on one of them
    if config.getvalue('dist') != 'loadfile': return None
    from xdist.scheduler import LoadFileScheduling
    class NotebooksApart(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid.split('::')[0].endswith('test_run_all.py') else super()._split_scope(nodeid)
    return NotebooksApart(config, log)

def make_split(root: Path, rows=96, seq_len=16, vocab=32, seed=0) -> Path:
    "A corpus of counting rows in two shards, split into train/ and val/ by the data stage."
    rng = np.random.default_rng(seed)
    ids = ((rng.integers(0, vocab, (rows, 1)) + np.arange(seq_len + 1)) % vocab).astype(np.uint16)
    corpus = root/'corpus'; corpus.mkdir(parents=True)
    np.save(corpus/'shard_00000.npy', ids[:rows // 2]); np.save(corpus/'shard_00001.npy', ids[rows // 2:])
    (corpus/'manifest.json').write_text(json.dumps({'vocab_size': vocab}))
    split(corpus, root/'split', val_ratio=0.25, seed=0, by='rows')
    return root/'split'

def tree(folder: Path) -> dict:
    "Every file under `folder` (relative path) with its bytes: equal trees mean nothing changed."
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob('*')) if p.is_file()}

def legalnb_train(argv: list, nproc: int = 1) -> subprocess.CompletedProcess:
    "`legalnb train ARGV` in a fresh process, or in `nproc` processes under torchrun (gloo on the CPU)."
    launch = ['-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}'] if nproc > 1 else []
    return subprocess.run([sys.executable, *launch, '-m', 'legalnb.cli', 'train', *map(str, argv)], env=ENV,
                          capture_output=True, text=True, timeout=300)

DIST_STEPS = 6  # optimizer steps of the multi-process runs

def dist_args(split_dir: Path, out: Path, model: str, grad_accum: int, *extra) -> list[str]:
    "A 6-step run of 8 sequences per step (batch 2 x grad_accum x ranks), saved and evaluated every 3 steps."
    return ['--data', split_dir, '--out', out, *shape(model), '--batch-size', '2', '--grad-accum', str(grad_accum),
            '--max-steps', str(DIST_STEPS), '--warmup-steps', '2', '--lr', '3e-3', '--save-every', '3',
            '--eval-every', '3', '--eval-batches', '2', '--log-every', '1', '--num-workers', '0', '--seed', '11',
            '--device', 'cpu', *extra]

@pytest.fixture(scope='session')
def dist_runs(tmp_path_factory):
    "`get(name, model, nproc, grad_accum, *extra)`: a finished run folder and its process, made once per session."
    root, made = tmp_path_factory.mktemp('dist'), {}
    split_dir = make_split(root)
    def get(name: str, model: str, nproc: int, grad_accum: int, *extra):
        key = (name, model)
        if key not in made:
            out = root/model/name
            if nproc == 1:  # in this process: no interpreter to start (the comparisons allow float tolerance)
                from legalnb.cli import main
                with redirect_stdout(io.StringIO()) as text: assert main(['train', *map(str, dist_args(
                    split_dir, out, model, grad_accum, *extra))]) == 0
                made[key] = out, subprocess.CompletedProcess([], 0, text.getvalue(), '')
            else:
                p = legalnb_train(dist_args(split_dir, out, model, grad_accum, *extra), nproc)
                assert p.returncode == 0, p.stderr[-3000:]
                made[key] = out, p
        return made[key]
    get.split_dir = split_dir
    return get

def load_bench(name: str, monkeypatch):
    "bench/NAME.py as a module, with bench/ first on the path (as `python bench/NAME.py` has it)."
    import importlib.util
    monkeypatch.syspath_prepend(str(ROOT/'bench'))
    spec = importlib.util.spec_from_file_location(f'bench_{name}', ROOT/'bench'/f'{name}.py')
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    return module

@pytest.fixture(scope='session')
def tiny_llama(tmp_path_factory) -> Path:
    "A tiny Llama folder (save_pretrained: weights, config, tokenizer), made once per session."
    from legalnb.hf import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp('tiny-llama')/'llama')
