"""End-to-end tests of the ResonanceNet language model: causality, sizes, precision, checkpointing, save/load,
generation, document resets (the leakage probe) and recurrent generation against the FFT path."""
import json, math, subprocess, sys

import pytest
import torch

from legalnb.core import LegalnbError
from legalnb.gpt import document_leakage
from legalnb.resonance import (MODEL_SIZES, ResonanceConfig, ResonanceLanguageModel, causal_fft_conv,
                               causality_violation, config_for, document_fft_conv, document_positions, fft_size)

TINY = dict(vocab_size=97, dim=24, num_layers=2, num_frequencies=6, max_seq_len=600)


def tiny(**kw) -> ResonanceLanguageModel:
    "A small model; its recall branches' gates (0 at initialisation: the branch then adds nothing) drawn at random, "
    "so that every check here runs through the branch too."
    torch.manual_seed(kw.pop('seed', 0))
    m = ResonanceLanguageModel(ResonanceConfig(**{**TINY, **kw}))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith('recall_gate'): p.normal_()
    return m


@pytest.mark.parametrize('L,t', [(2, 0), (5, 2), (63, 31), (64, 10), (65, 64), (211, 100), (513, 1)])
def test_causality_float64(L, t):
    change, grad = causality_violation(tiny().double().eval(), L, t, seed=L)
    assert change < 1e-10 and grad < 1e-10, (change, grad)


def test_causality_float32_and_future_does_change():
    m = tiny().eval()
    change, grad = causality_violation(m, 300, 149)
    assert change < 1e-5 and grad < 1e-6
    # the test can fail: positions after t do react to tokens after t
    a = torch.randint(0, 97, (1, 300)); b = a.clone(); b[:, 200] = (b[:, 200] + 1) % 97
    with torch.no_grad(): d = (m(a) - m(b)).abs().amax(-1)[0]
    assert d[:200].max() < 1e-6 and d[200] > 1e-2 and d[200:].min() > 1e-6, 'the change is felt from position 200 on, also far after'


def test_circular_fft_would_fail_the_test():
    "A non-causal variant (single FFT at length L) must be caught by causality_violation."
    import legalnb.resonance as R
    orig = R.causal_fft_conv
    def circular(u, h):
        L = u.shape[-1]
        return torch.fft.irfft(torch.fft.rfft(u.to(h.dtype)) * torch.fft.rfft(h), n=L)
    R.causal_fft_conv = circular
    try:
        change, grad = causality_violation(tiny().double().eval(), 50, 20)
    finally: R.causal_fft_conv = orig
    assert change > 1e-6 and grad > 1e-6


def test_fft_conv_matches_direct_sum_odd_lengths():
    torch.manual_seed(1)
    for L in (1, 3, 100, 257):
        u, h = torch.randn(2, 3, L, dtype=torch.float64), torch.randn(3, L, dtype=torch.float64)
        ref = torch.stack([(h[:, :t + 1].flip(-1) * u[..., :t + 1]).sum(-1) for t in range(L)], -1)
        assert torch.allclose(causal_fft_conv(u, h), ref, atol=1e-10)
        assert fft_size(L) >= 2 * L and fft_size(L) & (fft_size(L) - 1) == 0


def test_shapes_loss_and_ignore_index():
    m = tiny()
    ids, tg = torch.randint(0, 97, (2, 3, 40))
    assert m(ids).shape == (3, 40, 97)
    logits, loss = m(ids, tg)
    tg2 = tg.clone(); tg2[:, :20] = -100
    _, loss2 = m(ids, tg2)
    ref = torch.nn.functional.cross_entropy(logits[:, 20:].reshape(-1, 97), tg[:, 20:].reshape(-1))
    assert torch.allclose(loss2, ref, atol=1e-6) and not torch.allclose(loss, loss2)
    with pytest.raises(LegalnbError, match='exceeds max_seq_len=600'): m(torch.zeros(1, 601, dtype=torch.long))


def test_sizes_param_counts_on_meta():
    counts = {}
    for name, shape in MODEL_SIZES.items():
        c = config_for(name, 32768)
        with torch.device('meta'): m = ResonanceLanguageModel(c)
        D, K, n = c.dim, c.num_frequencies, c.num_layers
        per_block = 12 * D * D + 4 * K * D + 3 * D * c.short_conv + 3 * D + D + 4 * D
        Fq = c.feature_dim   # block 0's recall branch: q, k of width F (projection, short conv and bias) and a gate
        branch = 2 * Fq * D + 2 * Fq * c.short_conv + 2 * Fq + D
        assert c.recall_layers == (0,) and m.num_params(non_embedding=True) == n * per_block + branch + 2 * D
        assert m.num_params() == m.num_params(non_embedding=True) + (32768 + c.max_seq_len) * D
        assert c.flops_per_token(32768) > c.matmul_flops_per_token() == 6 * (n * 12 * D * D + 2 * Fq * D + 32768 * D)
        counts[name] = m.num_params(non_embedding=True)
    assert counts['small'] < counts['medium'] < counts['large'] < counts['xlarge']
    assert (MODEL_SIZES['medium']['dim'], MODEL_SIZES['medium']['num_frequencies'], MODEL_SIZES['medium']['num_layers']) == (1024, 128, 12)
    with pytest.raises(LegalnbError, match='unknown model size'): config_for('tiny', 100)


def test_config_validation_names_field():
    with pytest.raises(LegalnbError, match='num_frequencies must be an integer >= 1, got 0'):
        ResonanceConfig(vocab_size=10, num_frequencies=0)
    with pytest.raises(LegalnbError, match='dropout'): ResonanceConfig(vocab_size=10, dropout=1.5)


def test_tied_weights_and_save_load(tmp_path):
    m = tiny()
    assert m.lm_head.weight is m.tok_emb.weight
    with torch.no_grad(): m.tok_emb.weight[0, 0] = 3.25  # a change in the embedding is a change in the head
    assert m.lm_head.weight[0, 0].item() == 3.25
    m.save(tmp_path / 'ck')
    assert json.loads((tmp_path / 'ck' / 'config.json').read_text())['dim'] == 24
    back = ResonanceLanguageModel.load(tmp_path / 'ck')
    assert back.lm_head.weight is back.tok_emb.weight and back.lm_head.weight[0, 0].item() == 3.25
    ids = torch.randint(0, 97, (2, 30))
    with torch.no_grad(): assert torch.equal(m.eval()(ids), back.eval()(ids))
    assert back.num_params() == m.num_params()
    untied = tiny(tie_embeddings=False); untied.save(tmp_path / 'u')
    back = ResonanceLanguageModel.load(tmp_path / 'u')
    assert back.lm_head.weight is not back.tok_emb.weight
    assert torch.equal(back.lm_head.weight, untied.lm_head.weight)
    with pytest.raises(LegalnbError, match='missing'): ResonanceLanguageModel.load(tmp_path / 'nowhere')


def test_generation_length_determinism_and_crop():
    m = tiny(max_seq_len=16)
    p = torch.randint(0, 97, (2, 5))
    a = m.generate(p, 30, temperature=0.8, top_k=5, generator=123)
    b = m.generate(p, 30, temperature=0.8, top_k=5, generator=123)
    c = m.generate(p, 30, temperature=0.8, top_k=5, generator=124)
    assert a.shape == (2, 35) and torch.equal(a, b) and not torch.equal(a, c) and torch.equal(a[:, :5], p)
    g = m.generate(p, 4, temperature=0)
    with torch.no_grad(): first = m(p)[:, -1].argmax(-1)
    assert torch.equal(g[:, 5], first), 'greedy = argmax'
    # top_k=1 sampling is greedy whatever the temperature
    assert torch.equal(m.generate(p, 4, temperature=2.0, top_k=1, generator=0), g)


def test_fft_island_float32_under_bf16_autocast():
    m = tiny().eval()
    seen = []
    import legalnb.resonance as R
    orig = R.causal_fft_conv
    def spy(u, h):
        y = orig(u, h); seen.append((u.dtype, h.dtype, y.dtype)); return y
    R.causal_fft_conv = spy
    ids = torch.randint(0, 97, (2, 100))
    try:
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16): lb = m(ids)
    finally: R.causal_fft_conv = orig
    assert seen and all(hd == torch.float32 and yd == torch.float32 for _, hd, yd in seen)
    assert any(ud == torch.bfloat16 for ud, _, _ in seen), 'the matmuls around the island do run in bf16'
    with torch.no_grad(): lf = m(ids)
    assert lb.dtype == torch.bfloat16 and (lb.float() - lf).abs().max() < 0.05 * lf.abs().max()


def test_recall_branch_sums_in_float32_under_bf16_autocast(monkeypatch):
    "The branch's linear attention sums over the whole document: under bf16 autocast it runs in float32, as the FFT."
    import legalnb.resonance as R
    seen, orig = [], R.linear_attention
    def spy(fq, fk, v, *a, **kw):
        seen.append((fq.dtype, fk.dtype, v.dtype, torch.is_autocast_enabled('cpu'))); return orig(fq, fk, v, *a, **kw)
    monkeypatch.setattr(R, 'linear_attention', spy)
    m, ids = tiny().eval(), torch.randint(0, 97, (2, 300))
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16): lb = m(ids)
    assert seen == [(torch.float32, torch.float32, torch.float32, False)]
    with torch.no_grad(): lf = m(ids)
    assert lb.dtype == torch.bfloat16 and (lb.float() - lf).abs().max() < 0.05 * lf.abs().max()


def test_checkpointing_same_gradients():
    ids, tg = torch.randint(0, 97, (2, 2, 50))
    grads = []
    for ck in (False, True):
        m = tiny(checkpointing=ck, dropout=0.1, seed=3)
        torch.manual_seed(11)
        m(ids, tg)[1].backward()
        grads.append({k: p.grad.clone() for k, p in m.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]: assert torch.allclose(grads[0][k], grads[1][k], atol=1e-6, rtol=1e-5), k


def test_training_step_reduces_loss():
    m = tiny()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    x = torch.randint(0, 97, (4, 33)); ids, tg = x[:, :-1], x[:, 1:]
    first = None
    for _ in range(30):
        loss = m(ids, tg)[1]; opt.zero_grad(); loss.backward(); opt.step()
        first = first or loss.item()
    assert loss.item() < 0.7 * first, (first, loss.item())
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_recall_task_rows():
    from legalnb.resonance import recall_task
    g = torch.Generator().manual_seed(0)
    x, y = recall_task(6, 40, n_keys=5, n_noise=3, key_pos=7, generator=g)
    assert torch.equal(y[:, -1], x[:, 7]) and ((x[:, 7] >= 1) & (x[:, 7] <= 5)).all()
    assert (x[:, -1] == 0).all() and (y[:, :-1] == -100).all()
    x, y = recall_task(200, 40, key_pos=None, generator=g)
    pos = ((x >= 1) & (x <= 8)).float().argmax(1)
    assert pos.max() < 10 and pos.min() == 0 and len(set(pos.tolist())) > 5, 'anywhere in the first quarter'


def test_bench_worker_and_table(monkeypatch):
    "bench/model.py: one in-process measurement per model, equal non-embedding sizes, and the table."
    import argparse
    from conftest import load_bench
    bench = load_bench('model', monkeypatch)
    args = argparse.Namespace(model=None, size=None, vocab=64, dim=64, layers=1, frequencies=4, max_seq_len=128,
                              seq_len=64, batch=1, device='cpu', compile=False, checkpointing=False, warmup=1,
                              reps=2, max_time=10.0, threads=1)
    rows = []
    for m in ('resonance', 'gpt'):
        args.model = m; rows.append(bench.worker(args))
    r, g = rows
    assert r['tokens_per_s'] > 0 and g['tokens_per_s'] > 0 and r['reps'] == 2
    assert abs(r['non_embedding'] - g['non_embedding']) < 0.1 * g['non_embedding']
    assert math.isfinite(r['loss']) and abs(g['loss'] - math.log(64)) < 1.0
    table = bench.fmt_table(rows, peak=None)
    assert '| 64 |' in table and 'ratio R/GPT' in table


def random_starts(B, L, n, seed=0):
    "doc_starts with the row start and `n` random further starts per row."
    g = torch.Generator().manual_seed(seed)
    ds = torch.zeros(B, L, dtype=torch.bool); ds[:, 0] = True
    for b in range(B): ds[b, torch.randperm(L - 1, generator=g)[:n] + 1] = True
    return ds


@pytest.mark.parametrize('L,n', [(97, 3), (255, 120), (301, 40), (513, 5), (64, 63)])
def test_leakage_probe_float32(L, n):
    "Changing one document never changes another's logits, at odd lengths and with many short documents."
    m = tiny(init_std=0.1).eval()
    ds = random_starts(2, L, n, seed=L)
    assert document_leakage(m, ds) <= 1e-5
    assert document_leakage(m, ds, mask=False) > 1e-4, 'the probe can fail: without resets documents leak'


def assert_each_document_alone(m, ids, ds):
    "Each document's logits in the packed row equal those of the document run alone (float64: within 1e-10)."
    with torch.no_grad():
        packed = m(ids, doc_starts=ds)
        edges = ds[0].nonzero().flatten().tolist() + [ids.shape[1]]
        for s, e in zip(edges, edges[1:]):
            assert (packed[:, s:e] - m(ids[:, s:e])).abs().max() < 1e-10, (s, e)


def test_document_alone_float64_and_causality():
    "Each document's logits equal the document run alone (positions from 0); changing the future changes nothing."
    m = tiny().double().eval()
    L = 211
    ds = random_starts(1, L, 12, seed=3); ds[0, [L - 1, L - 2]] = True          # one-token documents too
    ids = torch.randint(0, 97, (1, L))
    assert_each_document_alone(m, ids, ds)
    with torch.no_grad():
        packed = m(ids, doc_starts=ds)
        for t in (0, 50, 150, L - 3):
            b = ids.clone(); b[:, t + 1:] = torch.randint(0, 97, (1, L - t - 1))
            assert (m(b, doc_starts=ds)[:, :t + 1] - packed[:, :t + 1]).abs().max() < 1e-10
    assert document_positions(ds)[0, ds[0].nonzero().flatten()[1]] == 0


def test_resets_flag_default_and_gradients():
    m = tiny(seed=4)
    ids, tg = torch.randint(0, 97, (2, 2, 90))
    ds = random_starts(2, 90, 6)
    with torch.no_grad():
        assert torch.equal(m(ids), m(ids, doc_starts=None)), 'no doc_starts: plain behaviour'
        assert torch.allclose(m(ids, doc_starts=torch.zeros_like(ds)), m(ids), atol=1e-6), 'one document per row'
        assert not torch.allclose(m(ids, doc_starts=ds), m(ids), atol=1e-3)
    off = tiny(seed=4, document_resets=False)
    with torch.no_grad(): assert torch.equal(off(ids, doc_starts=ds), off(ids)), 'document_resets=False ignores them'
    grads = []
    for ck in (False, True):
        mm = tiny(seed=4, checkpointing=ck)
        mm(ids, tg, doc_starts=ds)[1].backward()
        grads.append({k: p.grad.clone() for k, p in mm.named_parameters()})
        assert all(torch.isfinite(g).all() for g in grads[-1].values())
    assert grads[0]['backbone.blocks.0.mixer.filter.decay'].abs().sum() > 0
    for k in grads[0]: assert torch.allclose(grads[0][k], grads[1][k], atol=1e-6, rtol=1e-5), k
    with pytest.raises(LegalnbError, match='doc_starts must be a bool tensor'): m(ids, doc_starts=ds[:, :10])


def test_resets_under_bf16_autocast():
    m = tiny().eval()
    ids, ds = torch.randint(0, 97, (2, 100)), random_starts(2, 100, 7)
    with torch.no_grad():
        ref = m(ids, doc_starts=ds)
        with torch.autocast('cpu', dtype=torch.bfloat16): lb = m(ids, doc_starts=ds)
    assert (lb.float() - ref).abs().max() < 0.05 * ref.abs().max()


def test_document_fft_conv_gradient_float64():
    "The subtraction is differentiable: gradcheck through the states and the carried part."
    from legalnb.resonance import ResonanceFilter
    torch.manual_seed(0)
    f = ResonanceFilter(2, 3, 50).double()
    u = torch.randn(1, 2, 13, dtype=torch.float64, requires_grad=True)
    ds = torch.zeros(1, 13, dtype=torch.bool); ds[0, [4, 5, 11]] = True
    assert torch.autograd.gradcheck(lambda u: document_fft_conv(u, f, ds), (u,))


def assert_recurrent_equals_recompute(m, ids, starts, new: int):
    "Greedy tokens of the recurrent path equal recomputing; prefill and each step's logits within 1e-4. The state."
    P = ids.shape[1]
    ds = None
    if starts is not None:
        ds = torch.zeros(2, P, dtype=torch.bool); ds[0, starts] = True; ds[1, starts[-1]] = True
    fast = m.generate(ids, new, temperature=0, doc_starts=ds)
    assert torch.equal(fast, m.generate(ids, new, temperature=0, doc_starts=ds, recurrent=False))
    full_ds = None if ds is None else torch.cat([ds, torch.zeros(2, new, dtype=torch.bool)], 1)
    with torch.no_grad(): ref = m(fast, doc_starts=full_ds)
    logits, state = m.prefill(ids, ds)
    assert (logits - ref[:, :P]).abs().max() < 1e-4
    worst = 0.0
    for t in range(P, P + new - 1): worst = max(worst, (m.step(fast[:, t], state) - ref[:, t]).abs().max().item())
    assert worst < 1e-4, worst
    return state


@pytest.mark.parametrize('P,starts,new', [(37, None, 256), (101, [0, 20, 21, 77], 256), (1, None, 64),
                                          (150, [0, 149], 64), (63, [0, 60], 64)])
def test_recurrent_generation_equals_recompute(P, starts, new):
    "256 greedy tokens identical to the recompute path; every step's logits within 1e-4 of the FFT path's."
    m = tiny(max_seq_len=600, init_std=0.2, seed=P).eval()
    ids = torch.randint(0, 97, (2, P))
    assert_recurrent_equals_recompute(m, ids, starts, new)


def test_recurrent_generation_crops_at_max_seq_len_and_samples():
    m = tiny(max_seq_len=40, init_std=0.2).eval()
    ids = torch.randint(0, 97, (1, 30))
    a = m.generate(ids, 25, temperature=0)
    assert torch.equal(a, m.generate(ids, 25, temperature=0, recurrent=False)), 'past 40 tokens: re-run the window'
    s1 = m.generate(ids, 20, temperature=0.9, top_k=7, generator=5)
    assert torch.equal(s1, m.generate(ids, 20, temperature=0.9, top_k=7, generator=5, recurrent=False))
    _, state = m.prefill(torch.randint(0, 97, (1, 40)))
    with pytest.raises(LegalnbError, match='the context is full'): m.step(torch.tensor([1]), state)


def test_bench_generate_worker_and_table(monkeypatch):
    "bench/generate.py: both paths in-process on a short prompt agree on their greedy tokens; the table says so."
    from conftest import load_bench
    bench = load_bench('generate', monkeypatch)
    base = dict(device='cpu', dim=16, layers=1, frequencies=4, vocab=64, threads=1, prompt=101)
    rows = [bench.worker({**base, 'path': 'recurrent', 'new': 6}), bench.worker({**base, 'path': 'recompute', 'new': 3})]
    assert rows[0]['tokens'][:3] == rows[1]['tokens'] and rows[0]['ms_per_token'] > 0 and rows[0]['prefill_s'] > 0
    table = bench.fmt_table(rows)
    assert table.splitlines()[2].split('|')[1].strip() == '101' and table.rstrip().endswith('yes |')


# The hybrid (issue 19): attention mixers in the blocks of `attention_layers`, full or windowed. Every guarantee
# of the all-resonance model must hold for it too: causality, document resets, exact recurrent generation.
HYBRIDS = [dict(attention_layers=[1]), dict(attention_layers=[0], attention_window=7), dict(linear_layers=[0]),
           dict(linear_layers=[1], attention_layers=[0], attention_window=5, feature_dim=3),
           dict(recall_layers=[]), dict(recall_layers=[0, 1], feature_dim=5), dict(delta_layers=[1]),
           dict(delta_layers=[1], attention_layers=[0], attention_window=5), dict(filter_heads=3)]
NAMES = ['full', 'window', 'linear', 'linear+window', 'no recall branch', 'recall branch in both blocks', 'delta',
         'delta+window', 'input-dependent filters']


@pytest.mark.parametrize('kw', HYBRIDS, ids=NAMES)
def test_hybrid_causality_and_document_alone_float64(kw):
    m = tiny(**kw).double().eval()
    for L, t in [(5, 2), (65, 64), (211, 100)]:
        change, grad = causality_violation(m, L, t, seed=L)
        assert change < 1e-10 and grad < 1e-10, (L, t, change, grad)
    L = 131
    ds = random_starts(1, L, 9, seed=5); ds[0, L - 1] = True
    assert_each_document_alone(m, torch.randint(0, 97, (1, L)), ds)


@pytest.mark.parametrize('kw', HYBRIDS, ids=NAMES)
@pytest.mark.parametrize('L,n', [(97, 3), (301, 40), (64, 63)])
def test_hybrid_leakage_probe_float32(kw, L, n):
    m = tiny(init_std=0.1, **kw).eval()
    ds = random_starts(2, L, n, seed=L)
    assert document_leakage(m, ds) <= 1e-5
    assert document_leakage(m, ds, mask=False) > 1e-4, 'the probe can fail: without resets documents leak'


@pytest.mark.parametrize('kw,P,starts,new', [(HYBRIDS[0], 37, None, 256), (HYBRIDS[0], 101, [0, 20, 21, 77], 256),
                                             (HYBRIDS[1], 101, [0, 20, 21, 77], 256), (HYBRIDS[1], 150, [0, 149], 64),
                                             (HYBRIDS[2], 150, [0, 149], 64), (HYBRIDS[2], 101, [0, 20, 21, 77], 256),
                                             (HYBRIDS[3], 37, None, 128), (HYBRIDS[4], 101, [0, 20, 21, 77], 64),
                                             (HYBRIDS[5], 150, [0, 149], 64), (HYBRIDS[5], 101, [0, 20, 21, 77], 256),
                                             (HYBRIDS[6], 101, [0, 20, 21, 77], 256), (HYBRIDS[6], 150, [0, 149], 64),
                                             (HYBRIDS[7], 37, None, 128), (HYBRIDS[7], 101, [0, 20, 21, 77], 64),
                                             (HYBRIDS[8], 101, [0, 20, 21, 77], 256), (HYBRIDS[8], 150, [0, 149], 64)])
def test_hybrid_recurrent_generation_equals_recompute(kw, P, starts, new):
    "The KV cache of the attention block continues the FFT path exactly: greedy tokens equal, logits within 1e-4."
    m = tiny(max_seq_len=600, init_std=0.2, seed=P, **kw).eval()
    ids = torch.randint(0, 97, (2, P))
    state = assert_recurrent_equals_recompute(m, ids, starts, new)
    if kw.get('attention_window'): assert state.layers[0]['k'].shape[2] == kw['attention_window'] - 1, 'bounded cache'


def test_hybrid_save_load_and_old_configs(tmp_path):
    "A hybrid round-trips; a config.json written before the switch existed loads as the all-resonance model."
    from legalnb.resonance import ResonanceAttention, ResonanceLayer
    h = tiny(**HYBRIDS[1]).eval()
    h.save(tmp_path/'h')
    assert json.loads((tmp_path/'h'/'config.json').read_text())['attention_layers'] == [0]
    h2 = ResonanceLanguageModel.load(tmp_path/'h')
    assert h2.config == h.config and isinstance(h2.backbone.blocks[0].mixer, ResonanceAttention)
    ids = torch.randint(0, 97, (1, 50))
    with torch.no_grad(): assert torch.equal(h(ids), h2.eval()(ids))
    old = tiny().eval()
    old.save(tmp_path/'old')
    cfg = json.loads((tmp_path/'old'/'config.json').read_text())
    assert 'attention_layers' not in cfg and 'attention_window' not in cfg, 'written as before the switch'
    o2 = ResonanceLanguageModel.load(tmp_path/'old').eval()
    assert all(isinstance(b.mixer, ResonanceLayer) for b in o2.backbone.blocks)
    with torch.no_grad(): assert torch.equal(old(ids), o2(ids))


def test_recall_branch_default_and_configs_written_before_it(tmp_path):
    "The default has the recall branch in block 0; a config.json without `recall_layers` (every checkpoint before "
    "it) loads as the plain resonance mixer, weights and outputs unchanged; blocks with another mixer get no branch."
    from legalnb.resonance import ResonanceLayer
    new = tiny().eval()
    assert new.config.recall_layers == (0,) and hasattr(new.backbone.blocks[0].mixer, 'recall_gate')
    assert not hasattr(new.backbone.blocks[1].mixer, 'recall_gate')
    assert json.loads(json.dumps(new.config.to_dict()))['recall_layers'] == [0]
    plain = tiny(recall_layers=[]).eval()
    plain.save(tmp_path/'plain')
    written = json.loads((tmp_path/'plain'/'config.json').read_text())
    assert 'recall_layers' not in written and 'feature_dim' not in written, 'written as before the branch'
    back = ResonanceLanguageModel.load(tmp_path/'plain').eval()
    assert back.config.recall_layers == () and isinstance(back.backbone.blocks[0].mixer, ResonanceLayer)
    assert back.backbone.blocks[0].mixer.in_proj.weight.shape == (3 * TINY['dim'], TINY['dim'])
    ids = torch.randint(0, 97, (1, 50))
    with torch.no_grad(): assert torch.equal(plain(ids), back(ids))
    assert ResonanceConfig(**TINY, attention_layers=[0]).recall_layers == (), 'an attention block has no branch'
    assert ResonanceConfig(**TINY, linear_layers=[0], recall_layers=[0, 1]).recall_layers == (1,)


def test_recall_branch_closed_is_the_plain_mixer():
    "The branch is added to the resonance mixer's output and nothing else: with its gate at 0 the same weights give "
    "the plain model's logits (and with the gate as initialised, 1, they do not)."
    torch.manual_seed(0)
    new = ResonanceLanguageModel(ResonanceConfig(**TINY)).eval()
    assert torch.equal(new.backbone.blocks[0].mixer.recall_gate.detach(), torch.ones(TINY['dim']))
    plain = ResonanceLanguageModel(ResonanceConfig(**TINY, recall_layers=[])).eval()
    state = {k: (v[:3 * TINY['dim']] if k.endswith(('0.mixer.in_proj.weight', '0.mixer.short.weight',
                                                    '0.mixer.short.bias')) else v)
             for k, v in new.state_dict().items() if not k.endswith('recall_gate')}
    plain.load_state_dict(state)
    ids = torch.randint(0, 97, (2, 77))
    with torch.no_grad():
        assert not torch.allclose(new(ids), plain(ids), atol=1e-3)
        new.backbone.blocks[0].mixer.recall_gate.zero_()
        assert torch.allclose(new(ids), plain(ids), atol=1e-6)


def test_hybrid_flops_and_parameters():
    "An attention block has the resonance mixer's matrices; its FLOPs grow with L, a window's stop at W."
    plain = dict(TINY, recall_layers=[])   # the attention's FLOPs alone, without the recall branch's
    base, full = ResonanceConfig(**plain), ResonanceConfig(**plain, attention_layers=[1])
    win = ResonanceConfig(**plain, attention_layers=[1], attention_window=64)
    assert full.matmul_params() == base.matmul_params()
    assert full.flops_per_token(4096) > 2 * full.flops_per_token(1024) > 0
    assert win.flops_per_token(8192) - win.matmul_flops_per_token() < 1.2 * (win.flops_per_token(1024)
                                                                              - win.matmul_flops_per_token())
    n_res, n_hyb = tiny().num_params(non_embedding=True), tiny(attention_layers=[1]).num_params(non_embedding=True)
    assert 0.9 * n_res < n_hyb < n_res


def test_recompute_mixer_same_numbers_and_configs():
    "Rows of at least `recompute_from` tokens recompute each mixer in backward: the same loss and gradients as "
    "keeping the activations; the default is not written, so a config.json from before it reads the same."
    ids = torch.randint(0, 97, (2, 41))
    grads = []
    for r in (0, 40):
        m = tiny(recompute_from=r, delta_layers=[1], filter_heads=2).train()
        loss = m(ids, ids)[1]; loss.backward()
        assert m.backbone.blocks[0].recompute == r
        grads.append((loss.item(), [p.grad.clone() for p in m.parameters()]))
    assert grads[0][0] == pytest.approx(grads[1][0], abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads[0][1], grads[1][1]))
    c = ResonanceConfig(**TINY)
    assert c.recompute_from == 16384 and 'recompute_from' not in c.to_dict() and 'filter_heads' not in c.to_dict()
    assert ResonanceConfig.from_dict(c.to_dict()) == c and 'delta_layers' not in c.to_dict()
    assert ResonanceConfig(**TINY, checkpointing=True).recompute_from == 16384
    with pytest.raises(LegalnbError, match='recompute_from must be an integer >= 0'):
        ResonanceConfig(**TINY, recompute_from=-1)
    with pytest.raises(LegalnbError, match='are in attention_layers and delta_layers'):
        ResonanceConfig(**TINY, attention_layers=[1], delta_layers=[1])
    assert ResonanceConfig(**TINY, delta_layers=[0]).recall_layers == (), 'a delta block has no recall branch'


def test_input_dependent_filters_depend_on_the_token():
    "With filter_heads > 1 each position weighs its filters by its own content: two tokens, two effective filters."
    m = tiny(filter_heads=3).eval()
    mixer = m.backbone.blocks[0].mixer
    assert len(mixer.more_filters) == 2
    w = mixer.filter_weights(torch.randn(5, TINY['dim']))
    assert w.shape == (5, 3, TINY['dim']) and torch.allclose(w.sum(1), torch.ones(5, TINY['dim']))
    assert (w[0] - w[1]).abs().max() > 1e-3, 'the weights change with the input'
