"Presets and the GPU table: the issue's values, lookups by device name, refusals that name the valid choices."
import math, subprocess, sys
import pytest
from legalnb import core, presets
from legalnb.core import LegalnbError
from legalnb.presets import GPUS, PRESETS, SIZE_BATCHES, Preset, find_gpu, get_preset, gpu_precision, peak_tflops


def test_presets_import_without_torch():
    out = subprocess.run([sys.executable, '-c', 'import sys, legalnb.presets; print("torch" in sys.modules)'],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == 'False'


@pytest.mark.parametrize('device,key', [('NVIDIA H100 80GB HBM3', 'h100-sxm'), ('NVIDIA A100-SXM4-80GB', 'a100-80gb'),
                                        ('NVIDIA H200', 'h200'), ('NVIDIA L40S', 'l40s'),
                                        ('NVIDIA GeForce RTX 4090', 'rtx-4090'), ('NVIDIA GeForce RTX 2080 Ti', 'rtx-2080-ti'),
                                        ('h100-sxm', 'h100-sxm')])
def test_find_gpu_by_device_name(device, key):
    assert find_gpu(device) is GPUS[key]


def test_dense_peaks_and_precision():
    assert (GPUS['h100-sxm'].bf16_tflops, GPUS['a100-80gb'].bf16_tflops, GPUS['l40s'].bf16_tflops) == (989.4, 312.0, 362.05)
    assert GPUS['rtx-2080-ti'].bf16_tflops is None and gpu_precision('auto', GPUS['rtx-2080-ti']) == 'fp16'
    assert peak_tflops(GPUS['rtx-2080-ti']) == 53.8
    with pytest.raises(LegalnbError, match='no bf16'): peak_tflops(GPUS['rtx-2080-ti'], 'bf16')


def test_unknown_gpu_lists_valid_names():
    with pytest.raises(LegalnbError) as e: find_gpu('NVIDIA H100 PCIe')
    assert all(k in str(e.value) for k in GPUS)


def test_issue_values():
    full, fast = get_preset('cpt', 'full'), get_preset('cpt', 'fast')
    assert (full.steps, full.seq_len, full.lr, full.global_batch, full.corpus_tokens, full.gpus, full.strategy) == \
           (40_000, 4096, 2e-5, 128, 5_000_000_000, 4, 'deepspeed-zero3')
    assert (fast.steps, fast.seq_len, fast.lr, fast.global_batch, fast.corpus_tokens) == (12_000, 3072, 3e-5, 128, 2_000_000_000)
    agg = get_preset('cpt', 'aggressive')
    assert agg.steps < fast.steps and agg.global_batch > fast.global_batch
    assert agg.lr == pytest.approx(fast.lr * math.sqrt(agg.global_batch / fast.global_batch))
    assert {n: (get_preset('lora', n).grad_accum, get_preset('lora', n).precision, get_preset('lora', n).lr)
            for n in ('full', 'fast', 'aggressive')} == {'full': (16, 'fp32', 2e-4), 'fast': (32, 'auto', 2.5e-4),
                                                         'aggressive': (64, 'auto', 3e-4)}
    assert SIZE_BATCHES == {'small': (4, 8), 'medium': (4, 8), 'large': (2, 16), 'xlarge': (1, 32)}


def test_every_preset_is_consistent_and_explained():
    assert len(PRESETS) == 9
    for p in PRESETS.values():
        assert p.global_batch == p.micro_batch * p.grad_accum * p.gpus and len(p.why) > 40
        text = p.describe(file=open('/dev/null', 'w'))
        assert p.why in text and f'{p.task}/{p.name}' in text


def test_size_keeps_global_batch():
    for size, (micro, accum) in SIZE_BATCHES.items():
        p = get_preset('scratch', 'full', size)
        assert (p.micro_batch, p.grad_accum, p.global_batch) == (micro, accum, 32)


def test_refusals_name_the_choices():
    with pytest.raises(LegalnbError, match='fast, full, aggressive'): get_preset('cpt', 'turbo')
    with pytest.raises(LegalnbError, match='small, medium, large, xlarge'): get_preset('scratch', 'fast', 'huge')
    with pytest.raises(LegalnbError, match=r'2 × 16 × 4 = 128, got 64'):
        Preset('cpt', 'full', 2e-5, 40_000, 4096, 64, 2, 16, 'auto', 1000, 4, None, 'deepspeed-zero3', '')


def test_one_precision_rule_from_core():
    "presets keeps the GPU table; the precision rule and PRECISIONS are core's (no second copy)."
    assert presets.PRECISIONS is core.PRECISIONS and presets.resolve_precision is core.resolve_precision
    assert 'PRECISIONS' not in presets.__all__ and 'resolve_precision' not in presets.__all__
    for key, gpu in GPUS.items():
        assert gpu_precision('auto', gpu) == core.resolve_precision('auto', gpu.compute_capability), key
    assert gpu_precision('auto', None) == 'fp32'
    with pytest.raises(LegalnbError, match="precision must be one of auto, bf16, fp16, fp32, got 'int8'"):
        peak_tflops(GPUS['h100-sxm'], 'int8')


def test_every_registered_model_size_has_a_batch_plan():
    from legalnb.models import MODELS
    for spec in MODELS.values():
        assert set(spec.sizes) <= set(SIZE_BATCHES), spec.name
        for size in spec.sizes: assert get_preset('scratch', 'full', size).global_batch == 32
    src = (presets.__file__ and open(presets.__file__).read()).lower()
    assert 'legalnb.resonance' not in src and 'legalnb.gpt' not in src   # the presets name no architecture
