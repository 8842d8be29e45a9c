"""`plan`, the dry run: what an `eval` with the same flags would find cached, compute, need
and take, without computing or writing anything."""
