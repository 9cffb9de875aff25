"""The BPE tokenizer: trained with HF `tokenizers`, run with `tiktoken`.

Owns: training a byte-level BPE (GPT-4 style split pattern, nanochat's 9 special tokens
on the last ids), converting the learned merges into tiktoken's mergeable ranks, saving
them without pickle (tokenizer.bpe: one `base64(token bytes) rank` line per token, plus
tokenizer.json with the pattern and the special tokens), fast batch encoding, and the
token-byte table (token_bytes.pt) that bits-per-byte divides by.

Bytes-per-token convention: the raw byte length of every token (0 for specials), taken
from the token's bytes, not from decode(): a token that is not valid UTF-8 on its own
(part of a multi-byte character) counts its true bytes, not 3 bytes of U+FFFD.
"""

import base64
import hashlib
import json
import os

import tiktoken
import torch

from nanochat.common import base_dir

SPECIAL_TOKENS = [
    "<|bos|>",  # every document starts with it; the first special, so the first id after the merges
    "<|user_start|>", "<|user_end|>",
    "<|assistant_start|>", "<|assistant_end|>",
    "<|python_start|>", "<|python_end|>",
    "<|output_start|>", "<|output_end|>",
]
# GPT-4's (cl100k) split pattern with numbers cut into 1-2 digit pieces instead of 1-3
# (nanochat commit 64b48d0 found {1,2} best at a 32K vocab).
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
                 r"""|\s*[\r\n]|\s+(?!\S)|\s+""")
RANKS_FILE = "tokenizer.bpe"
CONFIG_FILE = "tokenizer.json"
TOKEN_BYTES_FILE = "token_bytes.pt"
FORMAT = "nanochat-hc-bpe/1"


def _byte_level_decoder():
    """Map each character of HF's ByteLevel alphabet back to the byte it stands for.

    ByteLevel (GPT-2's scheme) shows every byte as a printable character: bytes that are
    printable Latin-1 ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, and the other 68
    bytes, in increasing order, take the code points 256, 257, ... (0 -> 'Ā', space -> 'Ġ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in table.values())
    for offset, b in enumerate(shifted):
        table[chr(256 + offset)] = b
    return table


def train_hf_bpe(texts, vocab_size):
    """An HF byte-level BPE trained on `texts` with vocab_size - 9 tokens (room for the specials)."""
    from tokenizers import Regex, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    if vocab_size <= 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed {256 + len(SPECIAL_TOKENS)} (256 bytes + "
                         f"{len(SPECIAL_TOKENS)} specials), got {vocab_size}")
    hf = HFTokenizer(BPE())
    # Split with our pattern first, then map bytes to ByteLevel characters without a
    # second regex, so that HF merges within exactly the pieces tiktoken will see.
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = BpeTrainer(vocab_size=vocab_size - len(SPECIAL_TOKENS), min_frequency=0, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    hf.train_from_iterator(texts, trainer)
    return hf


# One tokenizer per corpus under the base directory, so that runs on FineWeb-Edu and on ClimbMix
# (the two trunks' defaults, docs/trunks.md) live side by side, each evaluated with its own.
TOKENIZER_DIRS = {"fineweb-edu": "tokenizer", "climbmix": "tokenizer_climbmix"}
DEFAULT_CORPUS = "fineweb-edu"


def default_tokenizer_dir(corpus=DEFAULT_CORPUS):
    return os.path.join(base_dir(), TOKENIZER_DIRS[corpus])


def run_tokenizer_dir(run_dir):
    """The tokenizer of a run directory: its corpus's (corpus.json `corpus`; a run that names
    none read FineWeb-Edu, or a local corpus with FineWeb-Edu's tokenizer directory)."""
    try:
        with open(os.path.join(run_dir, "corpus.json")) as f:
            corpus = json.load(f).get("corpus", DEFAULT_CORPUS)
    except (OSError, ValueError):
        corpus = DEFAULT_CORPUS
    return default_tokenizer_dir(corpus if corpus in TOKENIZER_DIRS else DEFAULT_CORPUS)


def _missing(directory, what):
    corpus = next((c for c in TOKENIZER_DIRS if os.path.abspath(directory) == default_tokenizer_dir(c)), None)
    flag = (f" --tokenizer-dir {directory}" if corpus is None else
            "" if corpus == DEFAULT_CORPUS else f" --corpus {corpus}")
    return FileNotFoundError(f"no trained tokenizer in {directory} ({what} missing): "
                             f"train one with `python -m scripts.tok_train{flag}`")


class Tokenizer:
    """A tiktoken Encoding over learned merges, with the special tokens on the last ids."""

    def __init__(self, mergeable_ranks, pattern=SPLIT_PATTERN):
        n = len(mergeable_ranks)
        if sorted(mergeable_ranks.values()) != list(range(n)):
            raise ValueError("mergeable ranks must be exactly 0..n-1")
        self.mergeable_ranks = mergeable_ranks
        self.pattern = pattern
        self.special_tokens = {name: n + i for i, name in enumerate(SPECIAL_TOKENS)}
        self.enc = tiktoken.Encoding(name="nanochat-hc", pat_str=pattern, mergeable_ranks=mergeable_ranks,
                                     special_tokens=self.special_tokens)
        self._bos = self.special_tokens["<|bos|>"]

    # ----------------------------------------------------------------- train / save / load

    @classmethod
    def train_from_iterator(cls, texts, vocab_size):
        """Train on an iterable of strings; vocab_size counts the 9 special tokens."""
        return cls.from_hf(train_hf_bpe(texts, vocab_size))

    @classmethod
    def from_hf(cls, hf):
        """Convert a trained HF byte-level BPE: a token's tiktoken rank is its HF id.

        tiktoken merges, in a piece, the adjacent pair whose concatenated bytes have the
        lowest rank; HF applies its merges in the order learned. The two agree when the
        i-th merge creates id 256 + i and no two merges create the same bytes, which is
        checked here rather than assumed."""
        decode = _byte_level_decoder()
        vocab = hf.get_vocab()
        ranks = {bytes(decode[ch] for ch in token): i for token, i in vocab.items()}
        if len(ranks) != len(vocab):
            raise ValueError("two HF tokens map to the same bytes")
        merges = json.loads(hf.to_str())["model"]["merges"]
        for i, merge in enumerate(merges):
            left, right = merge.split(" ") if isinstance(merge, str) else merge
            if vocab[left + right] != 256 + i:
                raise ValueError(f"HF merge {i} ({left!r} + {right!r}) made id {vocab[left + right]}, not "
                                 f"{256 + i}: tiktoken would apply the merges in another order")
        return cls(ranks)

    def save(self, directory, info=None):
        """Write tokenizer.bpe, tokenizer.json (with `info`, e.g. what it was trained on)
        and token_bytes.pt into `directory`."""
        os.makedirs(directory, exist_ok=True)
        lines = [f"{base64.b64encode(token).decode()} {rank}\n"
                 for token, rank in sorted(self.mergeable_ranks.items(), key=lambda kv: kv[1])]
        config = {"format": FORMAT, "pattern": self.pattern, "special_tokens": self.special_tokens,
                  "vocab_size": self.get_vocab_size(), "info": info or {}}
        lengths = torch.tensor(self.token_byte_lengths(), dtype=torch.int32)
        with open(os.path.join(directory, RANKS_FILE + ".tmp"), "w") as f:
            f.writelines(lines)
        with open(os.path.join(directory, CONFIG_FILE + ".tmp"), "w") as f:
            json.dump(config, f, indent=2)
        torch.save(lengths, os.path.join(directory, TOKEN_BYTES_FILE + ".tmp"))
        for name in (RANKS_FILE, CONFIG_FILE, TOKEN_BYTES_FILE):  # readers never see a half-written file
            os.replace(os.path.join(directory, name + ".tmp"), os.path.join(directory, name))

    @classmethod
    def from_directory(cls, directory):
        for name in (RANKS_FILE, CONFIG_FILE):
            if not os.path.exists(os.path.join(directory, name)):
                raise _missing(directory, name)
        with open(os.path.join(directory, CONFIG_FILE)) as f:
            config = json.load(f)
        if config.get("format") != FORMAT:
            raise ValueError(f"{directory}/{CONFIG_FILE} is not a {FORMAT} tokenizer: retrain with "
                             "`python -m scripts.tok_train`")
        ranks = {}
        with open(os.path.join(directory, RANKS_FILE)) as f:
            for line in f:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        tok = cls(ranks, pattern=config["pattern"])
        if tok.special_tokens != config["special_tokens"]:
            raise ValueError(f"{directory}: special tokens differ from this code's; retrain the tokenizer")
        return tok

    # ------------------------------------------------------------------------ run time

    def get_vocab_size(self):
        return self.enc.n_vocab

    def get_bos_token_id(self):
        return self._bos

    def get_special_tokens(self):
        return list(self.special_tokens)

    def encode_special(self, name):
        if name not in self.special_tokens:
            raise ValueError(f"unknown special token {name!r}; known: {SPECIAL_TOKENS}")
        return self.special_tokens[name]

    def _as_id(self, token):
        return self.encode_special(token) if isinstance(token, str) else int(token)

    def encode(self, text, prepend=None, append=None, num_threads=8):
        """Ids of a string, or a list of id lists for a list of strings (encoded in
        `num_threads` threads). Special-token text in the input is plain text; `prepend`
        and `append` take an id or a special token's name."""
        head = [] if prepend is None else [self._as_id(prepend)]
        tail = [] if append is None else [self._as_id(append)]
        if isinstance(text, str):
            return head + self.enc.encode_ordinary(text) + tail
        if isinstance(text, (list, tuple)):
            return [head + ids + tail for ids in self.enc.encode_ordinary_batch(list(text), num_threads=num_threads)]
        raise TypeError(f"encode takes a str or a list of str, got {type(text).__name__}")

    __call__ = encode  # CORE evaluation calls the tokenizer directly, as in nanochat

    def decode(self, ids):
        return self.enc.decode(ids.tolist() if hasattr(ids, "tolist") else list(ids))

    def id_to_bytes(self, token_id):
        return self.enc.decode_single_token_bytes(token_id)

    def id_to_token(self, token_id):
        return self.id_to_bytes(token_id).decode("utf-8", errors="replace")

    def token_byte_lengths(self):
        """Raw byte length of every id; 0 for the special tokens."""
        lengths = [0] * self.get_vocab_size()
        for token, rank in self.mergeable_ranks.items():
            lengths[rank] = len(token)
        return lengths


def get_tokenizer(tokenizer_dir=None):
    return Tokenizer.from_directory(tokenizer_dir or default_tokenizer_dir())


def check_vocab(tokenizer, vocab_size):
    """Raise ValueError unless the tokenizer is the size of the model's vocabulary (the one
    check a checkpoint allows: runs do not record which tokenizer trained them)."""
    if tokenizer.get_vocab_size() != vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens but the model was trained with "
                         f"{vocab_size}; point NANOCHAT_BASE_DIR at the run's tokenizer")


def fingerprint(tokenizer_dir=None):
    """'<vocab> tokens, <12 hex digits of the merges' sha256>': which tokenizer a run used, so
    that runs whose bits per byte are not comparable can be told apart."""
    directory = tokenizer_dir or default_tokenizer_dir()
    with open(os.path.join(directory, RANKS_FILE), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    return f"{get_tokenizer(directory).get_vocab_size()} tokens, {digest}"


def get_token_bytes(device="cpu", tokenizer_dir=None):
    """int32 (vocab,) raw byte length of every token, 0 for specials (see module docstring)."""
    directory = tokenizer_dir or default_tokenizer_dir()
    path = os.path.join(directory, TOKEN_BYTES_FILE)
    if not os.path.exists(path):
        raise _missing(directory, TOKEN_BYTES_FILE)
    return torch.load(path, map_location=device, weights_only=True)
