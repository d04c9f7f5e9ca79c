"End-to-end tests of the GPT baseline: document leakage, causality, KV-cache generation, save/load, sizes."
import json

import pytest
import torch

from legalnb.core import LegalnbError
from legalnb.gpt import MODEL_SIZES, GPTConfig, GPTLanguageModel, KVCache, document_leakage, document_mask
from legalnb.models import size_table

TINY = dict(vocab_size=97, dim=32, num_layers=2, num_heads=4, max_seq_len=96)


def tiny(seed=0, **kw) -> GPTLanguageModel:
    torch.manual_seed(seed)
    return GPTLanguageModel(GPTConfig(**{**TINY, **kw})).eval()


def starts_at(L, *rows):
    "A (len(rows), L) doc_starts mask with True at the given offsets of each row."
    s = torch.zeros(len(rows), L, dtype=torch.bool)
    for r, offsets in enumerate(rows): s[r, list(offsets)] = True
    return s


@pytest.mark.parametrize('L,rows', [
    (37, [(0, 1, 2, 3, 5, 8, 13, 21, 34), (4, 9, 10, 31)]),          # many short documents, odd length
    (61, [range(0, 61, 3), (0, 60)]),                                  # documents of 3 tokens; one of 1 at the end
    (23, [(11,), (0, 1, 22)]),                                         # a row that starts mid-document
])
@pytest.mark.parametrize('kv_heads', [None, 2])
def test_no_leakage_between_documents(L, rows, kv_heads):
    m = tiny(num_kv_heads=kv_heads)
    starts = starts_at(L, *rows)
    assert document_leakage(m, starts, seed=L) <= 1e-5
    assert document_leakage(m, starts, seed=L, mask=False) > 1e-2, 'the probe can fail: plain causal attention leaks'


def test_changed_document_itself_does_change():
    m = tiny()
    starts = starts_at(30, (0, 10, 20))
    a = torch.randint(0, 97, (1, 30)); b = a.clone(); b[0, 14] = (b[0, 14] + 1) % 97
    with torch.no_grad(): d = (m(a, doc_starts=starts) - m(b, doc_starts=starts)).abs().amax(-1)[0]
    assert d[:14].max() < 1e-6 and d[14:20].min() > 1e-4 and d[20:].max() < 1e-6


@pytest.mark.parametrize('doc', [False, True])
def test_causality(doc):
    m = tiny()
    starts = starts_at(50, (0, 17, 18, 40)) if doc else None
    for t in (0, 16, 17, 33, 48):
        a = torch.randint(0, 97, (1, 50)); b = a.clone(); b[:, t + 1:] = torch.randint(0, 97, (1, 49 - t))
        with torch.no_grad(): la, lb = m(a, doc_starts=starts), m(b, doc_starts=starts)
        assert (la[:, :t + 1] - lb[:, :t + 1]).abs().max() <= 1e-5
    x = m.tok_emb(a).detach().requires_grad_()  # gradient probe: output t does not depend on inputs after t
    h = x
    from legalnb.gpt import rope_angles
    cos, sin = rope_angles(torch.arange(50), m.config.head_dim, m.config.rope_theta)
    for block in m.blocks: h = block(h, cos, sin)
    m.lm_head(m.norm(h))[:, 20].sum().backward()
    assert x.grad[:, 21:].abs().max() == 0 and x.grad[:, :21].abs().max() > 0


def test_document_mask_shape_and_errors():
    m = document_mask(starts_at(5, (0, 2), (3,)))
    assert m.shape == (2, 1, 5, 5) and m[0, 0, 3].tolist() == [False, False, True, True, False]
    assert m[1, 0, 2].tolist() == [True, True, True, False, False]
    with pytest.raises(LegalnbError, match=r'must be a \(batch, seq_len\) bool tensor'):
        document_mask(torch.zeros(5, dtype=torch.bool))


@pytest.mark.parametrize('kv_heads', [None, 1])
def test_kv_cache_greedy_equals_recompute(kv_heads):
    m = tiny(num_kv_heads=kv_heads, init_std=0.3)           # large weights: greedy output is not one repeated token
    prompt = torch.randint(0, 97, (3, 17), generator=torch.Generator().manual_seed(0))
    fast = m.generate(prompt, 100, temperature=0)           # 117 > max_seq_len 96: the crop path runs too
    slow = m.generate(prompt, 100, temperature=0, use_cache=False)
    assert fast.shape == (3, 117) and torch.equal(fast[:, :17], prompt) and torch.equal(fast, slow)
    assert min(len(set(row[17:].tolist())) for row in fast) > 10


def test_kv_cache_logits_equal_full_forward():
    m = tiny().double()
    seq = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        full = m(seq)
        cache = KVCache(m.config, 2, 40, seq.device, torch.float64)
        parts = [m(seq[:, :9], cache=cache), m(seq[:, 9:10], cache=cache), m(seq[:, 10:25], cache=cache)]
        parts += [m(seq[:, i:i + 1], cache=cache) for i in range(25, 40)]
    assert cache.length == 40 and (torch.cat(parts, 1) - full).abs().max() < 1e-10


def test_sampling_is_repeatable_and_training_mode_restored():
    m = tiny(); m.train()
    p = torch.randint(0, 97, (2, 5))
    a = m.generate(p, 12, temperature=0.8, top_k=10, generator=7)
    assert torch.equal(a, m.generate(p, 12, temperature=0.8, top_k=10, generator=7)) and m.training
    assert not torch.equal(a, m.generate(p, 12, temperature=0.8, top_k=10, generator=8))


def test_save_load_round_trip(tmp_path):
    m = tiny(num_kv_heads=2)
    m.save(tmp_path/'m')
    back = GPTLanguageModel.load(tmp_path/'m').eval()
    assert json.loads((tmp_path/'m'/'config.json').read_text())['architecture'] == 'gpt'
    assert back.config == m.config and back.lm_head.weight is back.tok_emb.weight
    ids = torch.randint(0, 97, (2, 30))
    with torch.no_grad(): assert torch.equal(back(ids), m(ids))


def test_save_load_untied(tmp_path):
    m = tiny(tie_embeddings=False)
    GPTLanguageModel.load(m.save(tmp_path)).eval()
    ids = torch.randint(0, 97, (1, 8))
    with torch.no_grad(): assert torch.equal(GPTLanguageModel.load(tmp_path)(ids), m(ids))


def test_load_errors(tmp_path):
    with pytest.raises(LegalnbError, match='model.safetensors: missing'): GPTLanguageModel.load(tmp_path)
    tiny().save(tmp_path)
    cfg = json.loads((tmp_path/'config.json').read_text())
    (tmp_path/'config.json').write_text(json.dumps({k: v for k, v in cfg.items() if k != 'architecture'}))
    with pytest.raises(LegalnbError, match="architecture None, not 'gpt'; load it with legalnb.models.load_model"):
        GPTLanguageModel.load(tmp_path)
    (tmp_path/'config.json').write_text(json.dumps({**cfg, 'num_layers': 3}))
    with pytest.raises(LegalnbError, match=r"model.safetensors: missing \['blocks.2"): GPTLanguageModel.load(tmp_path)


def test_sizes_match_resonance_non_embedding_counts():
    gpt, res = size_table('gpt'), size_table('resonance')
    assert [r['size'] for r in gpt] == [r['size'] for r in res] == list(MODEL_SIZES)
    for g, r in zip(gpt, res):
        assert abs(g['non_embedding'] / r['non_embedding'] - 1) < 0.10, (g, r)
        assert g['gflops_per_token'] > 0


def test_flops_formula():
    c = GPTConfig(**TINY)
    assert c.matmul_flops_per_token() == 6 * c.matmul_params()
    assert c.flops_per_token(1000) - c.flops_per_token(500) == 6 * c.num_layers * 500 * c.dim
    with torch.device('meta'): m = GPTLanguageModel(c)
    norms = (2 * c.num_layers + 1) * c.dim
    assert c.matmul_params() == m.num_params(non_embedding=True) - norms + c.vocab_size * c.dim


def test_config_errors_name_the_field():
    with pytest.raises(LegalnbError, match='GPTConfig: max_seq_len must be an integer >= 1, got 0'):
        GPTConfig(vocab_size=5, max_seq_len=0)
    with pytest.raises(LegalnbError, match='norm_eps must be > 0'): GPTConfig(vocab_size=5, norm_eps=-1.0)


def test_checkpointing_same_gradients_and_training_reduces_loss():
    ids = torch.randint(0, 97, (2, 41), generator=torch.Generator().manual_seed(0))
    starts = starts_at(40, (0, 13), (0, 5, 30))
    def grads(ckpt):
        m = tiny(checkpointing=ckpt).train()
        m(ids[:, :-1], ids[:, 1:], doc_starts=starts)[1].backward()
        return torch.cat([p.grad.flatten() for p in m.parameters()])
    assert (grads(True) - grads(False)).abs().max() < 1e-6
    m = tiny(dropout=0.1).train()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = m(ids[:, :-1], ids[:, 1:], doc_starts=starts)[1]
        opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
    assert losses[-1] < losses[0] - 1


def test_weights_are_a_llama_without_permutation(tmp_path):
    "RoPE in rotate-half layout, RMSNorm, SwiGLU, no biases: Hugging Face's LlamaForCausalLM gives the same logits."
    transformers = pytest.importorskip('transformers')
    from legalnb.gpt import export_gpt
    m = tiny(num_kv_heads=2, init_std=0.2)
    export_gpt(m, tmp_path, eos_id=0)   # the weights as they are (it refuses a missing or unexpected tensor)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 97, (2, 50))
    with torch.no_grad(): assert (hf(ids).logits - m(ids)).abs().max() < 1e-5
