"Shared helpers of the trainer tests (imported as `from conftest import ...`): one split maker, one file-tree snapshot."
import json, os
from pathlib import Path

import numpy as np

from legalnb.data import split

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': str(ROOT)}  # child processes: one thread, this checkout

def make_split(root: Path, rows=96, seq_len=16, vocab=32, seed=0) -> Path:
    "A corpus of counting rows in two shards, split into train/ and val/ by the data stage."
    rng = np.random.default_rng(seed)
    ids = ((rng.integers(0, vocab, (rows, 1)) + np.arange(seq_len + 1)) % vocab).astype(np.uint16)
    corpus = root/'corpus'; corpus.mkdir(parents=True)
    np.save(corpus/'shard_00000.npy', ids[:rows // 2]); np.save(corpus/'shard_00001.npy', ids[rows // 2:])
    (corpus/'manifest.json').write_text(json.dumps({'vocab_size': vocab}))
    split(corpus, root/'split', val_ratio=0.25, seed=0, by='rows')
    return root/'split'

def tree(folder: Path) -> dict:
    "Every file under `folder` (relative path) with its bytes: equal trees mean nothing changed."
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob('*')) if p.is_file()}
