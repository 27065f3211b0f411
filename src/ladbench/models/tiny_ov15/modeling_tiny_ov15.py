"""Tiny stand-in for the LLaVA-OneVision-1.5 hub code (loaded with ``trust_remote_code``).

Same layout as ``lmms-lab/LLaVA-OneVision-1.5-*-Instruct``: a vision tower under
``model.visual``, a Qwen3 text model (q/k RMS norms, plain 1-D RoPE) under
``model.language_model`` whose layers hold ``self_attn``, Qwen2-VL style image tokens
(``<|vision_start|><|image_pad|>*k<|vision_end|>``) and an ``lm_head``. The vision tower is
transformers' Qwen2.5-VL ViT (the real model has its own RICE-ViT; only the layout matters
for the tests). Like the hub code, the decoder takes only the attention implementations of
its own table (the hub's decoder layers look their class up by name), so a loader that asks for
another (the capture's) fails here as it would there. This file must stay importable on its own:
it is copied into model folders.
"""
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel, Qwen3Config, Qwen3Model
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel


class TinyOV15Config(PretrainedConfig):
    model_type = "llavaonevision1_5"
    sub_configs = {"text_config": Qwen3Config, "vision_config": Qwen2_5_VLVisionConfig}

    def __init__(self, text_config=None, vision_config=None, image_token_id=None, video_token_id=None,
                 vision_start_token_id=None, vision_end_token_id=None, **kwargs):
        if not isinstance(text_config, Qwen3Config):
            text_config = Qwen3Config(**(text_config or {}))
        if not isinstance(vision_config, Qwen2_5_VLVisionConfig):
            vision_config = Qwen2_5_VLVisionConfig(**(vision_config or {}))
        self.text_config, self.vision_config = text_config, vision_config
        self.image_token_id, self.video_token_id = image_token_id, video_token_id
        self.vision_start_token_id, self.vision_end_token_id = vision_start_token_id, vision_end_token_id
        super().__init__(**kwargs)


class TinyOV15PreTrainedModel(PreTrainedModel):
    config_class = TinyOV15Config
    base_model_prefix = "model"
    _supports_sdpa = True
    _supports_flash_attn_2 = True
    _supports_attention_backend = True
    _supports_cache_class = True
    _no_split_modules = ["Qwen3DecoderLayer", "Qwen2_5_VLVisionBlock"]

    def _init_weights(self, module):
        std = self.config.get_text_config().initializer_range
        if isinstance(module, (nn.Linear, nn.Conv3d, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()


#: the attention implementations the hub code's table holds
HUB_ATTENTION_TABLE = ("eager", "sdpa", "flash_attention_2")


class TinyOV15Model(TinyOV15PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        if config.text_config._attn_implementation not in HUB_ATTENTION_TABLE:
            raise KeyError(config.text_config._attn_implementation)
        self.visual = Qwen2_5_VisionTransformerPretrainedModel._from_config(config.vision_config)
        self.language_model = Qwen3Model._from_config(config.text_config)
        self.post_init()

    def get_input_embeddings(self):
        return self.language_model.embed_tokens

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, pixel_values=None,
                image_grid_thw=None, past_key_values=None, inputs_embeds=None, use_cache=None, **kwargs):
        kwargs.pop("mm_token_type_ids", None)
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
            if pixel_values is not None:
                features = self.visual(pixel_values.type(self.visual.dtype), grid_thw=image_grid_thw)
                slots = (input_ids == self.config.image_token_id).unsqueeze(-1).expand_as(inputs_embeds)
                inputs_embeds = inputs_embeds.masked_scatter(slots, features.to(inputs_embeds.dtype))
        return self.language_model(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                   position_ids=position_ids, past_key_values=past_key_values,
                                   use_cache=use_cache, **kwargs)


class TinyOV15ForConditionalGeneration(TinyOV15PreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        self.model = TinyOV15Model(config)
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, pixel_values=None,
                image_grid_thw=None, past_key_values=None, inputs_embeds=None, use_cache=None,
                logits_to_keep=0, **kwargs):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         pixel_values=pixel_values, image_grid_thw=image_grid_thw,
                         past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        hidden = out.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return CausalLMOutputWithPast(logits=self.lm_head(hidden), past_key_values=out.past_key_values,
                                      hidden_states=out.hidden_states, attentions=out.attentions)

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, pixel_values=None,
                                      image_grid_thw=None, cache_position=None, **kwargs):
        inputs = super().prepare_inputs_for_generation(input_ids, past_key_values=past_key_values,
                                                       cache_position=cache_position, **kwargs)
        if cache_position is None or cache_position[0] == 0:      # images only in the prefill
            inputs["pixel_values"], inputs["image_grid_thw"] = pixel_values, image_grid_thw
        return inputs
