"""Nearest-neighbour search over a datastore (Xu et al. 2023, Sec. 5: the FAISS mask and the real mask).

  index    -- FAISS IVFPQ: build (trained on a sample of keys), search ('FAISS mask', 'FAISS score');
  exact    -- the exact top-k over every key, in tiles, ties by id ('real mask'), its shards and their merge;
  _select  -- the top-k selection kernels exact search and scoring share (numba);
  scope    -- which tokens of a split are scored (the retrieval scope) and valid's tuning sample.
Algorithms take arrays (memmaps) and return arrays; no function here builds a path.
"""
