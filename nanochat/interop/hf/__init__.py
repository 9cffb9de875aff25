"""The Hugging Face export of a trained run (`python -m scripts.export`): a model directory
that `transformers` loads with `trust_remote_code=True`, without this project installed.

configuration  the config class (every GPTConfig field, under its own name)
modeling       the causal-LM class around our GPT (generate(), the KV cache, left padding)
assemble       their code and every module of ours they import, as flat files
tokenizer      tokenizer.json / tokenizer_config.json from our BPE ranks
model_card     README.md with the Hub's YAML header
export         the directory: weights (safetensors), configs, code, tokenizer, card
"""
