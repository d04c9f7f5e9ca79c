"The calculator: the issue's example, rounding, LR scaling, hardware checks, memory by hand, calibration, the CLI."
import json, math, subprocess, sys
import pytest
from legalnb import calculator, core
from legalnb.core import LegalnbError
from legalnb.calculator import (GIB, Plan, calibrate, compare, count_steps, estimate, estimate_main, estimate_memory,
                                plan_for, scale_lr)
from legalnb.cli import main


def test_issue_example_to_the_step_and_tenth_of_an_hour():
    slow = estimate(Plan(examples=63_000, micro_batch=1, grad_accum=16, sec_per_step=30))
    assert slow.steps == 3938 and round(slow.hours, 1) == 32.8
    fast = estimate(Plan(examples=63_000, micro_batch=1, grad_accum=32, sec_per_step=30 / 1.3))
    assert fast.steps == 1969 and round(fast.hours, 1) == 12.6
    assert slow.lines[1] == 'time = 3,938 steps × 30 s = 118,140 s = 32.8 h'


def test_partial_steps_round_up():
    assert count_steps(63_000, 1, 16) == 3938          # 3,937.5: the half batch is one more step
    assert count_steps(64_000, 1, 32) == 2000          # exact: no extra step
    assert count_steps(129, 2, 128) == 3               # 2.016 -> 3
    assert count_steps(30, 0.1, 1) == 3                # float noise (0.1 × 30 = 3.0000000000000004) is not a partial step
    e = estimate(Plan(examples=63_000, grad_accum=16))
    assert 'ceil(3,937.5) = 3,938: a partial last batch is one more step' in e.lines[0]
    assert 'partial' not in estimate(Plan(examples=64_000, grad_accum=32)).lines[0]
    # epochs from packed corpus tokens: sequences = tokens // seq_len
    e = estimate(Plan(tokens=10_000, seq_len=100, micro_batch=8, epochs=2))
    assert (e.steps, e.sequences, e.tokens) == (25, 200, 20_000)


def test_lr_scaling_both_ways():
    assert math.isclose(scale_lr(2e-4, 16, 64), 4e-4) and math.isclose(scale_lr(2e-4, 16, 64, 'linear'), 8e-4)
    assert math.isclose(scale_lr(4e-4, 64, 16), 2e-4) and math.isclose(scale_lr(8e-4, 64, 16, 'linear'), 2e-4)
    assert math.isclose(scale_lr(scale_lr(3e-5, 128, 256), 256, 128), 3e-5)
    with pytest.raises(LegalnbError, match="'sqrt' or 'linear'"): scale_lr(1e-3, 1, 2, 'cubic')


def test_mfu_above_100_percent_is_rejected_with_the_arithmetic():
    with pytest.raises(LegalnbError) as e:
        estimate(Plan(tokens=1e9, seq_len=4096, params=7e9, tokens_per_sec=50_000, gpu='h100-sxm'))
    msg = str(e.value)
    assert msg.startswith('impossible plan: MFU = 4.2e19 FLOPs ÷ (20,000 s × 1 × 989 TFLOP/s) = 212.2%')
    assert 'at most 23,557 tokens/s' in msg
    with pytest.raises(LegalnbError, match='impossible plan'):   # the same check from seconds per step
        estimate(Plan(steps=1000, seq_len=2048, micro_batch=8, params=1e9, sec_per_step=0.05, gpu='a100-80gb'))
    ok = estimate(Plan(tokens=1e9, seq_len=4096, params=7e9, tokens_per_sec=5_000, gpu='h100-sxm'))
    assert math.isclose(ok.implied_mfu, 6 * 7e9 * ok.tokens / (ok.seconds * 989.4e12))
    assert math.isclose(ok.implied_mfu, 6 * 7e9 * 5000 / 989.4e12)
    with pytest.raises(LegalnbError, match='mfu is a fraction'): Plan(mfu=1.5)


def test_claimed_hours_flagged_with_the_figure_that_would_make_them_true():
    e = estimate(Plan(examples=63_000, grad_accum=16, sec_per_step=30, claimed_hours=13))
    assert e.warnings == ['claimed 13.0 h, but time = 3,938 steps × 30 s = 118,140 s = 32.8 h (2.52× the claim); '
                          'the claim needs 11.9 s per step']
    assert 13 * 3600 / 3938 == pytest.approx(11.88, abs=0.01)
    assert estimate(Plan(examples=63_000, grad_accum=16, sec_per_step=30, claimed_hours=30)).warnings == []  # 8.6% off
    assert len(estimate(Plan(examples=63_000, grad_accum=16, sec_per_step=30, claimed_hours=26)).warnings) == 1  # 21% off
    e = estimate(Plan(steps=12_000, micro_batch=2, grad_accum=16, gpus=4, seq_len=3072, params=7e9, gpu='h100-sxm',
                      mfu=0.4, claimed_hours=10))
    need = e.warnings[0]
    assert 'but time: FLOPs = 6·N·D = 6 × 7B × 4.72B = 2e20 → at 40% of 4 × 989 TFLOP/s: 34.8 h (3.48× the claim)' in need and '131,072 tokens/s' in need and '139% MFU (impossible: over 100%)' in need


def test_memory_against_hand_computed_figures():
    # 125M params, 12 layers × 768, 8 × 1,024 tokens, 32,000 vocab, 16-bit activations, one 11 GiB card
    p = dict(params=125e6, layers=12, d_model=768, seq_len=1024, micro_batch=8, vocab=32_000, gpu='rtx-2080-ti')
    m = estimate_memory(Plan(**p))
    assert (m.weights, m.grads, m.optimizer) == (4 * 125e6, 4 * 125e6, 8 * 125e6)
    assert m.activations == pytest.approx(12 * 45.6 * 8 * 1024 * 768)   # measured for the HF Llama layout (was 34)
    assert m.logits == 4 * 8 * 1024 * 32_000 == 1_048_576_000
    assert m.total == pytest.approx(2e9 + 12 * 45.6 * 8 * 1024 * 768 + 1_048_576_000)
    assert m.capacity == 0.9 * 11 * GIB and m.fits
    ck = estimate_memory(Plan(**p, checkpointing=True))
    assert ck.activations == pytest.approx((12 * 2 + 45.6) * 8 * 1024 * 768)
    assert estimate_memory(Plan(**p, precision='fp32')).activations == pytest.approx(12 * 83.0 * 8 * 1024 * 768)
    assert not estimate_memory(Plan(**(p | dict(micro_batch=32)))).fits
    assert estimate_memory(Plan(params=7e9, lora_params=16e6, gpu='h100-sxm')).total == 2 * 7e9 + 16 * 16e6
    assert estimate_memory(Plan(params=7e9, gpu='h100-sxm')).fits is False
    z3 = estimate_memory(Plan(params=7e9, gpu='h100-sxm', gpus=4, strategy='deepspeed-zero3'))
    assert z3.total == 18 * 7e9 / 4 and z3.fits   # DeepSpeed's 18 B: its bf16 copy beside the 16
    e = estimate(Plan(**(p | dict(micro_batch=32)), steps=10))
    assert any(w.startswith('does not fit: 18.6 GiB per GPU > 9.9 GiB usable') for w in e.warnings)


def test_preset_plan_and_cost():
    e = estimate(plan_for('cpt', 'full', params=7e9, gpu='h100-sxm', mfu=0.4, price_per_hour=3.0))
    assert e.steps == 40_000 and e.tokens == 40_000 * 128 * 4096 and round(e.epochs, 2) == 4.19
    assert e.seconds == pytest.approx(6 * 7e9 * e.tokens / (4 * 989.4e12 * 0.4))
    assert e.cost == pytest.approx(e.hours * 4 * 3.0)
    assert 'FLOPs = 6·N·D = 6 × 7B × 21B = 8.8e20 → at 40% of 4 × 989 TFLOP/s: 6.4 d' in e.lines[-2]
    assert e.lines[-1] == f'cost = 4 GPU × 6.4 d at 3.00/GPU-h = {e.cost:,.2f}'


def test_compare_and_calibrated_plan():
    c = compare(estimate(Plan(examples=63_000, grad_accum=16, sec_per_step=30)), 35 * 3600)
    assert str(c) == 'predicted 32.8 h, measured 35.0 h: 6.2% under'
    ticks = iter(range(100))
    cal = calibrate(lambda: None, n_steps=4, warmup=2, clock=lambda: next(ticks) * 0.5)  # each step spans 0.5 s
    assert cal.times == [0.5] * 4 and estimate(cal.plan(Plan(examples=100, micro_batch=10, mfu=0.5, params=1e6,
                                                            gpu='l40s', seq_len=8))).seconds == 5.0
    with pytest.raises(LegalnbError): compare(10.0, 0)


def _cli(*args):
    return subprocess.run([sys.executable, '-m', 'legalnb.cli', 'estimate', *args], capture_output=True, text=True)


def test_cli_json_and_table():
    r = _cli('--examples', '63,000', '--batch-size', '1', '--grad-accum', '16', '--sec-per-step', '30',
             '--price-per-hour', '2', '--claimed-hours', '13', '--json')
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert (j['steps'], round(j['hours'], 1), round(j['cost'], 2), j['implied_mfu'], j['tokens']) == (3938, 32.8, 65.63, None, None)
    assert len(j['warnings']) == 1 and '11.9 s per step' in j['warnings'][0]
    r = _cli('--preset', 'cpt/fast', '--params', '7B', '--gpu', 'NVIDIA H100 80GB HBM3', '--mfu', '40', '--json')
    j = json.loads(r.stdout)
    assert j['steps'] == 12_000 and j['tokens'] == 12_000 * 128 * 3072 and round(j['implied_mfu'], 3) == 0.4 and j['gpus'] == 4
    r = _cli('--steps', '1000', '--batch-size', '8', '--seq-len', '1024', '--tokens-per-sec', '20k', '--params', '125M',
             '--gpu', 'a100-80gb')
    assert r.returncode == 0 and 'implied MFU  4.8%' in r.stdout and 'time = 8.19M tokens ÷ 20,000 tokens/s' in r.stdout


@pytest.mark.parametrize('args,expect', [
    (['--steps', '10', '--gpu', 'tpu-v5'], "unknown GPU 'tpu-v5'"),
    (['--steps', '-5', '--sec-per-step', '1'], "--steps: expected a count of 0 or more, got '-5'"),
    (['--mfu', '0.4', '--steps', '1'], '--mfu is a percent'),
    (['--sec-per-step', '1', '--mfu', '40'], 'give one speed: --sec-per-step, --tokens-per-sec or --mfu'),
    (['--preset', 'cpt/turbo'], '--preset cpt/turbo: unknown'),
    (['--params', 'lots', '--steps', '1'], "--params: expected a number such as"),
    (['--tokens', 'inf', '--seq-len', '8', '--sec-per-step', '1'], "--tokens: expected a finite number"),
    (['--steps', '1e400', '--sec-per-step', '1'], "--steps: expected a finite number"),
    (['--params', 'inf', '--steps', '10', '--seq-len', '8', '--gpu', 'h100-sxm', '--mfu', '40'], "--params: expected a finite"),
    (['--params', 'nan', '--steps', '10'], "--params: expected a finite number"),
    (['--examples', '-100', '--sec-per-step', '1'], "--examples: expected a count of 0 or more"),
    (['--steps', '10', '--mfu', '-5'], '--mfu is a percent of the dense peak (40 for 40%), above 1 and at most 100, got -5'),
    (['--steps', '10', '--sec-per-step', '-1'], '--sec-per-step must be more than 0, got -1'),
    (['--steps', '10', '--batch-size', 'eight'], "--batch-size: expected a whole number, got 'eight'"),
    (['--steps', '10', '--gpus', '0'], '--gpus must be more than 0, got 0'),
    (['--steps', '10', '--epochs', '2'], 'give --epochs or --steps, not both'),
    (['--steps', '10', '--gpu', 'tpu-v5'], "--gpu: unknown GPU 'tpu-v5'"),
    (['--preset', 'nope', '--params', '7B'], '--preset nope: unknown; expected TASK/NAME'),
    (['--steps', '1e300', '--seq-len', '1e9', '--params', '1e200', '--gpu', 'h100-sxm', '--mfu', '40'], 'figures overflow'),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, expect):
    r = _cli(*args)
    assert r.returncode == 2 and r.stdout == ''
    assert r.stderr.count('\n') == 1 and r.stderr.startswith('legalnb estimate: error:') and expect in r.stderr, r.stderr


def test_cli_in_process(capsys):
    assert main(['estimate', '--examples', '63000', '--grad-accum', '32', '--sec-per-step', str(30 / 1.3)]) == 0
    out = capsys.readouterr().out
    assert 'steps        1,969' in out and 'time         12.6 h' in out


def test_cli_model_size_fills_the_model_and_the_batch():
    r = _cli('--preset', 'scratch/full', '--model-size', 'xlarge', '--gpu', 'h100-sxm', '--mfu', '35', '--json')
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    from legalnb.presets import get_preset
    full = get_preset("scratch", "full", "xlarge", model="resonance")   # ResonanceNet's 32k preset, sized for xlarge
    assert j['steps'] == full.steps and j['global_batch'] == 16 and j['tokens'] == full.steps * 16 * 32_768
    assert not j['fits']   # xlarge needs more than one H100 (the preset says --strategy fsdp)
    assert j['flops'] > 6 * 1e9 * j['tokens'] and j['memory_gib'] > 0   # xlarge: billions of matmul weights
    r = _cli('--model-size', 'small', '--steps', '10')
    assert r.returncode == 2 and '--model-size needs --seq-len' in r.stderr


def test_calculator_imports_without_torch():
    out = subprocess.run([sys.executable, '-c', 'import sys, legalnb.calculator; print("torch" in sys.modules)'],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == 'False'


def test_calibration_from_trainer_metrics_records():
    from legalnb.calculator import calibration_from_metrics
    recs = [dict(step=10, step_ms=900.0, mfu=0.21), dict(step=20, step_ms=400.0, mfu=0.40),
            dict(step=30, step_ms=420.0, mfu=0.38), dict(step=35, step_ms=380.0, mfu=0.42)]
    cal = calibration_from_metrics(recs)
    assert cal.warmup == 10 and cal.sec_per_step == pytest.approx((10 * 0.4 + 10 * 0.42 + 5 * 0.38) / 25)
    assert cal.mfu == pytest.approx((10 * 0.40 + 10 * 0.38 + 5 * 0.42) / 25)
    assert cal.predict(1000) == pytest.approx(1000 * cal.sec_per_step)
    assert calibration_from_metrics([dict(step=5, step_ms=10.0), dict(step=10, step_ms=12.0)]).mfu is None  # CPU: no MFU
    with pytest.raises(LegalnbError, match='must increase'): calibration_from_metrics([recs[1], recs[0], recs[2]])
    with pytest.raises(LegalnbError, match='need more than skip=1'): calibration_from_metrics(recs[:1])


def test_estimate_of_inf_params_is_refused_not_printed():
    "Today `--params inf` printed 'inf h, MFU nan%' and exited 0."
    r = _cli('--steps', '100', '--seq-len', '1024', '--params', 'inf', '--gpu', 'h100-sxm', '--tokens-per-sec', '1000')
    assert r.returncode == 2 and r.stdout == '' and 'inf' in r.stderr and 'nan' not in r.stderr
    with pytest.raises(LegalnbError, match='params must be a number > 0, got inf'): Plan(params=float('inf'))
    with pytest.raises(LegalnbError, match='overflow'): estimate(Plan(examples=10**400, sec_per_step=1))


def test_help_lists_every_flag_it_had():
    flags = json.load(open(__import__('pathlib').Path(__file__).parent/'fixtures'/'cli_flags.json'))['estimate']
    r = _cli('--help')
    assert r.returncode == 0 and all(f in r.stdout for f in flags), r.stdout


def test_one_home_for_numbers_durations_and_precision():
    "The calculator's own parse_count, duration and resolve_precision are gone: core's (and machine's) are the only ones."
    for gone in ('duration', '_int_count', 'estimate_parser', 'plan_from_args', '_SUFFIX'):
        assert not hasattr(calculator, gone), gone
    assert calculator.parse_count is core.parse_count and calculator.format_duration is core.format_duration
    assert 'parse_count' not in calculator.__all__


def test_durations_below_an_hour_print_in_minutes_or_seconds():
    e = estimate(Plan(examples=1000, micro_batch=8, sec_per_step=3.4, price_per_hour=2.5, claimed_hours=1))
    table = e.table()
    assert 'time         7.1 min' in table and '0.1 h' not in table and '0.0 h' not in table
    assert e.lines[-1] == 'cost = 1 GPU × 7.1 min at 2.50/GPU-h = 0.30'
    assert e.warnings[0].startswith('claimed 60.0 min, but time = 125 steps × 3.4 s = 425 s = 7.1 min')
    assert str(compare(42.0, 50.0)) == 'predicted 42 s, measured 50 s: 16.0% under'


def test_epochs_replace_a_presets_steps():
    r = _cli('--preset', 'lora/fast', '--examples', '6400', '--epochs', '2', '--json')
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)['steps'] == 400


def test_fsdp_memory_per_gpu_by_hand_against_ddp():
    # 7B parameters, 32 layers, 8 GPUs: FSDP shards 16 B/param over 8 and gathers one layer (8 B × 7B ÷ 32)
    fsdp = estimate_memory(Plan(params=7e9, layers=32, gpu='h100-sxm', gpus=8, strategy='fsdp'))
    assert (fsdp.weights, fsdp.grads, fsdp.optimizer, fsdp.gathered) == (3.5e9, 3.5e9, 7e9, 1.75e9)
    assert fsdp.total == 15.75e9 and fsdp.fits
    assert 'gathered    8 B × 7B ÷ 32 layers' in '\n'.join(fsdp.lines)
    assert 'grads       4 B × 7B ÷ 8 GPUs (fsdp)' in fsdp.lines[1]
    ddp = estimate_memory(Plan(params=7e9, layers=32, gpu='h100-sxm', gpus=8, strategy='ddp'))
    assert ddp.total == 16 * 7e9 and ddp.gathered == 0 and not ddp.fits
    # activations are per GPU whatever the strategy: the same in both
    p = dict(params=125e6, layers=12, d_model=768, seq_len=1024, micro_batch=8, vocab=32_000, gpus=4)
    a, b = estimate_memory(Plan(**p, strategy='fsdp')), estimate_memory(Plan(**p, strategy='ddp'))
    assert a.activations == b.activations and b.total - a.total == pytest.approx(16 * 125e6 * 3 / 4 - 8 * 125e6 / 12)
    r = _cli('--params', '7B', '--layers', '32', '--gpus', '8', '--strategy', 'fsdp', '--steps', '1', '--json')
    assert r.returncode == 0 and json.loads(r.stdout)['memory_gib'] == pytest.approx(15.75e9 / GIB)


def test_estimate_model_gpt_from_the_registry(capsys):
    from legalnb.calculator import model_plan_fields
    from legalnb.gpt import config_for as gpt_config
    def flops(*args):
        assert main(['estimate', *args, '--seq-len', '1024', '--steps', '100', '--json']) == 0
        return json.loads(capsys.readouterr().out)['flops']
    f, c = model_plan_fields('small', 1024, model='gpt'), gpt_config('small', 32768, max_seq_len=1024)
    assert f['params'] == c.matmul_params() and f['layers'] == c.num_layers and f['d_model'] == c.dim
    assert f['mixing_flops_per_token'] == c.flops_per_token(1024) - c.matmul_flops_per_token()
    gpt = flops('--model', 'gpt', '--model-size', 'small')
    assert gpt == (6 * f['params'] + f['mixing_flops_per_token']) * 100 * 1024
    assert flops('--model-size', 'small') != gpt   # the default model is another architecture
    bad = _cli('--model', 'bert', '--model-size', 'small', '--seq-len', '1024', '--steps', '1')
    assert bad.returncode == 2 and "--model: unknown model 'bert'; choose from resonance, gpt" in bad.stderr


# issue 16: batches that mean what the presets say, QLoRA, and memory and time checked against measurement

def test_lora_plans_count_examples_with_the_presets_one_rule():
    "A LoRA batch counts examples, packed or not: the calculator's steps are presets.lora_steps, the trainer's rule."
    from legalnb import presets
    from legalnb.presets import get_preset, lora_steps
    assert calculator.lora_steps is presets.lora_steps
    for name, n, ep in (('fast', 63_000, 1), ('full', 63_000, 1), ('aggressive', 1_000, 2.5), ('fast', 10, 1)):
        e = estimate(plan_for('lora', name, examples=n, epochs=ep))
        assert e.steps == lora_steps(get_preset('lora', name), n, ep) and e.sequences == int(n * ep)
    e = estimate(plan_for('lora', 'fast', examples=63_000, seq_len=300))
    assert e.steps == 1969 and e.tokens == 63_000 * 300
    assert 'steps = ceil(1 × 63,000 examples ÷ 32 examples per step) = 1,969' in e.lines[0]
    assert 'batch        32 examples = 1 micro × 32 accumulation × 1 GPU' in e.table()
    cpt = estimate(plan_for('cpt', 'fast', params=7e9))   # CPT batches are tokens: rows × seq_len
    assert 'batch        128 rows × 3,072 tokens = 393k tokens' in cpt.table()
    with pytest.raises(LegalnbError, match='a LoRA plan counts examples'): estimate(plan_for('lora', 'fast', tokens=10**6,
                                                                                            seq_len=100))


def test_lora_presets_are_costed_as_lora():
    "`--preset lora/*` without --lora-params: forward 2·N + input gradients 2·N = 4·N per token, no weight gradients."
    e = estimate(plan_for('lora', 'fast', examples=63_000, seq_len=512, params=7e9, gpu='h100-sxm', mfu=0.4))
    assert e.flops == 4 * 7e9 * 63_000 * 512 and 'FLOPs = 4·N·D = 4 × 7B' in e.lines[-1]
    m = e.memory   # the frozen base only, adapters said to be missing, not the 16 B/param of full training
    assert m.total == 2 * 7e9 and 'not counted (--lora-params)' in '\n'.join(m.lines)
    with_adapters = estimate(plan_for('lora', 'fast', examples=63_000, seq_len=512, params=7e9, lora_params=16e6))
    assert with_adapters.flops == (4 * 7e9 + 6 * 16e6) * 63_000 * 512
    r = _cli('--preset', 'lora/fast', '--examples', '63000', '--seq-len', '512', '--params', '7B', '--gpu', 'h100-sxm',
             '--mfu', '40', '--json')
    assert r.returncode == 0 and json.loads(r.stdout)['flops'] == 4 * 7e9 * 63_000 * 512


def test_qlora_fits_the_2080_ti_where_lora_does_not():
    "An 8B model, LoRA, 11 GB card: NF4 base (0.516 B/param) with fp32 embeddings and head fits; 16-bit does not."
    llama8b = dict(params=8.03e9, lora_params=42e6, layers=32, d_model=4096, vocab=128_256, seq_len=1024,
                   examples=63_000, checkpointing=True, gpu='rtx-2080-ti')
    lora = estimate(plan_for('lora', 'fast', **llama8b))
    qlora = estimate(plan_for('lora', 'fast', qlora=True, **llama8b))
    assert lora.memory.fits is False and qlora.memory.fits is True
    assert any('--qlora' in w for w in lora.warnings) and not any('does not fit' in w for w in qlora.warnings)
    nf4 = (4 + 8 / 64 + 32 / (64 * 256)) / 8           # QLoRA §3: NF4 + double-quantised constants
    emb = 2 * 128_256 * 4096                           # embeddings and head: unquantised, fp32 after prepare_model_...
    assert qlora.memory.weights == pytest.approx(nf4 * (8.03e9 - emb) + 4 * emb + 4 * 42e6)
    assert (qlora.memory.grads, qlora.memory.optimizer) == (4 * 42e6, 8 * 42e6)
    assert qlora.memory.total / GIB == pytest.approx(8.81, abs=0.01) and lora.memory.total / GIB > 16
    r = _cli('--preset', 'lora/fast', '--params', '8.03B', '--lora-params', '42M', '--layers', '32', '--d-model', '4096',
             '--vocab', '128256', '--seq-len', '1024', '--examples', '63000', '--checkpointing', '--gpu', 'rtx-2080-ti',
             '--qlora', '--json')
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)['fits'] is True
    with pytest.raises(LegalnbError, match='qlora'): Plan(params=8e9, qlora=True)   # full training has no frozen base
    r = _cli('--preset', 'lora/fast', '--params', '8.03B', '--lora-params', '42M', '--layers', '32', '--d-model', '4096',
             '--vocab', '128256', '--seq-len', '1024', '--examples', '63000', '--checkpointing', '--gpu', 'rtx-2080-ti',
             '--qlora', '--qlora-bits', '8', '--json')
    assert r.returncode == 0 and json.loads(r.stdout)['fits'] is False   # LLM.int8: 1 B per weight is too much for 11 GB


def test_activation_bytes_are_the_measured_hf_llama_figure():
    "Bytes autograd keeps per token per unit of width per layer in a tiny transformers Llama: 45.6 in bf16, not 34."
    torch = pytest.importorskip('torch')
    from transformers import LlamaConfig, LlamaForCausalLM
    def saved_bytes(dtype, layers=2, width=1024, seq=32):
        cfg = LlamaConfig(hidden_size=width, intermediate_size=width * 11008 // 4096, num_attention_heads=width // 128,
                          num_key_value_heads=width // 128, num_hidden_layers=layers, vocab_size=64,
                          attn_implementation='sdpa')
        torch.manual_seed(0); model = LlamaForCausalLM(cfg).to(dtype).train()
        weights, kept = {p.untyped_storage().data_ptr() for p in model.parameters()}, {}
        def pack(t):
            if t.untyped_storage().data_ptr() not in weights:
                kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        x = model.model.embed_tokens(torch.randint(0, 64, (1, seq))).detach().requires_grad_()
        pos = torch.arange(seq)[None]; rope = model.model.rotary_emb(x, pos)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for layer in model.model.layers:
                x = layer(x, position_embeddings=rope, position_ids=pos)
                x = x[0] if isinstance(x, tuple) else x
        return sum(kept.values()) / (seq * width * layers)
    bf16 = saved_bytes(torch.bfloat16)
    assert bf16 == pytest.approx(calculator.ACTIVATION_BYTES[2], abs=0.25)   # 45.5 + shared RoPE tables and scalars
    assert saved_bytes(torch.float32) == pytest.approx(calculator.ACTIVATION_BYTES[4], abs=0.6)
    m = estimate_memory(Plan(params=7e9, layers=32, d_model=4096, seq_len=4096, gpu='h100-sxm'))
    assert m.activations == pytest.approx(32 * 45.6 * 4096 * 4096) and '32 × 45.6 B' in '\n'.join(m.lines)


def test_zero3_memory_matches_deepspeeds_own_estimate():
    "deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs, no offload: 4·largest + 18·N/GPUs."
    def deepspeed(total, largest, gpus): return 4 * largest + int(18 * total / gpus)
    z3 = estimate_memory(Plan(params=6.738e9, layers=32, gpus=4, strategy='deepspeed-zero3', gpu='h100-sxm'))
    assert round(z3.total / GIB, 1) == 29.0 and z3.total == pytest.approx(deepspeed(6.738e9, 6.738e9 / 32, 4))
    assert '2 B bf16 copy' in z3.lines[0] and z3.gathered == 4 * 6.738e9 / 32
    for n, layers, gpus in ((7e9, 32, 8), (70e9, 80, 64), (1.3e9, 24, 2)):
        m = estimate_memory(Plan(params=n, layers=layers, gpus=gpus, strategy='deepspeed-zero3', precision='bf16'))
        assert m.total == pytest.approx(deepspeed(n, n / layers, gpus))
    fp32 = estimate_memory(Plan(params=7e9, layers=32, gpus=4, strategy='deepspeed-zero3', precision='fp32'))
    assert fp32.total == 16 * 7e9 / 4 + 8 * 7e9 / 32   # no 16-bit copy when the run computes in fp32
    r = _cli('--params', '6.738B', '--layers', '32', '--gpus', '4', '--strategy', 'deepspeed-zero3', '--gpu', 'h100-sxm',
             '--steps', '1', '--json')
    assert r.returncode == 0 and round(json.loads(r.stdout)['memory_gib'], 1) == 29.0


def test_attention_flops_at_long_sequence_lengths():
    "A transformer given by its shape pays 12·layers·seq·d per token for attention (PaLM, appendix B), not 6·N alone."
    p = dict(params=7e9, layers=32, d_model=4096, steps=100, micro_batch=1)
    for seq in (2048, 32_768):
        e = estimate(Plan(**p, seq_len=seq))
        assert e.flops == (6 * 7e9 + 12 * 32 * seq * 4096) * 100 * seq
    long = estimate(Plan(**p, seq_len=32_768, gpu='h100-sxm', mfu=0.4))
    assert long.flops > 2.2 * 6 * 7e9 * long.tokens and '12 × 32 × 32,768 × 4,096' in long.lines[-1]
    assert estimate(Plan(**p, seq_len=2048, mixing_flops_per_token=0)).flops == 6 * 7e9 * 100 * 2048
    lora = estimate(Plan(**p, seq_len=2048, task='lora'))   # no weight gradients, but attention's backward stays
    assert lora.flops == (4 * 7e9 + 12 * 32 * 2048 * 4096) * 100 * 2048
    r = _cli('--params', '7B', '--layers', '32', '--d-model', '4096', '--seq-len', '32768', '--steps', '10', '--json')
    assert json.loads(r.stdout)['flops'] == (6 * 7e9 + 12 * 32 * 32_768 * 4096) * 10 * 32_768


def test_no_hours_formatted_outside_the_one_duration_formatter():
    "Durations below an hour print in minutes or seconds: no module formats hours itself, and no table says '0.0 h'."
    import re
    from pathlib import Path
    pkg = Path(calculator.__file__).parent
    for f in sorted(pkg.glob('*.py')):
        if f.name in ('core.py', '_modidx.py'): continue
        hits = re.findall(r"/ *3600[^\n]*:\.\d+f\}|:\.\d+f\} ?h\b", f.read_text(encoding='utf-8'))
        assert not hits, (f.name, hits)
    for plan in (Plan(steps=10, sec_per_step=0.5, price_per_hour=2.0),
                 plan_for('lora', 'fast', examples=320, seq_len=256, params=125e6, gpu='h100-sxm', mfu=0.4,
                          price_per_hour=2.0, claimed_hours=1)):
        text = estimate(plan).table()
        assert not re.search(r'\b0\.\d h\b', text), text


def test_a_batch_schedule_is_priced_by_its_micro_batches(capsys):
    "The guide's progressive batch from the command line: 72,000 micro-batches, not 2,000 × 64; time in proportion."
    assert main(['estimate', '--steps', '2000', '--batch-size', '1', '--batch-schedule', '0:64,500:32,1500:16',
                 '--seq-len', '1024', '--sec-per-step', '30', '--json']) == 0
    j = json.loads(capsys.readouterr().out)
    assert (j['steps'], j['sequences'], j['tokens'], j['seconds']) == (2000, 72_000, 72_000 * 1024, 72_000 * 30 / 64)
    assert j['batch_schedule'] == '0:64,500:32,1500:16' and j['global_batch'] == 64
    assert any('micro-batches = 500 × 64 + 1,000 × 32 + 500 × 16' in l for l in j['lines'])
    # by epochs: the fewest steps whose micro-batches cover the data; on 2 GPUs each micro-batch is 2 sequences
    e = estimate(Plan(examples=1000, micro_batch=1, gpus=2, batch_schedule='0:8,10:4', seq_len=16))
    assert (e.steps, e.sequences) == (10 + 105, 2 * (80 + 420))
    assert main(['estimate', '--steps', '10', '--batch-schedule', '3:4', '--seq-len', '8']) == 2
    assert "batch_schedule '3:4': the first pair must start at step 0" in capsys.readouterr().err
