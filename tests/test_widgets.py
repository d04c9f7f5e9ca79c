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
    p.gpus.value = 2                      # twice the GPUs: half the steps
    assert p.estimate.steps == math.ceil(63_000 / 64)


def test_picker_task_change_brings_the_preset_gpus():
    p = PresetPicker(task='lora', preset='fast')
    assert p.gpus.value == 1
    p.task.value = 'cpt'
    assert p.gpus.value == get_preset('cpt', 'fast').gpus == 4 and p.estimate.steps == 12_000


def test_picker_button_hands_back_training_arguments(tmp_path):
    p = PresetPicker(task='cpt', preset='fast', out=str(tmp_path/'run'))
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
