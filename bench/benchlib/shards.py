"""Anvil token shards (docs/data.md): reading one for the PyTorch side, writing one of random tokens."""
from pathlib import Path

import numpy as np


def read_shard(path):
    """(tokens as int64, vocabulary size) of an Anvil token shard."""
    raw = Path(path).read_bytes()
    assert raw[:8] == b"ANVILTOK", f"{path}: not an Anvil token shard"
    version, dtype = np.frombuffer(raw[8:16], dtype=np.uint32)
    count, vocab = np.frombuffer(raw[16:32], dtype=np.uint64)
    tokens = np.frombuffer(raw[64:], dtype=np.uint16 if dtype == 1 else np.uint32)
    assert len(tokens) == count, f"{path}: header says {count} tokens, the file holds {len(tokens)}"
    return tokens.astype(np.int64), int(vocab)


def write_random_shard(path, n_tokens, vocab, seed=1):
    """An Anvil token shard of uniform random token ids in [0, vocab) (uint16 up to 65536 ids, else uint32, as
    Anvil writes them). Kept if it exists already."""
    path = Path(path)
    if path.exists():
        return path
    wide = vocab > 65536
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=n_tokens, dtype=np.uint32 if wide else np.uint16)
    header = bytearray(64)
    header[0:8] = b"ANVILTOK"
    header[8:16] = np.array([1, 2 if wide else 1], dtype=np.uint32).tobytes()  # version 1, dtype code
    header[16:32] = np.array([n_tokens, vocab], dtype=np.uint64).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(header) + tokens.tobytes())
    return path
