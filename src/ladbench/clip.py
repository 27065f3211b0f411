"""Which open_clip model embeds the images and captions for the adversarial mining (config
``clip``), as a settings carrier (:mod:`ladbench.settings`); the embedding itself is
:mod:`ladbench.features`. A module of its own so that reading the settings (the workflow,
at every Snakefile parse) does not load torch."""

from __future__ import annotations

from dataclasses import dataclass

from ladbench.settings import Settings, setting

__all__ = ["DEVICES", "TINY_CLIP_NAME", "ClipSettings"]

DEVICES = ("auto", "cpu", "cuda")
#: the demo's tiny random open_clip model (`ladbench demo-clip`): its name, config and checkpoint file stem
TINY_CLIP_NAME = "ladbench-tiny-clip"


@dataclass(frozen=True)
class ClipSettings(Settings):
    """The features stage's model, weights and execution (config ``clip``)."""

    section = "clip"

    model: str = setting("ViT-L-14-quickgelu", "open_clip model name. The OpenAI weights need the -quickgelu variant.")
    pretrained: str = setting("openai", "open_clip pretrained tag (e.g. openai) or a local checkpoint file.")
    model_config: str | None = setting(None, "JSON config of a custom open_clip architecture; its file stem must "
                                       "equal the model's name.", kind=str, config=False)
    tiny: bool = setting(False, "Build a tiny random open_clip model locally (demo) instead of using model and "
                         "pretrained.", flag=False)
    batch_size: int = setting(64, "Images per batch.", minimum=1)
    workers: int = setting(4, "DataLoader worker processes for image decoding.", minimum=0)
    device: str = setting("auto", "auto = CUDA when present.", choices=DEVICES)
