"""Widgets, headless: the preset picker driven by setting values and clicking, the live plot fed by a real run."""
import io, math

import numpy as np
import pytest

from legalnb.core import LegalnbError, format_duration
from legalnb.presets import get_preset
from legalnb.widgets import LiveLossPlot, PresetPicker, plot_metrics


def test_picker_estimate_follows_every_widget():
    p = PresetPicker(task='lora', preset='full', gpu='h100-sxm', examples=63_000, seq_len=1536, mfu_pct=40)
    # LoRA full: accumulation 16, one GPU, micro-batch 1 -> ceil(63,000 / 16) optimizer steps
    assert p.estimate.steps == math.ceil(63_000 / 16) == 3938
    p.preset.value = 'fast'
    assert p.estimate.steps == math.ceil(63_000 / 32) == 1969
    hours = p.estimate.hours
    p.mfu.value = 20                      # half the utilisation: twice the time
    assert p.estimate.hours == pytest.approx(2 * hours, rel=1e-9)
    p.gpus.value = 2                      # same tokens, more GPUs (the default): same steps, half the time
    assert p.estimate.steps == 1969 and p.estimate.plan.grad_accum == 16
    assert p.estimate.hours == pytest.approx(hours, rel=1e-9)   # MFU 20% on 2 GPUs = 40% on one
    p.scaling.value = 'batch'             # same per-GPU batch: twice the examples per step, half the steps
    assert p.estimate.steps == math.ceil(63_000 / 64)


def test_picker_task_change_brings_the_preset_gpus():
    p = PresetPicker(task='lora', preset='fast')
    assert p.gpus.value == 1
    p.task.value = 'cpt'
    assert p.gpus.value == get_preset('cpt', 'fast').gpus == 4 and p.estimate.steps == 12_000


def test_picker_button_hands_back_training_arguments(tmp_path):
    p = PresetPicker(task='cpt', preset='fast'); p.out = str(tmp_path/'run')
    p.button.click()
    args = p.result
    assert type(args).__name__ == 'TrainingArguments'
    assert args.learning_rate == get_preset('cpt', 'fast').lr and args.max_steps == 12_000


def test_live_plot_on_a_real_training_run(tmp_path):
    from legalnb.train import TrainConfig, train
    data = tmp_path/'split'
    rng = np.random.default_rng(0)
    for side, rows in (('train', 64), ('val', 8)):
        (data/side).mkdir(parents=True)
        np.save(data/side/'shard_00000.npy', rng.integers(0, 50, size=(rows, 17)).astype(np.uint16))
    cfg = TrainConfig(data=str(data), out=str(tmp_path/'run'), dim=16, num_layers=1, num_frequencies=4, vocab_size=50,
                      batch_size=4, max_steps=6, log_every=1, eval_every=3, eval_batches=1, save_every=100,
                      warmup_steps=1, num_workers=0, progress=False, device='cpu')
    out = io.StringIO()
    plot = LiveLossPlot(max_steps=6, mode='text', file=out)
    train(cfg, callbacks=[plot])
    lines = out.getvalue().splitlines()
    assert plot.steps == [1, 2, 3, 4, 5, 6] and all(math.isfinite(l) for l in plot.losses)
    assert len(plot.val_losses) >= 2 and sum(l.startswith('step ') and '/6' in l for l in lines) == 6
    replay = plot_metrics(tmp_path/'run'/'metrics.jsonl')   # the run's own metrics file draws the same curve
    assert replay.steps == plot.steps and replay.losses == pytest.approx(plot.losses)


def test_picker_prints_a_short_run_in_minutes_not_hours():
    "Today a run of minutes showed as '0.1 h' in the picker's headline."
    p = PresetPicker(task='lora', preset='fast', params_b=1.0, examples=63_000, seq_len=512)
    head = p.output.value.split('<pre>')[0]
    assert p.estimate.seconds < 3600 and format_duration(p.estimate.seconds) in head and ' h,' not in head
    assert ('min' in head or ' s,' in head) and '0.0 h' not in p.output.value


def test_live_plot_refuses_an_unknown_mode():
    with pytest.raises(LegalnbError, match="mode must be 'auto', 'plot', 'text' or 'quiet', got 'bogus'"):
        LiveLossPlot(mode='bogus')


def test_picker_model_choice_from_the_registry():
    from legalnb.calculator import estimate, model_plan_fields, plan_for
    from legalnb.models import MODELS
    from legalnb.train import TrainConfig
    p = PresetPicker(task='scratch', preset='fast', model='gpt', size='small', gpu='h100-sxm', mfu_pct=40)
    assert list(p.model.options) == list(MODELS) and list(p.size.options) == list(MODELS['gpt'].sizes)
    want = estimate(plan_for('scratch', 'fast', size='small', gpu='h100-sxm', gpus=1, price_per_hour=2.5, mfu=0.4,
                             **model_plan_fields('small', 1024, model='gpt')))
    assert p.estimate.flops == want.flops and p.estimate.memory.total == want.memory.total
    p.button.click()
    assert isinstance(p.result, TrainConfig)
    assert (p.result.model, p.result.size, p.result.preset) == ('gpt', 'small', 'fast')
    p.model.value = 'resonance'   # its own presets: long context, sized from the model
    long = get_preset('scratch', 'fast', 'small', model='resonance')
    want = estimate(plan_for('scratch', 'fast', steps=long.steps, seq_len=8192, micro_batch=long.micro_batch,
                             grad_accum=long.grad_accum, gpu='h100-sxm', gpus=1, price_per_hour=2.5, mfu=0.4,
                             **model_plan_fields('small', 8192)))
    assert (p.estimate.steps, p.estimate.tokens, p.estimate.flops) == (long.steps, long.total_tokens, want.flops)
    p.button.click()
    assert (p.result.batch_tokens, p.result.seq_warmup_steps, p.result.max_steps) == (262_144, long.seq_warmup_steps,
                                                                                      long.steps)


@pytest.mark.parametrize('name,length', [('fast', 8192), ('full', 32768), ('aggressive', 8192)])
def test_picker_shows_the_long_context_presets_with_their_warm_up(name, length):
    p = PresetPicker(task='scratch', preset=name, model='resonance', size='medium')
    want = get_preset('scratch', name, 'medium', model='resonance')
    assert p.chosen() == want and p.estimate.plan.seq_len == length and p.estimate.steps == want.steps
    assert p.estimate.tokens == want.total_tokens and p.estimate.plan.global_batch * length == want.batch_tokens
    head = p.output.value.split('<pre>')[0]
    assert f'{length:,}-token rows, {want.batch_tokens:,} tokens per step' in head
    assert f'rows warm up from 1,024 tokens (doubling) over the first {want.seq_warmup_steps:,} steps' in head
    p.size.value = 'large'
    assert p.estimate.steps == get_preset('scratch', name, 'large', model='resonance').steps > want.steps


def fields_shown(p) -> list[str]:
    return [n for n in ('params', 'examples', 'seq_len', 'model', 'size') if getattr(p, n).layout.display != 'none']


def test_picker_fields_follow_the_task():
    p = PresetPicker(task='cpt')
    assert fields_shown(p) == ['params']
    p.task.value = 'lora'
    assert fields_shown(p) == ['params', 'examples', 'seq_len']
    p.task.value = 'scratch'
    assert fields_shown(p) == ['model', 'size']


def test_picker_more_gpus_two_readings():
    "cpt/fast is sized for 4 GPUs; on 8 the default keeps the tokens (time halves), 'batch' keeps each GPU's batch."
    p = PresetPicker(task='cpt', preset='fast')
    four = p.estimate
    assert 'as the preset was sized' in p.headline
    p.gpus.value = 8
    assert (p.estimate.tokens, p.estimate.cost) == (four.tokens, pytest.approx(four.cost))
    assert p.estimate.seconds == pytest.approx(four.seconds / 2) and 'same tokens, more GPUs (shown)' in p.headline
    p.scaling.value = 'batch'
    assert p.estimate.tokens == 2 * four.tokens and p.estimate.seconds == pytest.approx(four.seconds)
    assert p.estimate.cost == pytest.approx(2 * four.cost) and 'same per-GPU batch (shown)' in p.headline
    assert 'the run feeds 2× the data' in p.headline
    with pytest.raises(LegalnbError, match="scaling must be 'tokens' or 'batch', got 'faster'"):
        PresetPicker(scaling='faster')


def test_picker_refuses_what_does_not_fit_without_a_price():
    "Today MFU 80% on an RTX 2080 Ti printed '1,421.2 h, $28,423' next to 'does NOT fit'."
    p = PresetPicker(task='cpt', preset='full', mfu_pct=80, gpu='rtx-2080-ti')
    assert p.estimate is None and p.error.startswith('does not fit: ') and 'GiB usable' in p.error
    assert p.headline.startswith('cpt/full on 4 × NVIDIA GeForce RTX 2080 Ti: refused: does not fit')
    assert '$' not in p.output.value and ' h,' not in p.headline and '<pre>' not in p.output.value
    assert [t.get_text() for t in p.figure().axes[0].texts].count(' refused') == 3
    p.gpu.value = 'h100-sxm'              # the same plan on H100s fits and is priced
    assert p.estimate is not None and p.error is None and '$' in p.headline


def test_picker_headline_is_text_and_the_output_html_renders_it():
    p = PresetPicker(task='lora', preset='fast', params_b=1.0, examples=63_000, seq_len=512)
    assert '<' not in p.headline and p.output.value.startswith('<b>lora/fast on 1 × NVIDIA H100 SXM5 80GB: ')
    assert format_duration(p.estimate.seconds) in p.headline.splitlines()[0]


def test_picker_plot_follows_the_gpu_in_the_unit_that_fits():
    p = PresetPicker(task='cpt', preset='fast')
    before = p.plot.value
    ax = p.figure().axes[0]
    assert before[:8] == b'\x89PNG\r\n\x1a\n' and ax.get_xlabel() == 'time (d)'
    assert [t.get_text() for t in ax.get_yticklabels()] == ['fast', 'full', 'aggressive']
    assert format_duration(p.estimate.seconds) in [t.get_text() for t in ax.texts]
    p.gpu.value = 'a100-80gb'
    assert p.plot.value != before and p.figure()._suptitle.get_text() == 'cpt presets on 4 × ' + p.plan().gpu.name
    small = PresetPicker(task='lora', preset='fast', params_b=1.0, examples=6_300, seq_len=512)
    assert small.figure().axes[0].get_xlabel() in ('time (min)', 'time (s)')


def test_picker_button_shows_what_it_made(tmp_path):
    p = PresetPicker(task='scratch', preset='fast', model='gpt', size='small'); p.out = str(tmp_path/'run')
    assert p.made.value == ''
    p.button.click()
    summary, code = p.explain()
    assert summary.startswith('TrainConfig: gpt small, preset fast, ') and summary in p.made.value
    assert 'train(cfg)' in code and '--model gpt --size small --preset fast' in code
    p.task.value = 'cpt'
    p.button.click()
    assert p.made.value.startswith('<b>TrainingArguments: 12,000 steps, 2 per device × 16 accumulation × 4 GPU(s)')
    assert 'torchrun --standalone --nproc_per_node=4 -m legalnb.cli finetune' in p.made.value
    p.gpus.value = 8                      # same tokens: half the accumulation per process, as the estimate
    p.button.click()
    assert p.result.gradient_accumulation_steps == p.estimate.plan.grad_accum == 8
    p.task.value = 'scratch'
    p.gpus.value = 2                      # same tokens: the 1k preset's accumulation halves, as the estimate shows
    p.button.click()
    gpt = get_preset('scratch', 'fast', 'small', model='gpt')
    assert (p.result.grad_accum, p.result.max_steps) == (gpt.grad_accum // 2, gpt.steps) == (
        p.estimate.plan.grad_accum, p.estimate.steps)
    assert 'torchrun --nproc_per_node=2' in p.made.value
    p.model.value, p.scaling.value = 'resonance', 'batch'   # batch in tokens: each GPU keeps its rows, twice per step
    p.button.click()
    assert p.result.batch_tokens == 2 * get_preset('scratch', 'fast', 'small', model='resonance').batch_tokens
