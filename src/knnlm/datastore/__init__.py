"""The datastore: keys and vals on disk, the store kinds searched over them, and imported stores.

  dump      -- one pass of a base LM (knnlm.lm.LMPass) written as keys (att, ffn), vals and queries, memmapped;
  stores    -- the store kinds of a run (full, a ratio subset, PCA keys, other IVF list counts, every-token scoring)
               and their names (the {store} wildcard);
  importer  -- knn-transformers' and urvashik/knnlm's memmap datastores in this layout.
Importing this package imports nothing heavy: the rules parse with knnlm.datastore.stores (numpy).
"""
