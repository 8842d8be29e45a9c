"""The target model: its config and shape, loading it (whole, sharded over GPUs, or only its
embedding and head), the kernels its forward ran, and the dtype and fidelity of the features
it computes."""
