"""End-to-end, CLI, failure and multi-process tests of the transformers + peft path (legalnb.hf), on tiny models."""
import json, os, re, subprocess, sys
from pathlib import Path

import numpy as np
import pytest
import torch

from legalnb.cli import main as cli
from legalnb.hf import (LoraSettings, PackedCollator, TINY_ARCHS, add_lora, build_tiny_model, demo_examples, encode_example,
                        encode_examples, load_hf_model, lora_target_modules, merge_adapter, pack_examples, packs_without_leakage,
                        right_size_length, sft_dataset, tiny_config, training_args_from_preset, write_demo_shards,
                        write_launch_configs)
from legalnb import core, hf, machine
from legalnb.core import LegalnbError
from legalnb.sources import write_jsonl

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='module')
def work(tmp_path_factory):
    "A tiny Llama-style model with a locally trained tokenizer, an SFT JSONL file and a shard folder."
    d = tmp_path_factory.mktemp('hf')
    model_dir = build_tiny_model(d/'model', 'llama')
    _, tok = load_hf_model(model_dir)
    write_jsonl(demo_examples(40), d/'sft.jsonl')
    write_demo_shards(d/'corpus', tok)
    return d


def _losses(run: Path) -> list[float]:
    return json.loads((run/'finetune.json').read_text())['losses']


def test_prompt_tokens_carry_label_minus_100(work):
    _, tok = load_hf_model(work/'model')
    enc = encode_example(tok, {'prompt': 'Who acts under Article 9?', 'response': 'The Council.'})
    trained = [t for t in enc['labels'] if t != -100]
    k = len(enc['input_ids']) - len(trained)
    assert k > 5 and enc['labels'][:k] == [-100] * k and enc['labels'][k:] == enc['input_ids'][k:]
    assert tok.decode(trained) == 'The Council.\n</s>'
    chat = {'messages': [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Article 9?'},
                         {'role': 'assistant', 'content': 'The Council.'}, {'role': 'user', 'content': 'And 10?'},
                         {'role': 'assistant', 'content': 'The Agency.'}]}
    trained = tok.decode([t for t in encode_example(tok, chat)['labels'] if t != -100])
    assert trained == 'The Council.\nThe Agency.\n</s>', 'only assistant replies are trained on'


def test_right_sized_length_on_a_hand_made_set():
    assert (right_size_length([12, 700, 1481, 64]).max_length, right_size_length([1481]).truncated) == (1536, 0)
    choice = right_size_length([100] * 95 + [300, 400, 500, 900, 1481], percentile=95)
    assert (choice.max_length, choice.truncated, choice.longest) == (128, 5, 1481)
    assert right_size_length([1481, 3000], cap=2048).max_length == 2048


def test_truncated_examples_are_reported_and_cut(work):
    _, tok = load_hf_model(work/'model')
    exs = demo_examples(6) + [{'prompt': 'word ' * 300, 'response': 'ok'}]
    items, choice = encode_examples(tok, exs, percentile=50)
    assert choice.truncated >= 1 and max(len(i['input_ids']) for i in items) == choice.max_length


def test_packed_batches_hold_no_padding_and_keep_examples_apart(work):
    model, tok = load_hf_model(work/'model')
    items, choice = encode_examples(tok, demo_examples(12))
    rows, collate, how = sft_dataset(items, choice.max_length, tok, model)
    assert how == 'padding-free' and len(rows) < len(items)
    flat = PackedCollator(tok.pad_token_id, flatten=True)(rows[:2])   # the flash-attention layout: one row, no padding
    assert flat['input_ids'].shape == (1, sum(len(r['input_ids']) for r in rows[:2])) and (flat['input_ids'] != tok.pad_token_id).all()
    batch = collate(rows[:2])   # sdpa here: rows stacked, pad only after the last example of a row
    for r, ids in zip(rows[:2], batch['input_ids']):
        n = len(r['input_ids'])
        assert (ids[:n] != tok.pad_token_id).all() and (ids[n:] == tok.pad_token_id).all()
    assert (batch['labels'][batch['input_ids'] == tok.pad_token_id] == -100).all()
    assert sum(len(r['input_ids']) for r in rows) == sum(len(i['input_ids']) for i in items)
    # each packed example sees only itself: its logits equal those of the example alone
    model.eval()
    row = pack_examples(items[:3], 512)[0]
    b = PackedCollator()([row])
    with torch.no_grad():
        packed = model(input_ids=b['input_ids'], position_ids=b['position_ids'], use_cache=False).logits[0]
        start = 0
        for ex in sorted(items[:3], key=lambda e: -len(e['input_ids'])):   # pack order: longest first
            n = len(ex['input_ids'])
            alone = model(input_ids=torch.tensor([ex['input_ids']]), use_cache=False).logits[0]
            assert torch.allclose(packed[start:start + n], alone, atol=1e-4)
            start += n
    assert packs_without_leakage(model)


def test_packing_refuses_an_example_longer_than_the_row(work):
    with pytest.raises(LegalnbError, match='example 1: 10 tokens, longer than max_length 8'):
        pack_examples([{'input_ids': [1] * 3, 'labels': [1] * 3}, {'input_ids': [1] * 10, 'labels': [1] * 10}], 8)


def test_padded_fallback_pads_with_minus_100(work):
    model, tok = load_hf_model(work/'model')
    items, choice = encode_examples(tok, demo_examples(6))
    data, collate, how = sft_dataset(items, choice.max_length, tok, model, packing=False)
    b = collate(data[:3])
    assert how == 'length-grouped' and b['input_ids'].shape[1] % 8 == 0
    assert (b['labels'][b['attention_mask'] == 0] == -100).all()


@pytest.mark.parametrize('arch,attention,all_', [
    ('llama', ['k_proj', 'o_proj', 'q_proj', 'v_proj'], ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj']),
    ('mistral', ['k_proj', 'o_proj', 'q_proj', 'v_proj'], ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj']),
    ('qwen2', ['k_proj', 'o_proj', 'q_proj', 'v_proj'], ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj']),
    ('gpt2', ['attn.c_proj', 'c_attn'], ['c_attn', 'c_fc', 'c_proj'])])
def test_lora_targets_per_family(arch, attention, all_):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_config(tiny_config(arch, 64))
    assert lora_target_modules(m, 'attention') == attention and lora_target_modules(m) == all_
    peft = add_lora(m, LoraSettings(r=2, alpha=4))
    assert any('lora_A' in n for n, _ in peft.named_parameters())
    wrapped = {n for n, _ in add_lora(AutoModelForCausalLM.from_config(tiny_config(arch, 64)),
                                      LoraSettings(r=2, alpha=4, scope='attention')).named_modules() if n.endswith('lora_A')}
    assert wrapped and not any('mlp' in n for n in wrapped), 'the attention scope wraps attention layers only'
    assert arch in TINY_ARCHS


def test_lora_adapter_saves_reloads_and_merges_to_the_same_outputs(work, tmp_path):
    from peft import PeftModel
    model, tok = load_hf_model(work/'model')
    peft = add_lora(model, LoraSettings(r=4, alpha=8, dropout=0.0))
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if 'lora_B' in n: p.normal_(0, 0.3)
    peft.save_pretrained(tmp_path/'adapter')
    x = torch.tensor([tok('Article 3: the Agency shall notify the decision.').input_ids])
    peft.eval()
    with torch.no_grad():
        want = peft(x).logits
        base = load_hf_model(work/'model')[0]
        reloaded = PeftModel.from_pretrained(base, tmp_path/'adapter').eval()(x).logits
        merged = merge_adapter(work/'model', tmp_path/'adapter', tmp_path/'merged')(x).logits
        from_disk = load_hf_model(tmp_path/'merged')[0](x).logits
    assert torch.allclose(reloaded, want, atol=1e-5) and torch.allclose(merged, want, atol=1e-4)
    assert torch.allclose(from_disk, merged, atol=1e-5)
    assert not torch.allclose(load_hf_model(work/'model')[0](x).logits, want, atol=1e-3)
    with pytest.raises(LegalnbError, match='no adapter_config.json'): merge_adapter(work/'model', tmp_path)


def test_each_accelerate_config_parses(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser
    paths = write_launch_configs(tmp_path, gpus_per_node=4, nodes=2, layer_cls='Qwen2DecoderLayer')
    known = vars(launch_command_parser().parse_args(['train.py']))
    want = {'ddp': 'MULTI_GPU', 'fsdp': 'FSDP', 'deepspeed-zero3': 'DEEPSPEED'}
    for strategy, kind in want.items():
        cfg = load_config_from_file(str(paths[strategy]))
        assert cfg.distributed_type.value == kind and cfg.num_processes == 8 and cfg.num_machines == 2
        for key in {**cfg.fsdp_config, **cfg.deepspeed_config}:
            assert key in known, f'{strategy}: {key} is not an accelerate launch setting'
    # accelerate launch's own validation merges each file into its launch arguments
    from accelerate.commands.launch import _validate_launch_command
    for strategy, flag in (('ddp', 'multi_gpu'), ('fsdp', 'use_fsdp'), ('deepspeed-zero3', 'use_deepspeed')):
        args = _validate_launch_command(launch_command_parser().parse_args(['--config_file', str(paths[strategy]), 'train.py']))[0]
        assert getattr(args, flag) and args.num_processes == 8
        assert args.mixed_precision == ('no' if strategy == 'deepspeed-zero3' else 'bf16'), 'the DeepSpeed JSON sets it'
        if strategy == 'fsdp': assert int(args.fsdp_version) == 2 and args.fsdp_transformer_layer_cls_to_wrap == 'Qwen2DecoderLayer'
        if strategy == 'deepspeed-zero3': assert Path(args.deepspeed_config_file) == paths['ds_zero3.json'].resolve()
    ds = json.loads(paths['ds_zero3.json'].read_text())
    assert ds['zero_optimization']['stage'] == 3 and ds['train_micro_batch_size_per_gpu'] == 'auto'
    cfg = load_config_from_file(str(paths['deepspeed-zero3']))
    assert Path(cfg.deepspeed_config['deepspeed_config_file']) == paths['ds_zero3.json'].resolve()


def test_training_args_from_preset_say_why(capsys, tmp_path):
    from dataclasses import replace
    from legalnb.presets import get_preset
    p = get_preset('cpt', 'full')
    args = training_args_from_preset(p, tmp_path, dataloader_num_workers=0)
    out = capsys.readouterr().out
    assert 'save_total_limit' in out and 'accumulation' in out and '#' in out
    assert args.gradient_accumulation_steps == 64 and args.max_steps == 40_000
    assert (args.save_steps, args.save_total_limit) == (2000, 3), "the workflow's every 2,000 steps, keeping 3"
    args = training_args_from_preset(p, tmp_path, verbose=False)
    assert args.dataloader_num_workers == min(4, machine.usable_cores()) and args.dataloader_prefetch_factor == 4
    assert args.bf16 == (torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (8, 0))
    assert training_args_from_preset(replace(p, precision='fp32'), tmp_path, verbose=False).bf16 is False


def test_cli_continued_pretraining_end_to_end(work, tmp_path, capsys):
    rc = cli(['finetune', '--model', str(work/'model'), '--data', str(work/'corpus'), '--preset', 'fast', '--out', str(tmp_path/'run'),
              '--max-steps', '10', '--lr', '1e-2', '--batch-size', '4', '--grad-accum', '1', '--warmup-steps', '1',
              '--workers', '0', '--logging-steps', '1', '--save-steps', '5', '--force-single'])
    assert rc == 0
    s = json.loads((tmp_path/'run'/'finetune.json').read_text())
    assert (s['task'], s['mode'], s['steps'], s['tokens']) == ('continued pretraining', 'full', 10, 10 * 4 * 64)
    l = s['losses']
    assert np.mean(l[-3:]) < np.mean(l[:3]) - 0.5, l
    assert (tmp_path/'run'/'final'/'model.safetensors').is_file() and (tmp_path/'run'/'checkpoint-10').is_dir()
    out = capsys.readouterr().out
    assert 'legalnb finetune: continued pretraining (full' in out
    assert s['doc_boundaries'] and s['batches'] == 'packed shards, positions restart at documents'
    assert s['eval'] == 'the last 6 rows' and len(s['eval_losses']) == 2, 'evaluated at each checkpoint'
    model, _ = load_hf_model(tmp_path/'run'/'final')
    assert type(model).__name__ == 'LlamaForCausalLM'


def test_cli_lora_sft_end_to_end(work, tmp_path):
    run = tmp_path/'sft'
    rc = cli(['finetune', '--model', str(work/'model'), '--data', str(work/'sft.jsonl'), '--preset', 'aggressive', '--lora',
              '--out', str(run), '--max-steps', '12', '--lr', '1e-2', '--batch-size', '4', '--grad-accum', '1',
              '--warmup-steps', '1', '--workers', '0', '--logging-steps', '1', '--lora-r', '8', '--lora-alpha', '16'])
    assert rc == 0
    s = json.loads((run/'finetune.json').read_text())
    assert (s['mode'], s['preset'], s['batches'], s['steps']) == ('lora', 'lora/aggressive', 'padding-free', 12)
    assert s['length']['max_length'] % 64 == 0 and s['length']['truncated'] == 0
    l = s['losses']
    assert np.mean(l[-3:]) < np.mean(l[:3]) - 0.2, l
    cfg = json.loads((run/'final'/'adapter_config.json').read_text())
    assert cfg['r'] == 8 and cfg['lora_alpha'] == 16
    merged = merge_adapter(work/'model', run/'final')
    assert type(merged).__name__ == 'LlamaForCausalLM'


def test_cli_bad_jsonl_is_one_line_and_exit_2(work, tmp_path, capsys):
    bad = tmp_path/'bad.jsonl'
    bad.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "a", "answer": "b"}\n')
    rc = cli(['finetune', '--model', str(work/'model'), '--data', str(bad), '--out', str(tmp_path/'x'), '--workers', '0'])
    err = capsys.readouterr().err
    assert rc == 2 and 'bad.jsonl, line 2' in err and len(err.strip().splitlines()) == 1
    rc = cli(['finetune', '--model', str(tmp_path), '--data', str(work/'sft.jsonl'), '--out', str(tmp_path/'x')])
    assert rc == 2 and 'no config.json' in capsys.readouterr().err


def test_two_cpu_processes_with_gloo(work, tmp_path):
    run = tmp_path/'ddp'
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': str(ROOT)}
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', '-m', 'legalnb.cli', 'finetune',
           '--model', str(work/'model'), '--data', str(work/'sft.jsonl'), '--out', str(run), '--max-steps', '3',
           '--batch-size', '2', '--grad-accum', '1', '--workers', '0', '--logging-steps', '1', '--lr', '1e-2']
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((run/'finetune.json').read_text())
    assert s['world_size'] == 2 and s['steps'] == 3 and (run/'final'/'adapter_model.safetensors').is_file()


def test_corpus_stage_to_continued_pretraining(work, tmp_path, capsys):
    "sample -> parse -> select -> build-corpus with the model's tokenizer -> finetune: the stages fit together."
    d, m = tmp_path, str(work/'model')
    assert cli(['sample', '--docs', '12', str(d/'raw')]) == 0
    assert cli(['parse', str(d/'raw'), '--out', str(d/'parsed.jsonl')]) == 0
    assert cli(['select', str(d/'parsed.jsonl'), '--out', str(d/'selected.jsonl'), '--target-tokens', '100000']) == 0
    assert cli(['build-corpus', str(d/'selected.jsonl'), '--out', str(d/'corpus'), '--tokenizer', m, '--seq-len', '64',
                '--shards', '2', '--no-progress', '--val-docs', '2', '--val-min-acts', '2']) == 0
    capsys.readouterr()
    assert cli(['finetune', '--model', m, '--data', str(d/'corpus'), '--out', str(d/'run'), '--max-steps', '2',
                '--batch-size', '2', '--grad-accum', '1', '--workers', '0', '--force-single']) == 0
    out = capsys.readouterr().out
    assert 'warning: the corpus' not in out and 'continued pretraining (full' in out
    s = json.loads((d/'run'/'finetune.json').read_text())
    assert s['tokens'] == 2 * 2 * 64 and s['doc_boundaries'], 'the corpus stage writes doc_starts/'
    assert s['eval'].endswith('rows of val/ (held-out acts)'), 'evaluated on the held-out acts'


def test_finetune_trains_on_a_splits_train_and_evaluates_on_its_val(work, tmp_path, capsys):
    "`legalnb split` then `legalnb finetune --data SPLIT` (issue 38): trains on train/'s rows, evaluates on val/'s."
    assert cli(['split', str(work/'corpus'), '--out', str(tmp_path/'split'), '--by', 'rows', '--val-ratio', '0.25']) == 0
    assert cli(['finetune', '--model', str(work/'model'), '--data', str(tmp_path/'split'), '--out', str(tmp_path/'run'),
                '--max-steps', '2', '--batch-size', '2', '--grad-accum', '1', '--workers', '0', '--save-steps', '2',
                '--force-single']) == 0
    s = json.loads((tmp_path/'run'/'finetune.json').read_text())
    split = json.loads((tmp_path/'split'/'split.json').read_text())
    assert (split['train']['rows'], split['val']['rows']) == (96, 32)
    assert (s['rows'], s['eval'], s['steps']) == (96, '32 rows of val/ (held out by legalnb split --by rows)', 2)
    assert s['doc_boundaries'] and len(s['eval_losses']) == 1, s


def test_corpus_with_a_bigger_vocabulary_is_refused(work, tmp_path, capsys):
    import shutil
    shutil.copytree(work/'corpus', tmp_path/'corpus')
    man = json.loads((tmp_path/'corpus'/'manifest.json').read_text())
    (tmp_path/'corpus'/'manifest.json').write_text(json.dumps({**man, 'vocab_size': 32000}))
    rc = cli(['finetune', '--model', str(work/'model'), '--data', str(tmp_path/'corpus'), '--out', str(tmp_path/'run'), '--workers', '0',
              '--force-single'])
    assert rc == 2 and '32000 token ids' in capsys.readouterr().err


def test_padded_fallback_trains_with_length_grouped_batches(work, tmp_path):
    from legalnb.hf import FinetuneConfig, finetune
    from dataclasses import replace
    from legalnb.presets import get_preset
    p = replace(get_preset('lora', 'fast'), steps=2, micro_batch=4, grad_accum=1, global_batch=4, warmup_steps=0)
    s = finetune(FinetuneConfig(model=work/'model', data=work/'sft.jsonl', out=tmp_path/'run', packing=False, workers=0), p)
    assert s['batches'] == 'length-grouped' and s['steps'] == 2 and len(s['losses']) >= 1


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob('*'))}


def _fails(argv, capsys, cwd: Path) -> str:
    "Run `legalnb finetune ARGV` in `cwd`: it must exit 2 with one stderr line and leave `cwd` as it was."
    before = _snapshot(cwd)
    old = os.getcwd(); os.chdir(cwd)
    try: rc = cli(['finetune', *map(str, argv)])
    finally: os.chdir(old)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and 'Traceback' not in err, err
    assert _snapshot(cwd) == before, 'a failed finetune changed or wrote files'
    return err


@pytest.fixture
def folder(work, tmp_path):
    "A working folder with the tiny model, the SFT file and the shards, copied."
    import shutil
    for name in ('model', 'sft.jsonl', 'corpus'):
        (shutil.copytree if (work/name).is_dir() else shutil.copy)(work/name, tmp_path/name)
    return tmp_path


@pytest.mark.parametrize('argv,expect', [
    (['--model', 'nope', '--data', 'sft.jsonl', '--out', 'run'], 'nope: not a model folder (no config.json)'),
    (['--model', 'model', '--data', 'nope.jsonl', '--out', 'run'], '--data nope.jsonl: no such file or folder'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'sft.jsonl'], '--out sft.jsonl is also an input'),
    (['--model', 'model', '--data', 'corpus', '--out', 'corpus'], '--out corpus is also an input'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'model'], '--out model is also an input'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', '.'], '--out . holds files legalnb did not write'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--lr', '-1e-3'], '--lr must be more than 0, got -0.001'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--max-steps', '0'], '--max-steps must be at least 1'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--seed', '-1'], '--seed must be at least 0'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--lora-dropout', '2'], '--lora-dropout must be'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--lora', '--full'], '--full: not allowed with argument --lora'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--preset', 'bogus'], "--preset: invalid choice: 'bogus'"),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--batch-size', 'eight'], "--batch-size: expected a whole number"),
    (['--data', 'sft.jsonl', '--out', 'run'], '--model is required'),
    (['--model', 'model', '--data', 'model', '--out', 'run'], 'model: no .npy or .pt files'),   # checked before loading
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--deepspeed', 'ds.json'], 'ds.json: not found'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--deepspeed', 'sft.jsonl'], 'sft.jsonl: not valid JSON'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', '/proc/legalnb-run'], '--out /proc/legalnb-run: cannot be written'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--resume'], '--resume: run holds no checkpoint-* folder'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--eval-share', '1'], '--eval-share must be at least 0 and below 1'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--eval-steps', '0'], '--eval-steps must be at least 1'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--attention', 'flash_attention_2'],
     '--attention flash_attention_2 needs a CUDA GPU and the flash-attn package'),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--attention', 'mystery'], "--attention: invalid choice: 'mystery'"),
    (['--model', 'model', '--data', 'corpus', '--out', 'run', '--batch-schedule', '0:4', '--grad-accum', '2'],
     '--batch-schedule and --grad-accum both set the accumulation: give one of them'),
    (['--model', 'model', '--data', 'corpus', '--out', 'run', '--batch-schedule', '3:4,9:2'],
     "--batch-schedule '3:4,9:2': the first pair must start at step 0"),
    (['--model', 'model', '--data', 'sft.jsonl', '--out', 'run', '--batch-schedule', '0:4', '--batch-lr-rule', 'cubic'],
     "--batch-lr-rule: invalid choice: 'cubic'"),
])
def test_finetune_bad_input_is_one_line_and_writes_nothing(folder, capsys, argv, expect):
    assert expect in _fails(argv, capsys, folder)


@pytest.mark.parametrize('file,data,expect', [
    ('model/config.json', b'{}', 'model/config.json: no "model_type"'),
    ('model/config.json', b'{oops', 'model/config.json: not valid JSON'),
    ('model/model.safetensors', b'garbage', 'model: the model could not be loaded'),
    ('model/tokenizer.json', b'{', 'model: the tokenizer could not be loaded'),
    ('sft.jsonl', b'{"prompt": "a", "prompt": "b", "response": "c"}\n', "sft.jsonl, line 1: duplicate key 'prompt'"),
    ('sft.jsonl', b'{"prompt": "a", "response": "b"}\n{oops\n', 'sft.jsonl, line 2: not JSON'),
    ('sft.jsonl', b'\xff\xfe\n', 'sft.jsonl, line 1: byte 1 is not UTF-8'),
])
def test_damaged_model_or_data_is_one_line(folder, capsys, file, data, expect):
    "Today a model folder without model_type, or with damaged weights, ended in a transformers traceback."
    (folder/file).write_bytes(data)
    assert expect in _fails(['--model', 'model', '--data', 'sft.jsonl', '--out', 'run'], capsys, folder)


def test_users_files_in_the_run_folder_are_refused_and_kept(folder, capsys):
    (folder/'run').mkdir(); (folder/'run'/'notes.txt').write_text('mine')
    err = _fails(['--model', 'model', '--data', 'sft.jsonl', '--out', 'run'], capsys, folder)
    assert '--out run holds files legalnb did not write (notes.txt)' in err
    assert (folder/'run'/'notes.txt').read_text() == 'mine'


def test_one_precision_rule_and_one_jsonl_reader():
    assert not hasattr(hf, 'hardware_precision') and 'hardware_precision' not in hf.__all__
    assert hf.resolve_precision is machine.resolve_precision and hf.jsonl_records is core.jsonl_records


def test_finetune_help_keeps_every_flag(capsys):
    flags = json.loads((ROOT/'tests'/'fixtures'/'cli_flags.json').read_text())['finetune']
    with pytest.raises(SystemExit) as e: cli(['finetune', '--help'])   # in this process: legalnb.cli's own parser
    out = capsys.readouterr().out
    assert e.value.code == 0 and all(f in out for f in flags), out


# ---- issue 16: the path that really runs -------------------------------------------------------------------------

def test_launch_configs_construct_accelerates_plugins_under_its_launch_environment(tmp_path):
    "Each config is turned into the environment `accelerate launch` sets, and accelerate's own plugin is built from it."
    import yaml
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
    from legalnb.hf import launch_environment, launch_flags, launch_plugin
    paths = write_launch_configs(tmp_path, gpus_per_node=4, layer_cls='Qwen2DecoderLayer')
    fsdp = launch_plugin(['--config_file', str(paths['fsdp'])])
    assert isinstance(fsdp, FullyShardedDataParallelPlugin) and fsdp.fsdp_version == 2
    assert fsdp.transformer_cls_names_to_wrap == ['Qwen2DecoderLayer']
    ds = launch_plugin(['--config_file', str(paths['deepspeed-zero3'])])
    assert isinstance(ds, DeepSpeedPlugin) and ds.zero_stage == 3 and ds.zero3_init_flag
    assert ds.hf_ds_config.config['zero_optimization']['stage3_gather_16bit_weights_on_model_save']
    assert launch_plugin(['--config_file', str(paths['ddp'])]) is None
    assert launch_environment(['--config_file', str(paths['ddp'])])['ACCELERATE_MIXED_PRECISION'] == 'bf16'
    # the old file, mixed_precision beside the JSON, fails in every process exactly so
    old = yaml.safe_load(paths['deepspeed-zero3'].read_text()) | {'mixed_precision': 'bf16'}
    (tmp_path/'old.yaml').write_text(yaml.safe_dump(old))
    with pytest.raises(ValueError, match='accelerate config variables will be ignored'):
        launch_plugin(['--config_file', str(tmp_path/'old.yaml')])
    # the flags a refusal prints build the same plugins, no file needed
    flags = lambda s: launch_flags(s, 4, 'bf16', 'LlamaDecoderLayer').split()
    assert launch_plugin(flags('deepspeed-zero3')).zero_stage == 3
    assert launch_plugin(flags('fsdp')).transformer_cls_names_to_wrap == ['LlamaDecoderLayer']
    assert launch_environment(flags('ddp'))['ACCELERATE_MIXED_PRECISION'] == 'bf16'


@pytest.mark.parametrize('strategy', ['ddp', 'fsdp'])
def test_multiprocess_accelerate_launch_of_the_config_trains_on_two_cpu_processes(work, tmp_path, strategy):
    "The multi-process test: `accelerate launch --config_file launch/STRATEGY.yaml` with 2 processes (gloo on the CPU)."
    cfg = write_launch_configs(tmp_path/'launch', gpus_per_node=2)[strategy]
    run = tmp_path/'run'
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': str(ROOT)}
    cmd = [sys.executable, '-m', 'accelerate.commands.launch', '--config_file', str(cfg), '-m', 'legalnb.cli', 'finetune',
           '--model', str(work/'model'), '--data', str(work/'sft.jsonl'), '--out', str(run), '--max-steps', '3',
           '--batch-size', '2', '--workers', '0', '--logging-steps', '1', '--lr', '1e-2']
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((run/'finetune.json').read_text())
    assert s['world_size'] == 2 and s['steps'] == 3 and (run/'final'/'adapter_model.safetensors').is_file()
    # accelerate 1.15 applies FSDP only to GPU process groups (state.py): on CPUs both configs train as MULTI_CPU (gloo);
    # the FSDP plugin those processes would build on GPUs is built in the test above
    assert s['distributed'] == 'MULTI_CPU', s['distributed']
    assert p.stdout.count('legalnb finetune:') == 1, 'one summary line, from rank 0'


def test_multi_gpu_preset_as_one_process_refuses_with_the_command(folder, capsys):
    from legalnb.hf import launch_plugin
    err = _fails(['--model', 'model', '--data', 'corpus', '--out', 'run', '--max-steps', '2'], capsys, folder)
    assert 'preset cpt/fast is sized for 4 GPUs (deepspeed-zero3) and this is one process' in err and '--force-single' in err
    cmd = err.split('run  accelerate launch ')[1].split('  (or add')[0]
    launch, script = cmd.split(' -m legalnb.cli finetune ')
    assert script == '--model model --data corpus --out run --max-steps 2', 'the same flags again'
    assert launch_plugin(launch.split()).zero_stage == 3, 'the printed command starts ZeRO-3'


def _changed_share(before: dict, after: dict) -> float:
    "Share of the entries of the 2-D weight matrices that differ."
    keys = [k for k, v in before.items() if v.ndim == 2]
    return sum((before[k].float() != after[k].float()).sum().item() for k in keys) / sum(before[k].numel() for k in keys)


def test_bf16_checkpoint_trains_with_fp32_master_weights(tmp_path):
    "Today 76% of the entries of a bf16 checkpoint did not change after 5 AdamW steps at lr 3e-5; fp32 masters change all."
    from safetensors.torch import load_file
    from legalnb.hf import FinetuneConfig, finetune
    from dataclasses import replace
    from legalnb.presets import get_preset
    m = build_tiny_model(tmp_path/'bf16', dtype=torch.bfloat16)
    _, tok = load_hf_model(m)
    write_demo_shards(tmp_path/'corpus', tok, rows=16)
    p = replace(get_preset('cpt', 'fast'), steps=5, lr=3e-5, micro_batch=2, grad_accum=1, gpus=1, global_batch=2,
                warmup_steps=0, strategy='single', seq_len=64)
    s = finetune(FinetuneConfig(model=m, data=tmp_path/'corpus', out=tmp_path/'run', workers=0, save_steps=100), p)
    assert s['steps'] == 5 and s['dtype'] == 'float32'
    before, after = load_file(m/'model.safetensors'), load_file(tmp_path/'run'/'final'/'model.safetensors')
    assert next(iter(before.values())).dtype == torch.bfloat16
    assert _changed_share(before, after) > 0.99


def test_truncation_cuts_the_prompt_and_keeps_the_response(work):
    "Today the four long examples lost every trained token (loss NaN on a batch of them)."
    from legalnb.hf import truncate_example
    model, tok = load_hf_model(work/'model')
    long = [{'prompt': 'word ' * 200, 'response': f'Under Article {i}, the Council shall decide.'} for i in range(4)]
    items, choice = encode_examples(tok, long + [{'prompt': 'Article 5?', 'response': 'The Agency.'}] * 4, max_length=32)
    assert choice.truncated == 4 and choice.response_cut == 0
    for it, ex in zip(items[:4], long):
        assert len(it['input_ids']) == 32 and it['input_ids'][0] == tok.bos_token_id
        assert tok.decode([t for t in it['labels'] if t != -100]) == ex['response'] + '\n</s>', 'the response whole'
    batch = PackedCollator(tok.pad_token_id, flatten=False)(pack_examples(items[:4], 32))
    with torch.no_grad(): loss = model(**batch, use_cache=False).loss
    assert torch.isfinite(loss)
    # a response longer than the row: a quarter of the row of prompt, then the response's start; counted
    enc = encode_example(tok, {'prompt': 'Who acts?', 'response': 'word ' * 100})
    cut, lost = truncate_example(enc, 40, tok.bos_token_id)
    assert lost and len(cut['input_ids']) == 40 and 0 < cut['labels'].count(-100) <= 1 + 39 // 4
    _, choice = encode_examples(tok, [{'prompt': 'Who acts?', 'response': 'word ' * 100}] + long, max_length=40)
    assert (choice.truncated, choice.response_cut) == (5, 1) and '1 of them with the response cut too' in str(choice)


def test_calculator_steps_equal_the_run_steps_on_a_packed_set(work, tmp_path, capsys):
    "lora/fast on a packed set: the run takes lora_steps(examples) optimizer steps of ~32 examples, as the calculator says."
    from legalnb.calculator import estimate, plan_for
    from legalnb.presets import get_preset, lora_steps, packed_accumulation
    from legalnb.hf import FinetuneConfig, finetune
    examples = demo_examples(80, seed=3)
    write_jsonl(examples, tmp_path/'sft.jsonl')
    s = finetune(FinetuneConfig(model=work/'model', data=tmp_path/'sft.jsonl', out=tmp_path/'run', preset='fast', workers=0,
                                logging_steps=1))
    p = get_preset('lora', 'fast')
    assert s['examples'] == 76 and s['examples_per_row'] > 1.5, 'packed'
    assert s['steps'] == estimate(plan_for('lora', 'fast', examples=s['examples'])).steps == lora_steps(p, 76) == 3
    assert s['grad_accum'] == packed_accumulation(p, s['examples_per_row']) == round(32 / s['examples_per_row'])
    assert 'accumulation' in capsys.readouterr().out


def test_cpt_positions_restart_at_documents_and_documents_do_not_leak(work):
    "Rows of several documents: position ids restart at each doc_starts/ entry; changing one document leaves another's logits."
    from legalnb.hf import CausalLMShards, doc_positions
    assert doc_positions(torch.tensor([True, False, False, True, False])).tolist() == [0, 1, 2, 0, 1]
    model, _ = load_hf_model(work/'model', attention='sdpa')
    model.eval()
    ds = CausalLMShards(work/'corpus')
    item = ds[3]
    pos = item['position_ids']
    starts = (pos == 0).nonzero().flatten().tolist()
    assert ds.boundaries and len(starts) >= 3 and starts[0] == 0
    a, b = starts[1], starts[2]   # the second document: [a, b)
    changed = item['input_ids'].clone(); changed[a:b] = (changed[a:b] + 7) % model.config.vocab_size
    with torch.no_grad():
        run = lambda ids, **kw: model(input_ids=ids[None], use_cache=False, **kw).logits[0]
        x, y = run(item['input_ids'], position_ids=pos[None]), run(changed, position_ids=pos[None])
        assert torch.allclose(x[:a], y[:a], atol=1e-5) and torch.allclose(x[b:], y[b:], atol=1e-5), 'no leak'
        assert not torch.allclose(x[a:b], y[a:b]), 'the changed document itself changes'
        plain = run(item['input_ids']), run(changed)   # today: one sequence, the next document sees the change
        assert not torch.allclose(plain[0][b:], plain[1][b:], atol=1e-3)


def test_end_token_is_not_doubled_by_a_template_that_ends_turns_with_it(work):
    import copy
    _, tok = load_hf_model(work/'model')
    t = copy.deepcopy(tok)
    t.chat_template = "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>{% endfor %}"
    enc = encode_example(t, {'prompt': 'Article 5?', 'response': 'The Agency.'})
    assert enc['input_ids'][-1] == tok.eos_token_id and enc['input_ids'][-2] != tok.eos_token_id
    assert t.decode([x for x in enc['labels'] if x != -100]).endswith('The Agency.</s>')


def test_warmup_is_capped_at_a_tenth_of_the_run(work, tmp_path, capsys):
    "Today --max-steps 10 --lr 1e-3 kept the preset's 300 warm-up steps and never passed 3.3e-5."
    assert cli(['finetune', '--model', str(work/'model'), '--data', str(work/'corpus'), '--out', str(tmp_path/'run'),
                '--max-steps', '10', '--lr', '1e-3', '--batch-size', '2', '--grad-accum', '1', '--workers', '0',
                '--logging-steps', '1', '--force-single', '--eval-share', '0']) == 0
    out = capsys.readouterr().out
    assert 'capped: 300 warm-up steps (--warmup-steps or the preset) are more than 10% of the 10 steps' in out
    from legalnb.metrics import read_metrics
    lrs = [r['lr'] for r in read_metrics(tmp_path/'run'/'metrics.jsonl')]
    assert max(lrs) == pytest.approx(1e-3) and json.loads((tmp_path/'run'/'finetune.json').read_text())['warmup_steps'] == 1


def test_resume_evaluation_and_metrics_in_the_native_format(work, tmp_path, capsys):
    "A run stopped after its step-3 checkpoint resumes there; metrics.jsonl feeds calibration and the loss plot."
    import shutil
    from legalnb.calculator import calibration_from_metrics
    from legalnb.metrics import read_metrics
    from legalnb.widgets import plot_metrics
    run = tmp_path/'run'
    argv = ['finetune', '--model', str(work/'model'), '--data', str(work/'sft.jsonl'), '--out', str(run), '--max-steps', '6',
            '--batch-size', '2', '--workers', '0', '--logging-steps', '1', '--save-steps', '3', '--lr', '1e-2']
    assert cli(argv) == 0
    full = read_metrics(run/'metrics.jsonl')
    shutil.rmtree(run/'checkpoint-6'); shutil.rmtree(run/'final')   # as if it stopped after step 3's checkpoint
    with pytest.raises(LegalnbError, match='holds no checkpoint'):
        hf.finetune(hf.FinetuneConfig(model=work/'model', data=work/'sft.jsonl', out=tmp_path/'fresh', resume=True))
    assert cli(argv + ['--resume']) == 0
    s = json.loads((run/'finetune.json').read_text())
    assert s['resumed_from'] == 'checkpoint-3' and s['steps'] == 6 and s['eval_examples'] == 2
    steps = read_metrics(run/'metrics.jsonl')
    assert [r['step'] for r in steps] == [1, 2, 3, 4, 5, 6], 'no step twice after the resume'
    assert all(k in steps[0] for k in ('loss', 'lr', 'step_ms', 'tokens', 'tokens_per_sec', 'grad_norm'))
    assert [r['loss'] for r in steps[:3]] == [r['loss'] for r in full[:3]]
    evals = read_metrics(run/'metrics.jsonl', 'eval')
    assert [r['step'] for r in evals] == [3, 6] and all(r['val_loss'] > 0 for r in evals)
    assert calibration_from_metrics(steps).sec_per_step > 0
    plot = plot_metrics(run/'metrics.jsonl')
    assert plot.steps == [1, 2, 3, 4, 5, 6] and plot.val_steps == [3, 6]


def test_attention_backend_is_a_choice_and_qlora_says_what_it_needs(work, tmp_path, capsys):
    from legalnb.hf import FinetuneConfig, finetune
    from dataclasses import replace
    from legalnb.presets import get_preset
    p = replace(get_preset('lora', 'fast'), steps=1, micro_batch=2, grad_accum=1, global_batch=2)
    s = finetune(FinetuneConfig(model=work/'model', data=work/'sft.jsonl', out=tmp_path/'eager', attention='eager', workers=0), p)
    assert s['attention'] == 'eager' and s['batches'] == 'padding-free' and s['steps'] == 1
    with pytest.raises(LegalnbError, match='drop --full'):
        finetune(FinetuneConfig(model=work/'model', data=work/'sft.jsonl', out=tmp_path/'q', lora=False, qlora=True), p)
    assert not (tmp_path/'q').exists()


def test_qlora_trains_an_adapter_on_4bit_base_weights(work, tmp_path):
    "bitsandbytes >= 0.48 runs NF4 weights on the CPU too: QLoRA end to end on the tiny model (48- and 24-wide layers)."
    from legalnb.hf import FinetuneConfig, finetune, qlora_unavailable
    from dataclasses import replace
    from legalnb.presets import get_preset
    p = replace(get_preset('lora', 'fast'), steps=3, lr=1e-2, micro_batch=2, grad_accum=1, global_batch=2)
    if (why := qlora_unavailable()) is not None:   # a platform without it: one line, nothing written
        with pytest.raises(LegalnbError, match=f'--qlora: {why}'): finetune(FinetuneConfig(model=work/'model', data=work/'sft.jsonl', out=tmp_path/'q', qlora=True), p)
        assert not (tmp_path/'q').exists()
        pytest.skip(why)
    s = finetune(FinetuneConfig(model=work/'model', data=work/'sft.jsonl', out=tmp_path/'q', qlora=True, workers=0,
                                logging_steps=1, save_steps=1), p)
    assert s['qlora'] and s['steps'] == 3 and all(np.isfinite(s['losses']))
    assert len(s['eval_losses']) == 3 and all(np.isfinite(s['eval_losses'])), 'evaluated (and trained on) after each step'
    cfg = json.loads((tmp_path/'q'/'final'/'adapter_config.json').read_text())
    assert cfg['r'] == 16 and (tmp_path/'q'/'final'/'adapter_model.safetensors').is_file()


def test_a_sink_can_stop_a_finetune_run_at_a_checkpoint_and_resume_finishes_it(work, tmp_path):
    "A budget guard's should_stop(record): the run stops after that log with a checkpoint; --resume ends where an unbroken run does."
    from legalnb.hf import FinetuneConfig, finetune
    from legalnb.metrics import metric_lines
    from dataclasses import replace
    from legalnb.presets import get_preset
    p = replace(get_preset('lora', 'fast'), steps=6, micro_batch=2, grad_accum=1, global_batch=2)

    class StopAt:   # a real sink, as legalnb.run's BudgetGuard: asked after each log interval
        def __init__(self, step): self.step, self.seen = step, []
        def should_stop(self, r):
            self.seen.append((r['step'], r['max_steps'], r['elapsed_s'] > 0))
            return f"step {r['step']} reached" if r['step'] >= self.step else None

    guard, run = StopAt(3), tmp_path/'run'
    s = finetune(FinetuneConfig(model=work/'model', data=work/'sft.jsonl', out=run, workers=0, logging_steps=1,
                                save_steps=100), p, sinks=[guard])
    assert s['stopped'] == 'step 3 reached' and s['step'] == 3 and s['max_steps'] == 6
    assert guard.seen == [(1, 6, True), (2, 6, True), (3, 6, True)]
    assert Path(s['checkpoint']).name == 'checkpoint-3' and not (run/'final').exists()
    events = [r['event'] for _, r in metric_lines(run/'metrics.jsonl')]
    assert events == ['step'] * 3 + ['stop']
    done = finetune(FinetuneConfig(model=work/'model', data=work/'sft.jsonl', out=run, resume=True, workers=0,
                                   logging_steps=1, save_steps=100), p)
    assert 'stopped' not in done and done['steps'] == 6 and (run/'final'/'adapter_model.safetensors').is_file()
    assert [r['step'] for _, r in metric_lines(run/'metrics.jsonl') if r['event'] == 'step'] == [1, 2, 3, 4, 5, 6]


def test_lora_on_an_8bit_base_trains_and_bad_bits_are_refused(work, tmp_path):
    "qlora_bits=8 loads the frozen base with LLM.int8 (bitsandbytes' Linear8bitLt) and trains the adapter."
    from legalnb.hf import FinetuneConfig, finetune, qlora_unavailable
    from dataclasses import replace
    from legalnb.presets import get_preset
    p = replace(get_preset('lora', 'fast'), steps=2, lr=1e-2, micro_batch=2, grad_accum=1, global_batch=2)
    with pytest.raises(LegalnbError, match='--qlora-bits must be 4 or 8, got 3'):
        finetune(FinetuneConfig(model=work/'model', data=work/'sft.jsonl', out=tmp_path/'q3', qlora=True, qlora_bits=3), p)
    assert not (tmp_path/'q3').exists()
    if (why := qlora_unavailable()) is not None: pytest.skip(why)
    s = finetune(FinetuneConfig(model=work/'model', data=work/'sft.jsonl', out=tmp_path/'q8', qlora=True, qlora_bits=8,
                                workers=0, logging_steps=1), p)
    assert s['qlora_bits'] == 8 and s['steps'] == 2 and all(np.isfinite(s['losses']))
    assert (tmp_path/'q8'/'final'/'adapter_model.safetensors').is_file()


def test_cpt_steps_carry_the_presets_tokens_whatever_the_corpus_row_length(work, tmp_path):
    "A preset of 4 sequences of 128 tokens per step on a corpus of 64-token rows: 8 rows per step, not 4."
    from legalnb.hf import FinetuneConfig, finetune
    from dataclasses import replace
    from legalnb.presets import get_preset
    p = replace(get_preset('cpt', 'fast'), steps=2, micro_batch=2, grad_accum=2, gpus=1, global_batch=4, seq_len=128,
                strategy='single', warmup_steps=0)
    s = finetune(FinetuneConfig(model=work/'model', data=work/'corpus', out=tmp_path/'run', workers=0, eval_share=0), p)
    assert s['grad_accum'] == 4 and s['tokens'] == 2 * 4 * 128


@pytest.mark.parametrize('data,extra', [('corpus', ['--max-steps', '6', '--batch-lr-rule', 'linear']),
                                        ('sft.jsonl', ['--no-packing'])])
def test_batch_schedule_resumed_after_the_changes_equals_the_unbroken_run(folder, capsys, data, extra):
    "Continued pretraining (full) and LoRA SFT (one pass, padded, adapter dropout) with accumulation 4, 2, then 1: "
    "the rows per step follow the schedule, the lr its rule, and a run resumed after both changes ends bit-identical."
    import shutil
    from safetensors.torch import load_file
    from legalnb.metrics import read_metrics
    args = ['finetune', '--model', str(folder/'model'), '--data', str(folder/data), '--batch-schedule', '0:4,2:2,4:1',
            '--batch-size', '2', '--save-steps', '2', '--logging-steps', '1', '--workers', '0', '--lr', '1e-2',
            '--warmup-steps', '0', '--force-single', *extra]
    a, b = folder/'a', folder/'b'
    assert cli(args + ['--out', str(a)]) == 0
    s = json.loads((a/'finetune.json').read_text())
    recs = read_metrics(a/'metrics.jsonl')
    accum = [4, 4, 2, 2] + [1] * (s['steps'] - 4)
    assert s['grad_accum'] == 4, "the summary's accumulation is the schedule's first"
    cosine = [0.5 * (1 + np.cos(np.pi * k / s['steps'])) for k in range(s['steps'])]
    if data == 'corpus':   # rows of 64 tokens, 2 per micro-batch; the linear rule: lr x accumulation / 4
        assert s['steps'] == 6 and np.diff([0] + [r['tokens'] for r in recs]).tolist() == [n * 2 * 64 for n in accum]
        assert np.allclose([r['lr'] / 1e-2 for r in recs], [c * n / 4 for c, n in zip(cosine, accum)])
    else:   # one pass over 38 examples (2 held out), 2 per micro-batch: 19 micro-batches = 4+4+2+2 + 7 x 1
        assert s['steps'] == 11 and s['batch_schedule'] == '0:4,2:2,4:1' and s['batch_lr_rule'] == 'sqrt'
        assert np.allclose([r['lr'] / 1e-2 for r in recs], [c * (n / 4) ** 0.5 for c, n in zip(cosine, accum)])
    kept = sorted(int(c.name.split('-')[1]) for c in a.glob('checkpoint-*'))
    start = min(k for k in kept if k >= 4)   # after both changes (the newest 3 checkpoints are kept)
    shutil.copytree(a, b, ignore=shutil.ignore_patterns('final', 'finetune.json'))
    for c in b.glob('checkpoint-*'):
        if int(c.name.split('-')[1]) > start: shutil.rmtree(c)
    capsys.readouterr()
    assert cli([x if x != '0:4,2:2,4:1' else '0:4,2:2' for x in args] + ['--out', str(b), '--resume']) == 2
    assert 'was trained with --batch-schedule 0:4,2:2,4:1' in capsys.readouterr().err
    assert cli(args + ['--out', str(b), '--resume']) == 0
    assert json.loads((b/'finetune.json').read_text())['resumed_from'] == f'checkpoint-{start}'
    name = 'model.safetensors' if data == 'corpus' else 'adapter_model.safetensors'
    wa, wb = load_file(a/'final'/name), load_file(b/'final'/name)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_batch_schedule_on_two_cpu_processes_under_ddp_and_deepspeed_zero3(work, tmp_path):
    "The multi-process ZeRO-3 test, against DDP. Each process takes its share of every scheduled step; DeepSpeed "
    "steps once per step (accelerate's boundary flag), so ZeRO-3 ends where DDP does, a full step of accumulation 2 "
    "included; the weights load sharded and the final ones gather into a loadable model."
    pytest.importorskip('deepspeed')
    from safetensors.torch import load_file
    cfg = write_launch_configs(tmp_path/'launch', gpus_per_node=2)['deepspeed-zero3']
    # tests/cpu_deepspeed: DeepSpeed's CPU-only shared-memory inference all-reduce is not compiled (~80 CPU-s of g++)
    env = {**os.environ, 'OMP_NUM_THREADS': '1',
           'PYTHONPATH': os.pathsep.join([str(ROOT/'tests'/'cpu_deepspeed'), str(ROOT)])}
    flags = ['-m', 'legalnb.cli', 'finetune', '--model', str(work/'model'), '--data', str(work/'sft.jsonl'), '--full',
             '--max-steps', '3', '--batch-size', '1', '--workers', '0', '--logging-steps', '1', '--lr', '1e-2',
             '--save-steps', '3', '--warmup-steps', '0', '--batch-schedule', '0:2,2:1']
    launch = {'ddp': [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2'],
              'zero3': [sys.executable, '-m', 'accelerate.commands.launch', '--config_file', str(cfg)]}
    runs = {}
    for name, cmd in launch.items():
        p = subprocess.run(cmd + flags + ['--out', str(tmp_path/name)], env=env, capture_output=True, text=True,
                           timeout=400)
        assert p.returncode == 0, p.stderr[-3000:]
        runs[name] = json.loads((tmp_path/name/'finetune.json').read_text())
    assert [(r['world_size'], r['steps']) for r in runs.values()] == [(2, 3), (2, 3)]
    assert runs['ddp']['tokens'] == runs['zero3']['tokens'] and runs['zero3']['distributed'] == 'DEEPSPEED'
    z = runs['zero3']   # the TrainingArguments exist before the weights load, so they load sharded
    assert z['mode'] == 'full' and z['zero3_sharded_at_load'], 'from_pretrained ran under deepspeed.zero.Init'
    assert z['batches'] == 'padding-free', 'packing is kept under ZeRO-3'
    model, _ = load_hf_model(tmp_path/'zero3'/'final')
    assert type(model).__name__ == 'LlamaForCausalLM', 'the 16-bit weights were gathered into a loadable model'
    a, b = (load_file(tmp_path/name/'final'/'model.safetensors') for name in launch)
    init = load_file(work/'model'/'model.safetensors')
    moved = max((a[k].float() - init[k].float()).abs().max().item() for k in a)
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) < 1e-4 < moved / 10


# ---- issue 48: within the open-file limit ------------------------------------------------------------------------

def test_a_large_accumulation_with_workers_stays_within_the_open_file_limit(work, tmp_path):
    "150 micro-batches a step from 2 workers under `ulimit -n 256`: the Trainer would hold ~450 shared-memory "
    "descriptors ('Too many open files'); finetune loads in the main process instead and says so in one line."
    import resource
    write_jsonl(demo_examples(160), tmp_path/'sft.jsonl')
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))   # the child's soft limit only
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': str(ROOT)}
    cmd = [sys.executable, '-m', 'legalnb.cli', 'finetune', '--model', str(work/'model'), '--data', str(tmp_path/'sft.jsonl'),
           '--out', str(tmp_path/'run'), '--max-steps', '1', '--batch-size', '1', '--grad-accum', '150', '--workers', '2',
           '--save-steps', '100']
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert p.returncode == 0 and 'Too many open files' not in p.stderr, p.stderr[-3000:]
    assert ('--workers 2: a step of 150 micro-batches from worker processes keeps about 856 files open, over this '
            "process's limit of 256 (ulimit -n): data is loaded in the main process (--workers 0)") in p.stdout
    assert json.loads((tmp_path/'run'/'finetune.json').read_text())['steps'] == 1


def test_finetune_says_the_tokens_a_step_trains_and_never_runs_a_step_at_lr_0(work, tmp_path, capsys):
    "CPT with --batch-size 1 --grad-accum 2 and --warmup-steps 2 capped to 1 of 12 steps: the printed step size is "
    "the tokens trained per step (num_input_tokens_seen), the first step trains at the peak, not at 0."
    from legalnb.hf import FinetuneConfig, finetune
    from legalnb.metrics import metric_lines
    s = finetune(FinetuneConfig(model=work/'model', data=work/'corpus', out=tmp_path/'run', max_steps=12, batch_size=1,
                                grad_accum=2, warmup_steps=2, lr=1e-3, workers=0, logging_steps=1, eval_share=0,
                                force_single=True))
    out = capsys.readouterr().out
    per_step = s['tokens'] // s['steps']
    assert s['steps'] == 12 and f'so a step sees {per_step:,} tokens' in out, (per_step, out)
    assert "the preset's 2 warm-up steps" not in out and 'capped: 2 warm-up steps (--warmup-steps or' in out, out
    for name, value in (('max_steps', '12'), ('learning_rate', '0.001'), ('per_device_train_batch_size', '1')):
        assert re.search(rf'{name} += {value} +# from a flag', out), (name, out)   # the user's, not the preset's
    lrs = [r['lr'] for _, r in metric_lines(tmp_path/'run'/'metrics.jsonl') if r['event'] == 'step']
    assert lrs[0] == pytest.approx(1e-3) and min(lrs) > 0, lrs   # one warm-up step: (0 + 1) / 1 of the peak


def test_a_wsd_finetune_stopped_by_max_cost_ends_at_the_floor_and_resumes_exactly(work, tmp_path, capsys):
    "--schedule wsd under legalnb run's budget guard: the decay moves inside the budget, the run stops there at a "
    "tenth of the peak, annealed; --resume from the checkpoint at the move takes the same steps to the same weights."
    import shutil
    from safetensors.torch import load_file
    from legalnb.hf import FinetuneConfig, finetune
    from legalnb.metrics import metric_lines
    from legalnb.run import BudgetGuard
    flags = dict(model=work/'model', data=work/'corpus', max_steps=8, batch_size=1, grad_accum=1, warmup_steps=0,
                 lr=1e-3, workers=0, logging_steps=1, save_steps=1, eval_share=0, schedule='wsd', decay_ratio=0.25,
                 force_single=True)
    a = tmp_path/'a'
    s = finetune(FinetuneConfig(**flags, out=a), sinks=[BudgetGuard(max_cost=1e-6, price=3.6e6)])
    err = capsys.readouterr().err
    assert err.count('the learning rate now decays from step 2 to end the run annealed at step 3 of 8') == 1, err
    assert s['step'] == 3 and 'annealed' in s['stopped'] and Path(s['checkpoint']).name == 'checkpoint-3', s
    lrs = [r['lr'] for _, r in metric_lines(a/'metrics.jsonl') if r['event'] == 'step']
    assert lrs == [pytest.approx(1e-3), pytest.approx(1e-3), pytest.approx(1e-4)], lrs   # the last step at the floor
    b = tmp_path/'b'; shutil.copytree(a, b); shutil.rmtree(b/'checkpoint-3')
    again = finetune(FinetuneConfig(**flags, out=b, resume=True))   # no guard: scheduler.pt holds the moved decay
    assert again['step'] == 3 and 'annealed' in again['stopped'], again
    wa, wb = (load_file(r/'checkpoint-3'/'model.safetensors') for r in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa), 'resumed inside the moved decay: the same weights'
