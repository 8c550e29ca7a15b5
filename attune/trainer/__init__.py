"""attune's reference trainer: a decoder-only GPT in plain PyTorch, launched with torchrun."""
