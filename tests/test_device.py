"""No silent CPU (issue 40): with a simulated GPU (a fake `nvidia-smi` first on PATH that prints what a real one prints)
and this machine's CPU-only torch, `--device auto` says in one line why it runs on the CPU and what to install, and
`--device cuda` refuses in one line: `legalnb train` (a real subprocess), `finetune`, `evaluate` and `generate`."""
import json, os, subprocess, sys, time
from pathlib import Path

import pytest
import torch

from conftest import ENV, make_split, shape
from legalnb import machine
from legalnb.core import LegalnbError
from legalnb.cli import main
from legalnb.machine import NvidiaGpu, cuda_unusable, nvidia_gpus, resolve_device

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason='simulates a GPU that torch cannot use')

SMI = """Tue Nov 28 10:00:00 2023
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |
|                                         |                      |               MIG M. |
|=========================================+======================+======================|
|   0  NVIDIA H100 80GB HBM3          On  | 00000000:18:00.0 Off |                    0 |
| N/A   32C    P0              69W / 700W |      4MiB / 81559MiB |      0%      Default |
|                                         |                      |             Disabled |
+-----------------------------------------+----------------------+----------------------+

+---------------------------------------------------------------------------------------+
| Processes:                                                                            |
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|        ID   ID                                                             Usage      |
|=======================================================================================|
|  No running processes found                                                           |
+---------------------------------------------------------------------------------------+
"""
H100 = NvidiaGpu('NVIDIA H100 80GB HBM3', '535.104.05', '12.2')
WHY = cuda_unusable(H100, torch.__version__, torch.version.cuda)   # this torch: a CPU-only build
AUTO = f'legalnb: running on the CPU, although the driver shows {H100}: {WHY}'


def fake_smi(folder: Path, body: str) -> str:
    "A folder holding an executable `nvidia-smi` that runs `body` (sh); the PATH with it first."
    folder.mkdir(parents=True, exist_ok=True)
    (folder/'nvidia-smi').write_text(f'#!/bin/sh\n{body}\n'); (folder/'nvidia-smi').chmod(0o755)
    return f'{folder}{os.pathsep}{os.environ["PATH"]}'


@pytest.fixture
def gpu_machine(tmp_path, monkeypatch):
    "This process on a machine whose driver shows an H100 (the fake nvidia-smi first on PATH); its PATH."
    path = fake_smi(tmp_path/'bin', f"cat <<'EOF'\n{SMI}EOF")
    monkeypatch.setenv('PATH', path); monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    monkeypatch.setattr(machine, '_SAID', set())
    return path


def test_the_fake_nvidia_smi_is_read_as_a_real_one(gpu_machine):
    assert nvidia_gpus() == [H100]
    assert 'CPU-only build (torch.version.cuda is None)' in WHY and 'make install TORCH_VARIANT=cu126' in WHY
    assert 'pip install torch --index-url https://download.pytorch.org/whl/cu126' in WHY


def test_no_nvidia_smi_and_no_proc_files_is_no_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv('PATH', str(tmp_path))   # no nvidia-smi anywhere
    assert nvidia_gpus(tmp_path/'no-proc') == []
    assert resolve_device('auto') == torch.device('cpu') and capsys.readouterr().err == ''
    with pytest.raises(LegalnbError, match='--device cuda: no CUDA GPU is visible; use --device cpu'):
        resolve_device('cuda')


def test_a_hung_nvidia_smi_is_no_gpu_after_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv('PATH', fake_smi(tmp_path/'bin', 'exec sleep 60'))
    monkeypatch.setattr(machine, 'NVIDIA_SMI_TIMEOUT', 0.5)
    t = time.perf_counter()
    assert nvidia_gpus(tmp_path/'no-proc') == [] and time.perf_counter() - t < 5


def test_train_auto_says_why_in_one_line_and_trains_on_the_cpu(gpu_machine, tmp_path):
    "The real `legalnb train` command in its own process, with the fake nvidia-smi on its PATH."
    split = make_split(tmp_path)
    argv = ['--data', split, '--out', tmp_path/'run', *shape('gpt'), '--batch-size', '2', '--max-steps', '2',
            '--eval-every', '2', '--eval-batches', '1', '--num-workers', '0', '--device', 'auto']
    p = subprocess.run([sys.executable, '-m', 'legalnb.cli', 'train', *map(str, argv)], capture_output=True, text=True,
                       env={**ENV, 'PATH': gpu_machine}, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert [l for l in p.stderr.splitlines() if 'legalnb' in l] == [AUTO], p.stderr
    assert json.loads((tmp_path/'run'/'summary.json').read_text())['device'] == 'cpu'


@pytest.mark.parametrize('command', ['train', 'evaluate', 'generate', 'compare'])
def test_device_cuda_refuses_in_one_line_with_the_reason(command, gpu_machine, tmp_path, capsys):
    split = make_split(tmp_path)
    argv = {'train': ['--data', split, '--out', tmp_path/'run', *shape('gpt')],
            'evaluate': [tmp_path, '--data', tmp_path/'heldout.jsonl'],   # refused before the model loads
            'generate': [tmp_path, '--prompt', 'Article 1'],
            'compare': ['--data', split, '--out', tmp_path/'cmp', '--models', 'gpt', '--budget', '1000']}[command]
    if command in ('evaluate', 'generate'):   # the device is resolved before the weights load: a config suffices
        (tmp_path/'config.json').write_text('{"model_type": "llama"}')
        (tmp_path/'heldout.jsonl').write_text(json.dumps(dict(celex='32016R0679', lang='en', text='Article 1')) + '\n')
    assert main([command, *map(str, argv), '--device', 'cuda']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f'legalnb {command}: error: --device cuda: the driver shows {H100}, but {WHY}'], err
    assert not (tmp_path/'run').exists()


def test_finetune_says_why_in_one_line(tiny_llama, gpu_machine, tmp_path, capsys):
    "finetune has no --device: it runs where transformers puts it, and says so on a machine with an unused GPU."
    from legalnb.hf import load_hf_model, write_demo_shards
    write_demo_shards(tmp_path/'corpus', load_hf_model(tiny_llama, tokenizer_only=True)[1], rows=16, seq_len=32)
    assert main(['finetune', '--model', str(tiny_llama), '--data', str(tmp_path/'corpus'), '--out', str(tmp_path/'ft'),
                 '--max-steps', '1', '--batch-size', '2', '--grad-accum', '1', '--workers', '0',
                 '--force-single']) == 0
    err = capsys.readouterr().err
    assert [l for l in err.splitlines() if l.startswith('legalnb')] == [AUTO], err
    assert json.loads((tmp_path/'ft'/'finetune.json').read_text())['device'] == 'cpu'
