"""The pretraining text on local disk: parquet shards with one `text` column.

shards    the format, its marker file, the train/val split the loader reads, size checks
download  downloading nanochat's shards of FineWeb-Edu or ClimbMix (shards.SOURCES)
pydocs    the offline text: the Python installation's own documentation
local     corpora built from local text (the offline corpus, a user's .txt/.md/.jsonl files)
hf        any Hugging Face `datasets` source (Hub or local json/parquet/text), streamed into shards
The CLI over all of them is `python -m nanochat.dataset`.
"""
