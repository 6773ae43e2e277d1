"""tensorfuse kernels inside other libraries' models (``huggingface``: transformers)."""
