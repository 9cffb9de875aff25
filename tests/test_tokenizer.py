"""The tokenizer: the ByteLevel inversion, tiktoken reproducing HF's ids on real text,
round trips, special tokens, the save format, token bytes, and the two CLIs."""

import base64
import json
import os

import pytest
import tiktoken
import torch
from tokenizers import pre_tokenizers

from nanochat.data.shards import parquets_iter_batched
from nanochat.tokenizer import (SPECIAL_TOKENS, Tokenizer, _byte_level_decoder, get_token_bytes, get_tokenizer,
                                train_hf_bpe)
from scripts import tok_eval, tok_train

TRICKY = [
    "", " ", "\n", "hello world", "  two  spaces\tand\ttabs\r\nCRLF\n\n\n",
    "Numbers 1 12 123 1234567 3.14159 -42 1e-9 0x1F",
    "don't I'LL we've they're it's O'Neil",
    "Ünïcödé: café naïve Zürich αβγ δ Привет 漢字 かな 한글 عربى", "emoji 🚀👍🏽 👩‍💻 🇫🇷",
    "<|bos|> is text here, as is <|assistant_end|>",
    "def f(x):\n    return x ** 2  # square\n", "\x00\x01\x7f control \u200b zero-width",
]


@pytest.fixture(autouse=True)
def private_base_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path / "base"))


@pytest.fixture(scope="module")
def corpus(offline_corpus_dir):
    train = [d for batch in parquets_iter_batched("train", data_dir=offline_corpus_dir) for d in batch]
    val = [d for batch in parquets_iter_batched("val", data_dir=offline_corpus_dir) for d in batch]
    return train, val


@pytest.fixture(scope="module")
def trained(corpus):
    hf = train_hf_bpe(corpus[0], 600)
    return hf, Tokenizer.from_hf(hf)


def test_byte_level_decoder_inverts_hf_alphabet():
    table = _byte_level_decoder()
    assert set(table) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == ord(" ") and table["Ċ"] == ord("\n") and table["Ā"] == 0 and table["a"] == ord("a")
    # HF's ByteLevel on text, mapped back through the table, gives the text's UTF-8 bytes
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for text in TRICKY[1:]:
        (piece, _), = pre.pre_tokenize_str(text)
        assert bytes(table[ch] for ch in piece) == text.encode("utf-8")


def test_tiktoken_reproduces_hf_ids_on_real_text(corpus, trained):
    hf, tok = trained
    val = corpus[1] + TRICKY
    ours = tok.encode(val)
    theirs = [e.ids for e in hf.encode_batch(val)]
    assert ours == theirs
    assert sum(map(len, ours)) > 100_000  # a real corpus, not a handful of strings
    assert len({t for ids in ours for t in ids}) > 500  # most merges are exercised


def test_vocab_layout_and_special_tokens(trained):
    _, tok = trained
    n = tok.get_vocab_size()
    assert n == 600
    assert [tok.encode_special(s) for s in SPECIAL_TOKENS] == list(range(n - 9, n))
    assert tok.get_bos_token_id() == n - 9 and tok.get_special_tokens() == SPECIAL_TOKENS
    ids = tok.encode("<|bos|>")
    assert tok.get_bos_token_id() not in ids and tok.decode(ids) == "<|bos|>"  # text is never a special
    bos, end = tok.get_bos_token_id(), tok.encode_special("<|assistant_end|>")
    assert tok.encode("hi", prepend="<|bos|>", append=end) == [bos] + tok.encode("hi") + [end]
    assert tok.encode(["a", "b"], prepend=bos) == [[bos] + tok.encode("a"), [bos] + tok.encode("b")]
    assert tok("a b", prepend=bos) == tok.encode("a b", prepend=bos)
    assert tok.decode([bos, *tok.encode("x"), end]) == "<|bos|>x<|assistant_end|>"
    assert tok.decode(torch.tensor(tok.encode("tensor ids"))) == "tensor ids"
    with pytest.raises(ValueError, match="unknown special token"):
        tok.encode("x", prepend="<|eos|>")
    with pytest.raises(TypeError):
        tok.encode(123)


def test_round_trip(corpus, trained):
    _, tok = trained
    texts = TRICKY + corpus[1][:200]
    assert [tok.decode(ids) for ids in tok.encode(texts, num_threads=2)] == texts
    assert all(tok.encode(t) == ids for t, ids in zip(texts, tok.encode(texts)))  # batch == one by one


def test_save_load_plain_text_format(trained, tmp_path):
    _, tok = trained
    tok.save(str(tmp_path), info={"note": "test"})
    assert sorted(os.listdir(tmp_path)) == ["token_bytes.pt", "tokenizer.bpe", "tokenizer.json"]
    lines = (tmp_path / "tokenizer.bpe").read_text().splitlines()
    assert len(lines) == tok.get_vocab_size() - 9
    token, rank = lines[300].split()
    assert tok.id_to_bytes(int(rank)) == base64.b64decode(token)
    config = json.loads((tmp_path / "tokenizer.json").read_text())
    assert config["special_tokens"]["<|bos|>"] == tok.get_bos_token_id() and config["info"] == {"note": "test"}
    loaded = get_tokenizer(str(tmp_path))
    assert loaded.encode(TRICKY) == tok.encode(TRICKY) and loaded.get_vocab_size() == tok.get_vocab_size()


def test_token_bytes_are_raw_lengths(trained, tmp_path, corpus):
    _, tok = trained
    tok.save(str(tmp_path))
    tb = get_token_bytes(tokenizer_dir=str(tmp_path))
    assert tb.dtype == torch.int32 and tb.shape == (tok.get_vocab_size(),)
    assert tb[-9:].tolist() == [0] * 9
    assert all(tb[i] == len(tok.id_to_bytes(i)) > 0 for i in range(tok.get_vocab_size() - 9))
    # bits per byte needs: summed token bytes of a text == its UTF-8 length, whatever the text
    for text in TRICKY + corpus[1][:50]:
        assert int(tb[tok.encode(text)].sum()) == len(text.encode("utf-8"))
    # Tokens that are only part of a UTF-8 character (the 128 bytes >= 0x80, and merges
    # like them) decode to U+FFFD, 3 bytes: counting through decode() would be wrong.
    partial = [i for i in range(tok.get_vocab_size() - 9) if tok.id_to_token(i) == "\ufffd"]
    assert len(partial) >= 128
    assert all(len(tok.decode([i]).encode()) == 3 and tb[i] == len(tok.id_to_bytes(i)) < 3 for i in partial)


def test_missing_tokenizer_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"python -m scripts.tok_train --tokenizer-dir"):
        get_tokenizer(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="token_bytes.pt missing"):
        get_token_bytes(tokenizer_dir=str(tmp_path))


def test_vocab_too_small_is_refused():
    with pytest.raises(ValueError, match="vocab_size must exceed 265"):
        Tokenizer.train_from_iterator(["some text"], 265)


def test_tok_train_and_tok_eval_cli(small_corpus_dir, tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "tok")
    tok = tok_train.main(["--vocab-size", "400", "--max-chars", "50000", "--doc-cap", "2000",
                          "--data-dir", small_corpus_dir, "--tokenizer-dir", out])
    printed = capsys.readouterr().out
    assert "Round trip OK" in printed and f"<|bos|> = {400 - 9}" in printed
    info = json.load(open(os.path.join(out, "tokenizer.json")))["info"]
    assert 50_000 <= info["chars"] < 50_000 + 2000 and info["source"] == "offline"
    assert get_tokenizer(out).encode(TRICKY) == tok.encode(TRICKY)
    assert get_token_bytes(tokenizer_dir=out).tolist() == tok.token_byte_lengths()

    results = tok_eval.main(["--tokenizer-dir", out, "--data-dir", small_corpus_dir, "--docs", "20"])
    printed = capsys.readouterr().out
    assert set(results) == set(tok_eval.SAMPLES) | {"train shards", "val shards"}
    assert all(r["ours"] > 1.0 for r in results.values())  # BPE compresses: more than a byte per token
    train_docs = [d for batch in parquets_iter_batched("train", data_dir=small_corpus_dir) for d in batch][:20]
    expected = sum(len(d.encode()) for d in train_docs) / sum(map(len, tok.encode(train_docs)))
    assert results["train shards"]["ours"] == pytest.approx(expected)

    # references available (here: stand-ins for GPT-2/GPT-4): they get their own columns
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: tok.enc)
    results = tok_eval.main(["--tokenizer-dir", out, "--data-dir", small_corpus_dir, "--docs", "5"])
    assert "vs gpt4" in capsys.readouterr().out
    assert all(r["gpt2"] == r["ours"] == r["gpt4"] for r in results.values())

    (tmp_path / "nothing").mkdir()
    with pytest.raises(SystemExit, match="no shards in"):
        tok_train.main(["--data-dir", str(tmp_path / "nothing"), "--tokenizer-dir", out])
    with pytest.raises(SystemExit, match="no trained tokenizer"):
        tok_eval.main(["--tokenizer-dir", str(tmp_path / "nothing"), "--data-dir", small_corpus_dir])
