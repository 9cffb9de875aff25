"""The transformers configuration of an exported model (exported as
configuration_nanochat_hc.py). It holds every field of GPTConfig under its own name,
found generically (dataclasses.fields), so a field added to the model is exported and read
back without a change here; transformers' standard names map onto ours.

model_type is `nanochat_hc`: `nanochat` is transformers' built-in NanoChat, another
architecture (no hyper-connections, value embeddings or sliding windows).
"""

import dataclasses

from transformers import PreTrainedConfig

from nanochat.gpt import GPTConfig

MODEL_TYPE = "nanochat_hc"


def _default(field):
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


class NanochatHCConfig(PreTrainedConfig):
    model_type = MODEL_TYPE
    # transformers' names for our fields: its KV cache reads num_hidden_layers, lm-eval
    # takes its context length from max_position_embeddings (the training length).
    attribute_map = {"num_hidden_layers": "n_layer", "hidden_size": "n_embd", "num_attention_heads": "n_head",
                     "num_key_value_heads": "n_kv_head", "max_position_embeddings": "sequence_len"}

    def __init__(self, **kwargs):
        for field in dataclasses.fields(GPTConfig):
            setattr(self, field.name, kwargs.pop(field.name, _default(field)))
        kwargs.setdefault("tie_word_embeddings", False)  # the head is untied from the embedding
        super().__init__(**kwargs)

    @classmethod
    def from_gpt_config(cls, config, **kwargs):
        return cls(**dataclasses.asdict(config), **kwargs)

    def gpt_config(self):
        return GPTConfig(**{field.name: getattr(self, field.name) for field in dataclasses.fields(GPTConfig)})
