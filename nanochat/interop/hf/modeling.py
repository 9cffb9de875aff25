"""The transformers causal-LM class of an exported model (exported as
modeling_nanochat_hc.py): our GPT as a submodule (`model`), so that the weights, the
forward pass and the initialization are the project's own, plus what transformers needs
around them:

- after `from_pretrained`, the non-persistent buffers (rotary tables, permutation matrices)
  are computed again: transformers builds the model on the meta device, loads what the
  checkpoint holds and leaves the other buffers as uninitialized memory;
- `generate()`: the KV cache is transformers' own (a `Cache`, which generate() creates and
  reorders for beam search), seen by our attention through `CacheView`; a left-padded batch
  with its attention mask is run with positions counted from the mask and the padding keys
  hidden (GPT.forward's `padding_mask`).
"""

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from nanochat.gpt import GPT
from nanochat.interop.hf.configuration import NanochatHCConfig

# forward() arguments of transformers' models that this one does not implement (a value
# other than None or False is refused rather than ignored).
UNSUPPORTED = ("inputs_embeds", "position_ids", "output_attentions", "output_hidden_states")


class CacheView:
    """GPT's KV-cache interface (`pos`, `insert`) over a transformers Cache."""

    def __init__(self, cache):
        self.cache = cache
        self.pos = cache.get_seq_length()

    def insert(self, layer_idx, k, v):
        return self.cache.update(k, v, layer_idx)

    def swap_embedding(self, last):
        """The 2026-07 trunk's smear (GPT.smear): the embedding of the token before, kept on the
        transformers cache itself, which lives across generate()'s steps as this view does not."""
        before = getattr(self.cache, "nanochat_last_embedding", None)
        self.cache.nanochat_last_embedding = last
        return before


@contextmanager
def loaded_tensors_aside(module):
    """Within the block, every tensor of `module` that transformers loaded from the
    checkpoint (flagged `_is_hf_initialized`) is replaced by a meta-device stand-in, so that
    an initialization writes only the others; the loaded ones come back untouched."""
    aside = []
    for sub in module.modules():
        for store in (sub._parameters, sub._buffers):
            for name, tensor in store.items():
                if tensor is not None and getattr(tensor, "_is_hf_initialized", False):
                    stand_in = torch.empty_like(tensor, device="meta")
                    if isinstance(tensor, torch.nn.Parameter):
                        stand_in = torch.nn.Parameter(stand_in, requires_grad=tensor.requires_grad)
                    aside.append((store, name, tensor))
                    store[name] = stand_in
    try:
        yield
    finally:
        for store, name, tensor in aside:
            store[name] = tensor


class NanochatHCForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = NanochatHCConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    # The connection coefficients are computed in fp32 whatever the compute dtype (their
    # parameters stay fp32 when the model is loaded in bf16), as in training.
    _keep_in_fp32_modules_strict = ["connections"]

    def __init__(self, config):
        super().__init__(config)
        self.model = GPT(config.gpt_config())
        self.post_init()

    @torch.no_grad()
    def initialize_weights(self):
        """The project's init_weights (it also computes the non-persistent buffers) over every
        tensor the checkpoint did not provide; all of them for a model built from a config.
        The connections' buffers (permutation matrices) join their parameters in fp32, which
        the coefficient math requires whatever dtype the model was loaded in."""
        self.model.connections.float()
        with loaded_tensors_aside(self.model):
            self.model.init_weights()

    def get_input_embeddings(self):
        return self.model.transformer.wte

    def get_output_embeddings(self):
        return self.model.lm_head

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None, labels=None, **kwargs):
        """Logits (B, T, vocab) in fp32, softcapped as in training; with `labels`, the mean
        next-token cross-entropy (-100 ignored). attention_mask (B, cached + T), 0 at left
        padding. use_cache=True without past_key_values starts a cache."""
        unsupported = [name for name in UNSUPPORTED if kwargs.get(name) not in (None, False)]
        if unsupported:
            raise ValueError(f"{type(self).__name__} does not support {', '.join(unsupported)} (positions come "
                             "from attention_mask)")
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        padding = attention_mask if attention_mask is not None and not attention_mask.bool().all() else None
        kv_cache = CacheView(past_key_values) if past_key_values is not None else None
        logits = self.model(input_ids, kv_cache=kv_cache, padding_mask=padding)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=past_key_values)
