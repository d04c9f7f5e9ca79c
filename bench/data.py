"""How fast does the data stage feed a GPU? Random-access batches from PretokenizedDataset vs reading the same bytes
sequentially, at rows of 3,073 and 32,768 tokens, in one run.

    python bench/data.py [--mb 192] [--seconds 3] [--dir /tmp]

For each row length it writes `--mb` MB of uint16 rows as 8 `.npy` shards, then measures, each time starting from a
page cache emptied of the files (fsync, then posix_fadvise(DONTNEED); on a VM the host may still cache them):
  sequential   plain `f.read` of every shard, 16 MB at a time: the ceiling for these bytes on this disk
  sampler      `ds[sampler.batch(k)]` in the training process: the dataset's own random access
  loader w=0   `make_loader(..., num_workers=0)`: the same through torch's DataLoader
  loader w=2   `make_loader(..., num_workers=2)`: two reader processes (startup and the first batch excluded)
  floor        a DataLoader with 2 workers over a dataset of zeros: what moving batches between processes costs alone
and compares tokens/s with what an H100 consumes training a 1B-parameter model (≈ 100k tokens/s, arithmetic printed).
"""
import os, sys, tempfile, time
from pathlib import Path

import numpy as np
import torch

from common import header, markdown_table, run
from legalnb.data import PretokenizedDataset, StepSampler, make_loader

H100_BF16 = 989e12   # dense bf16 tensor-core FLOP/s, H100 SXM datasheet
MFU = 0.6            # a good training run
PARAMS = 1e9         # a 1B-parameter model
H100_TOKENS_PER_S = MFU * H100_BF16 / (6 * PARAMS)  # 6·N FLOPs per trained token (Kaplan et al. 2020)


def write_shards(folder: Path, row_len: int, mb: int, shards: int = 8) -> int:
    "Random uint16 rows, `mb` MB in `shards` .npy files, fsync'ed; the number of rows."
    rows = max(shards, mb * 2**20 // (2 * row_len)) // shards
    rng = np.random.default_rng(0)
    for k in range(shards):
        path = folder/f'shard_{k:05d}.npy'
        np.save(path, rng.integers(0, 50000, size=(rows, row_len), dtype=np.uint16))
        with open(path, 'rb') as f: os.fsync(f.fileno())
    return rows * shards


def drop_cache(folder: Path) -> None:
    "Ask the kernel to forget the files' pages, so the next read comes from the disk."
    for p in folder.glob('*.npy'):
        fd = os.open(p, os.O_RDONLY)
        try: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally: os.close(fd)


def rss_anon_mb() -> float:
    "Anonymous resident memory of this process (not file pages), MB."
    for l in open('/proc/self/status'):
        if l.startswith('RssAnon'): return int(l.split()[1]) / 1024
    return float('nan')


def sequential(folder: Path) -> tuple[float, int]:
    "Seconds and bytes to read every shard front to back."
    t, n = time.perf_counter(), 0
    for p in sorted(folder.glob('*.npy')):
        with open(p, 'rb', buffering=0) as f:
            while chunk := f.read(16 << 20): n += len(chunk)
    return time.perf_counter() - t, n


def timed(batches, seconds: float, skip: int = 0) -> tuple[int, float]:
    "Consume batches for about `seconds` after `skip` warm-up ones; (batches, seconds)."
    it = iter(batches)
    for _ in range(skip): next(it)
    n, t = 0, time.perf_counter()
    for _ in it:
        n += 1
        if time.perf_counter() - t > seconds: break
    return n, time.perf_counter() - t


class Zeros(torch.utils.data.Dataset):
    "A dataset that reads nothing: batches of zeros of the real shape, to measure the DataLoader's own cost."
    def __init__(self, n: int, seq_len: int): self.n, self.seq_len = n, seq_len
    def __len__(self): return self.n
    def __getitem__(self, rows):
        zeros = lambda: torch.zeros(len(rows), self.seq_len, dtype=torch.int64)
        return zeros(), zeros()


def bench_length(row_len: int, batch: int, mb: int, seconds: float, root: Path) -> list[dict]:
    "All four measurements at one row length."
    folder = root/f'L{row_len}'; folder.mkdir()
    rows = write_shards(folder, row_len, mb)
    out, tok_per_batch = [], batch * (row_len - 1)
    drop_cache(folder)
    s, nbytes = sequential(folder)
    out.append(dict(how='sequential read', batches=None, tok_s=nbytes / 2 / s, mb_s=nbytes / s / 2**20, rss=None))
    sides = (('sampler, in process', None, 0), ('loader, 0 workers', 0, 10**5), ('loader, 2 workers', 2, 2 * 10**5))
    for name, workers, start in sides:
        drop_cache(folder)
        ds = PretokenizedDataset(folder)
        sampler = StepSampler(len(ds), batch, seed=0, start_step=start)
        rss0 = rss_anon_mb()
        if workers is None: n, t = timed((ds[b] for b in sampler), seconds)
        else: n, t = timed(make_loader(ds, sampler, num_workers=workers, prefetch_factor=4, pin_memory=False), seconds,
                           skip=1 if workers else 0)
        out.append(dict(how=name, batches=n / t, tok_s=n * tok_per_batch / t, mb_s=n * batch * row_len * 2 / t / 2**20,
                        rss=rss_anon_mb() - rss0 if workers is None or workers == 0 else None))
    floor = torch.utils.data.DataLoader(Zeros(len(ds), row_len - 1), sampler=StepSampler(len(ds), batch),
                                        batch_size=None, num_workers=2, prefetch_factor=4)
    n, t = timed(floor, seconds, skip=1)
    out.append(dict(how='floor: zeros, 2 wkrs', batches=n / t, tok_s=n * tok_per_batch / t, mb_s=None, rss=None))
    for r in out: r.update(row_len=row_len, batch=batch, rows=rows)
    return out


def main(mb: int = 192,          # MB of rows per row length
         seconds: float = 3.0,   # seconds per random-access measurement
         dir: str | None = None):  # where to write the temporary shards (default: the system temp dir)
    "Random-access batches from PretokenizedDataset against sequential reads, at rows of 3,073 and 32,768 tokens."
    header(__file__, 'numpy')
    print(f'H100 demand, 1B model: {MFU:.0%} MFU x {H100_BF16:.3g} FLOP/s / (6 x {PARAMS:.0e} FLOP per token) = '
          f'{H100_TOKENS_PER_S:,.0f} tokens/s')
    print(f'data: {mb} MB of random uint16 ids per row length in 8 .npy shards; each measurement starts with the files')
    print('dropped from the page cache (posix_fadvise DONTNEED; a VM host may still cache them)\n')
    rows = []
    with tempfile.TemporaryDirectory(dir=dir) as d:
        rows += bench_length(3073, 8, mb, seconds, Path(d))
        rows += bench_length(32768, 1, mb, seconds, Path(d))
    table = []
    for r in rows:
        seq = next(x['tok_s'] for x in rows if x['row_len'] == r['row_len'] and x['how'] == 'sequential read')
        table.append([f'{r["row_len"]:,}', r['batch'], r['how'],
                      None if r['batches'] is None else f'{r["batches"]:,.1f}', f'{r["tok_s"]:,.0f}',
                      None if r['mb_s'] is None else f'{r["mb_s"]:,.0f}', f'{r["tok_s"] / seq:.2f}x',
                      f'{r["tok_s"] / H100_TOKENS_PER_S:.1f}x', None if r['rss'] is None else f'{r["rss"]:+.0f} MB'])
    columns = ['row length', 'batch', 'how', 'batches/s', 'tokens/s', 'MB/s', 'vs seq.', 'vs H100', 'RssAnon']
    print(markdown_table(columns, table, 'rrlrrrrrr'))
    print('\ntokens/s counts trained tokens (batch x (row length - 1)); '
          '"vs seq." is against the sequential read of the same files;\n'
          '"vs H100" is against the demand above; '
          'RssAnon is the growth of anonymous (non-file) memory while reading in process;\n'
          '"floor" is a DataLoader with 2 workers whose dataset reads nothing: '
          'the cost of moving batches between processes here.')


if __name__ == '__main__': sys.exit(run(main))
