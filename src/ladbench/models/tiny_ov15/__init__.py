"""Local stand-in for LLaVA-OneVision-1.5's hub ("remote") code, used by the tiny offline build.

``modeling_tiny_ov15.py`` is copied into the saved model folder together with an
``auto_map``, so tests load it through ``trust_remote_code=True`` exactly as the hub model
is loaded.
"""
