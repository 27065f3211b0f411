"""Position bias in multimodal LLMs for multi-image retrieval, and LAD debiasing."""
__version__ = "0.1.0"
