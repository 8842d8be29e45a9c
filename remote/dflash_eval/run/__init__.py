"""The harness's commands that compute and write: `eval` (its options, inputs, drafters,
record and results file), `features` and `extract`, each assembled from the packages below."""
