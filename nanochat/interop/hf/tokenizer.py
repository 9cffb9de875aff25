"""Our BPE as a transformers tokenizer (tokenizer.json + tokenizer_config.json, loaded by
`AutoTokenizer`), giving the ids of `Tokenizer.encode`.

tokenizer.bpe is tiktoken's rank format, which transformers' TikTokenConverter reads: it
recovers the merges from the ranks and splits with our pattern before the byte-level map,
as training did. The choices made here:
- special-token text in the input is plain text (`split_special_tokens`), as
  `Tokenizer.encode` treats it (tiktoken's encode_ordinary); transformers would otherwise
  turn "<|bos|>" in a string into the special id;
- `<|bos|>` is prepended by default (add_special_tokens=False leaves it out): every training
  document started with it, and CORE prompts do;
- `<|bos|>` is also the end-of-text and padding token (nanochat has no other document
  separator), and padding goes on the left, where generate() expects it;
- model_max_length is the training context, which lm-eval takes as its window.
"""

import os

from nanochat.tokenizer import RANKS_FILE, SPECIAL_TOKENS


def export_tokenizer(tokenizer_dir, tokenizer, out_dir, model_max_length):
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converted = TikTokenConverter(vocab_file=os.path.join(tokenizer_dir, RANKS_FILE), pattern=tokenizer.pattern,
                                  extra_special_tokens=SPECIAL_TOKENS).converted()
    bos = SPECIAL_TOKENS[0]
    hf = PreTrainedTokenizerFast(tokenizer_object=converted, bos_token=bos, eos_token=bos, pad_token=bos,
                                 add_bos_token=True, split_special_tokens=True, padding_side="left",
                                 model_max_length=model_max_length, clean_up_tokenization_spaces=False)
    if hf.convert_tokens_to_ids(bos) != tokenizer.get_bos_token_id() or len(hf) != tokenizer.get_vocab_size():
        raise ValueError(f"the converted tokenizer does not match {tokenizer_dir} (ids of the special tokens differ)")
    hf.save_pretrained(out_dir)
