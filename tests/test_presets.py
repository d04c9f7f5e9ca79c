"Presets and the GPU table: the issue's values, lookups by device name, refusals that name the valid choices."
import math, subprocess, sys
import pytest
from legalnb import machine, presets
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


def test_one_precision_rule_from_machine():
    "presets keeps the GPU table; the precision rule and PRECISIONS are machine's (no second copy)."
    assert presets.PRECISIONS is machine.PRECISIONS and presets.resolve_precision is machine.resolve_precision
    assert 'PRECISIONS' not in presets.__all__ and 'resolve_precision' not in presets.__all__
    for key, gpu in GPUS.items():
        assert gpu_precision('auto', gpu) == machine.resolve_precision('auto', gpu.compute_capability), key
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


# ---------------------------------------------------------------- long-context presets (issue 15, item 4)
from legalnb.presets import LONG_CONTEXT, long_context_preset, lr_for_params, seq_len_at, seq_len_stages, size_params


@pytest.mark.parametrize('name', ['fast', 'full', 'aggressive'])
@pytest.mark.parametrize('size', list(SIZE_BATCHES))
def test_long_context_tokens_per_step_constant_through_the_warm_up(name, size):
    p = get_preset('scratch', name, size, model='resonance')
    assert p.global_batch == p.micro_batch * p.grad_accum * p.gpus and p.batch_tokens == p.global_batch * p.seq_len
    lengths = [seq_len_at(s, p.seq_len, p.seq_warmup_start, p.seq_warmup_steps) for s in range(p.steps)]
    assert lengths[0] == p.seq_warmup_start == 1024 and lengths[-1] == p.seq_len
    assert lengths == sorted(lengths) and p.seq_len in lengths[p.seq_warmup_steps:p.seq_warmup_steps + 1]
    for length in set(lengths):   # rows per step at that length × the length = the same tokens
        assert p.seq_len % length == 0 and (p.global_batch * p.seq_len // length) * length == p.batch_tokens


@pytest.mark.parametrize('size', list(SIZE_BATCHES))
def test_long_context_steps_and_lr_from_the_size(size):
    fast, full, agg = (get_preset('scratch', n, size, model='resonance') for n in ('fast', 'full', 'aggressive'))
    assert (fast.seq_len, full.seq_len, agg.seq_len) == (8192, 32768, 8192)
    for p in (fast, full, agg):
        n = size_params('resonance', size, p.seq_len)
        assert p.steps == math.ceil(p.tokens_per_param * n / p.batch_tokens)
        assert p.total_tokens - p.batch_tokens < p.tokens_per_param * n <= p.total_tokens
        assert f'{p.tokens_per_param:g} tokens/parameter' in p.why and f'{p.steps:,}' in p.why
    assert (full.tokens_per_param, fast.tokens_per_param) == (20, 5)
    assert full.lr == pytest.approx(lr_for_params(size_params('resonance', size, 32768)))
    assert fast.lr == pytest.approx(4 / 3 * lr_for_params(size_params('resonance', size, 8192)))
    assert agg.lr == pytest.approx(fast.lr * math.sqrt(2)) and abs(agg.total_tokens - fast.total_tokens) < agg.batch_tokens


def test_lr_falls_with_the_size_as_in_gpt3():
    assert [lr_for_params(n) for n in (125e6, 350e6, 760e6, 1.3e9, 13e9)] == [6e-4, 3e-4, 2.5e-4, 2e-4, 1e-4]
    sizes = [lr_for_params(size_params('resonance', s, 32768)) for s in SIZE_BATCHES]
    assert sizes == sorted(sizes, reverse=True) and lr_for_params(10e6) == 6e-4 and lr_for_params(1e15) == 0.6e-4


def test_other_models_keep_the_1k_presets():
    assert get_preset('scratch', 'fast', model='gpt') == get_preset('scratch', 'fast') == PRESETS['scratch', 'fast']
    assert get_preset('scratch', 'full', 'large', model='gpt').seq_len == 1024
    assert set(LONG_CONTEXT) == {('resonance', n) for n in ('fast', 'full', 'aggressive')}
    assert get_preset('scratch', 'fast', model='resonance') == long_context_preset('resonance', 'fast', 'small')


def test_seq_len_stages_double_while_they_divide():
    assert seq_len_stages(8192, 1024) == [1024, 2048, 4096, 8192]
    assert seq_len_stages(6144, 1024) == [1024, 2048, 6144]     # 4096 does not divide 6144
    assert [seq_len_at(s, 8192, 1024, 6) for s in range(8)] == [1024] * 2 + [2048] * 2 + [4096] * 2 + [8192] * 2
    with pytest.raises(LegalnbError, match='seq_warmup_start 3 must divide the row length 1024'): seq_len_stages(1024, 3)


def test_long_context_preset_refusals():
    with pytest.raises(LegalnbError, match='small, medium, large, xlarge'): get_preset('scratch', 'full', 'huge', model='resonance')
    base = get_preset('scratch', 'fast', model='resonance')
    from dataclasses import replace
    with pytest.raises(LegalnbError, match=r'batch_tokens must equal global_batch × seq_len = 32 × 8192 = 262144, got 1000'):
        replace(base, batch_tokens=1000)
    with pytest.raises(LegalnbError, match='seq_warmup_start must divide seq_len 8192'): replace(base, seq_warmup_start=3000)
    text = base.describe(file=open('/dev/null', 'w'))
    assert '262,144 tokens per step at every row length' in text and 'rows of 1,024 → 2,048 → 4,096 → 8,192' in text
