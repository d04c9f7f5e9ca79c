"""A run prints nothing the user cannot act on: no third-party warning about a default legalnb chose or an optional
package legalnb does not need. Each command runs in a fresh process, as a user starts it, pinned to one core."""
import os, subprocess, sys
from pathlib import Path

import pytest
from conftest import ENV, make_split, shape
from legalnb.hf import build_tiny_model, demo_examples
from legalnb.sources import write_jsonl

ONE_CORE = lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})   # a 1-core machine, as taskset makes it

def legalnb(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'legalnb.cli', *map(str, argv)], env=ENV, capture_output=True,
                          text=True, timeout=300, preexec_fn=ONE_CORE)

@pytest.mark.skipif(not hasattr(os, 'sched_setaffinity'), reason='needs Linux CPU affinity to stand for a small machine')
def test_the_trainer_starts_no_more_loader_workers_than_the_machine_has_cores(tmp_path):
    "The default was 4 workers: on fewer cores torch warned twice per run about a setting the user never chose."
    p = legalnb('train', '--data', make_split(tmp_path), '--out', tmp_path/'run', *shape('gpt'), '--max-steps', '2',
                '--batch-size', '2', '--eval-every', '0', '--eval-batches', '1', '--device', 'cpu', '--no-progress')
    assert p.returncode == 0, p.stderr[-2000:]
    assert 'data loader: 1 workers (1 cores here)' in p.stdout
    assert 'warn' not in p.stderr.lower(), p.stderr

def test_qlora_prints_no_warning_about_an_optional_kernel_package(tmp_path):
    "bitsandbytes 0.50 logged a missing `kernels` package, peft a transformers deprecation, the Trainer its doubts about mtime."
    from legalnb.hf import qlora_unavailable
    if (why := qlora_unavailable()): pytest.skip(why)
    model = build_tiny_model(tmp_path/'model', 'llama')
    write_jsonl(demo_examples(12), tmp_path/'sft.jsonl')
    p = legalnb('finetune', '--model', model, '--data', tmp_path/'sft.jsonl', '--out', tmp_path/'q', '--qlora',
                '--max-steps', '2', '--batch-size', '2', '--grad-accum', '1', '--save-steps', '1')
    assert p.returncode == 0, p.stderr[-2000:]
    assert 'warn' not in p.stderr.lower() and 'kernels' not in p.stderr and 'mtime' not in p.stderr, p.stderr
    assert (tmp_path/'q'/'final'/'adapter_model.safetensors').is_file()
