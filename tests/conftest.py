"""Shared test set-up: offline Hugging Face hub, a private HF_HOME, quiet progress bars."""

import os
import tempfile

# Before anything imports transformers: never reach a hub, never touch ~/.cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="ladbench-hf-home-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
